// Draws every figure of the page from its JSON block, shows a clicked event's log line, and
// fits the charts to the paper when printing. Log text is only ever set with textContent.
(function () {
  'use strict';
  var PRINT_WIDTH = 700;

  function showLine(panel, ev) {
    var point = ev && ev.points && ev.points[0];
    var data = point && point.customdata;
    if (!Array.isArray(data) || data.length !== 4) { return; }
    var fields = panel.querySelectorAll('[data-field]');
    for (var i = 0; i < fields.length; i++) {
      var value = data[Number(fields[i].getAttribute('data-field'))];
      fields[i].textContent = value === null || value === undefined ? '' : String(value);
    }
    panel.classList.add('filled');
  }

  function draw(block) {
    var id = block.getAttribute('data-plot');
    var el = document.getElementById(id);
    if (!el) { return; }
    if (!window.Plotly) { el.textContent = 'plotly.js did not load; the chart is unavailable.'; return; }
    var fig;
    try {
      fig = JSON.parse(block.textContent);
    } catch (err) {
      el.textContent = 'chart data could not be read: ' + err;
      return;
    }
    // No "Share chart" button: it would upload the chart (log lines included) to Plotly Cloud.
    var config = {responsive: true, displaylogo: false, showSendToCloud: false, showLink: false,
                  modeBarButtonsToRemove: ['select2d', 'lasso2d', 'sendChartToCloud']};
    Plotly.newPlot(el, fig.data, fig.layout, config).then(function () {
      el.setAttribute('data-drawn', 'true');
    }, function (err) {
      el.textContent = 'chart could not be drawn: ' + err;
    });
    var panel = document.getElementById(id + '-line');
    if (panel) { el.on('plotly_click', function (ev) { showLine(panel, ev); }); }
  }

  function eachPlot(action) {
    var plots = document.querySelectorAll('.js-plotly-plot');
    for (var i = 0; i < plots.length; i++) { action(plots[i]); }
  }

  var blocks = document.querySelectorAll('script[type="application/json"][data-plot]');
  for (var i = 0; i < blocks.length; i++) { draw(blocks[i]); }

  if (window.Plotly) {
    window.addEventListener('beforeprint', function () {
      eachPlot(function (el) { Plotly.relayout(el, {width: PRINT_WIDTH}); });
    });
    window.addEventListener('afterprint', function () {
      eachPlot(function (el) { Plotly.relayout(el, {width: null, autosize: true}); });
    });
  }
})();
