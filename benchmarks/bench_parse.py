"""Parse throughput on a large AReaL trainer.log and SGLang llm_server.log, next to a
one-regex grep triage pass.

Writes a realistic run with the test fixture builder (tables rendered by tabulate, ANSI
codes, memory lines, an incident with HTTP timeouts), repeats it with later steps and dates
until the log reaches ``--size-gb``, then times, on the same file in the same run:

- ``grep -cE 'Traceback|Error|timed out|refused|Killed'`` (output to a file: GNU grep stops at
  the first match when it writes to /dev/null),
- ``parsers.read_areal_log`` in a fresh process (peak RSS from the OS),
- the whole ``grpo-forensics analyze`` command in a fresh process,
- a line-by-line Python regex loop over a slice of the file (what one would write by hand),
- and, on an info-level ``llm_server.log`` of ``--server-gb``, grep next to ``read_sglang_log``.

Usage: python benchmarks/bench_parse.py [--size-gb 1.0] [--dir /tmp/grpo-forensics-bench] [--keep] [--reuse]
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))

GREP = r"Traceback|Error|timed out|refused|Killed"
BASE_STEPS = 2000


def build(target_dir: Path, size_gb: float) -> Path:
    """A fileroot whose trainer.log is at least ``size_gb`` GB, with an incident in its first copy."""
    from areal_builder import Outage, RunSpec, healthy_reward, write_run

    start = datetime(2025, 11, 1, 9, 0, 0)
    spec = RunSpec(
        experiment="bench",
        trial="trial0",
        last_step=BASE_STEPS,
        start=start,
        reward=lambda s: 0.0 if 1400 <= s < 1500 else healthy_reward(s),
        outages=(Outage(start + timedelta(hours=25.8), start + timedelta(hours=27.5), kind="timeout", burst_every=(300, 600)),),
        request_timeout=600,
        save_freq_steps=500,
    )
    paths = write_run(target_dir / "outputs", spec)
    base = paths.trainer_log.read_bytes()
    goal = int(size_gb * (1 << 30))
    copies = -(-goal // len(base))
    header = re.compile(rb"Train step (\d+)/(\d+) done\.")
    date = re.compile(rb"(?<=[^\d])(2025\d{4})-")
    with open(paths.trainer_log, "ab") as out:
        for k in range(1, copies):
            shift = timedelta(days=2 * k)
            total = BASE_STEPS * copies

            def restep(m: re.Match[bytes], k: int = k, total: int = total) -> bytes:
                return b"Train step %d/%d done." % (int(m.group(1)) + k * BASE_STEPS, total)

            def redate(m: re.Match[bytes], shift: timedelta = shift) -> bytes:
                day = datetime.strptime(m.group(1).decode(), "%Y%m%d") + shift
                return day.strftime("%Y%m%d-").encode()

            out.write(date.sub(redate, header.sub(restep, base)))
    return paths.trainer_log


def build_server_log(target: Path, size_gb: float) -> Path:
    """An info-level ``llm_server.log`` of ``size_gb`` GB: the OOM fixture's server log (SGLang
    stats, access and weight-update lines, retractions, a crash) repeated on later days."""
    source = ROOT / "tests" / "fixtures" / "sglang_oom" / "outputs" / "logs" / "root" / "gsm8k-grpo-oom" / "trial0" / "llm_server.log.gz"
    base = gzip.decompress(source.read_bytes())
    date = re.compile(rb"(?<=\[)(2025-\d\d-\d\d)(?= \d\d:)|(?<=[^\d])(2025\d{4})(?=-\d\d:)")
    target.parent.mkdir(parents=True, exist_ok=True)
    copies = -(-int(size_gb * (1 << 30)) // len(base))
    with open(target, "wb") as out:
        for k in range(copies):
            shift = timedelta(days=k)

            def redate(m: re.Match[bytes], shift: timedelta = shift) -> bytes:
                text = m.group(0).decode()
                fmt = "%Y-%m-%d" if "-" in text else "%Y%m%d"
                return (datetime.strptime(text, fmt) + shift).strftime(fmt).encode()

            out.write(date.sub(redate, base) if k else base)
    return target


def timed(command: list[str], stdout_path: Path | None = None) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one child process."""
    t0 = time.perf_counter()
    with open(stdout_path or "/dev/null", "wb") as sink:
        child = subprocess.Popen(command, stdout=sink, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        raise SystemExit(f"{command[:3]} failed with status {status}")
    return seconds, usage.ru_maxrss / 1024


def python_loop(path: Path, limit: int) -> float:
    """Seconds per MB for a hand-written line loop: a regex for headers, split for table rows."""
    header = re.compile(r"Train step (\d+)/")
    rows: dict[tuple[int, str], float] = {}
    step = 0
    t0 = time.perf_counter()
    with open(path, encoding="utf-8", errors="replace") as fh:
        read = 0
        for line in fh:
            read += len(line)
            if read > limit:
                break
            if m := header.search(line):
                step = int(m.group(1))
            elif line.startswith("│"):
                cells = [c.strip() for c in line.rstrip().split("│")[1:-1]]
                for key, value in zip(cells[0::2], cells[1::2]):
                    if key:
                        rows[(step, key)] = float(value)
    return (time.perf_counter() - t0) / (min(read, limit) / 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=1.0, help="size of the trainer.log to write")
    parser.add_argument("--server-gb", type=float, default=1.0, help="size of the llm_server.log to write")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/grpo-forensics-bench"))
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    parser.add_argument("--reuse", action="store_true", help="reuse files kept by an earlier --keep run")
    args = parser.parse_args()

    existing = args.dir / "outputs" / "logs" / "root" / "bench" / "trial0" / "trainer.log"
    if args.reuse and existing.is_file():
        log = existing
    else:
        shutil.rmtree(args.dir, ignore_errors=True)
        t0 = time.perf_counter()
        log = build(args.dir, args.size_gb)
        print(f"wrote {log} in {time.perf_counter() - t0:.0f} s")
    mb = log.stat().st_size / 1e6
    print(f"{log}: {mb:,.0f} MB")
    subprocess.run(["cat", str(log)], stdout=subprocess.DEVNULL, check=True)  # same page cache for all

    grep_s, _ = timed(["grep", "-cE", GREP, str(log)], args.dir / "grep.out")
    parse_code = f"from pathlib import Path; from parsers import read_areal_log; read_areal_log(Path({str(log)!r}))"
    parse_s, parse_rss = timed([sys.executable, "-c", parse_code])
    analyze = [sys.executable, "-m", "forensics", "analyze", str(args.dir / "outputs"), "--out", str(args.dir / "report")]
    analyze_s, analyze_rss = timed(analyze)
    loop_s_per_mb = python_loop(log, limit=200 * 10**6)

    server = args.dir / "server" / "llm_server.log"
    if not (args.reuse and server.is_file()):
        build_server_log(server, args.server_gb)
    server_mb = server.stat().st_size / 1e6
    subprocess.run(["cat", str(server)], stdout=subprocess.DEVNULL, check=True)
    server_grep_s, _ = timed(["grep", "-cE", GREP + "|sigquit", str(server)], args.dir / "grep-server.out")
    server_code = f"from pathlib import Path; from parsers import read_sglang_log; read_sglang_log(Path({str(server)!r}))"
    server_s, server_rss = timed([sys.executable, "-c", server_code])

    rows = [
        ("grep -cE triage", grep_s, None),
        ("read_areal_log (parse)", parse_s, parse_rss),
        ("grpo-forensics analyze", analyze_s, analyze_rss),
        ("python line loop (200 MB slice)", loop_s_per_mb * mb, None),
    ]
    print(f"\n{'':34} {'seconds':>8} {'MB/s':>8} {'vs grep':>8} {'peak RSS':>9}")
    for name, seconds, rss in rows:
        rss_text = f"{rss:,.0f} MB" if rss else ""
        print(f"{name:34} {seconds:8.2f} {mb / seconds:8.0f} {grep_s / seconds:8.2f} {rss_text:>9}")
    print(f"\nparse at {grep_s / parse_s:.2f}x grep's throughput (target ≥ 0.33); "
          f"{loop_s_per_mb * mb / parse_s:.0f}x the Python line loop")

    print(f"\n{server}: {server_mb:,.0f} MB")
    for name, seconds, rss in (("grep -cE triage", server_grep_s, None), ("read_sglang_log (parse)", server_s, server_rss)):
        rss_text = f"{rss:,.0f} MB" if rss else ""
        print(f"{name:34} {seconds:8.2f} {server_mb / seconds:8.0f} {server_grep_s / seconds:8.2f} {rss_text:>9}")
    if not args.keep:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
