"""What to change, grounded in what was seen: one or two sentences per cause, quoting the
settings the run actually used when its ``config.yaml`` is at hand.
"""

from __future__ import annotations

from typing import Any

from forensics.model import Cause

#: How each framework keeps the rollouts a reward was computed from, to read them.
_ROLLOUT_DUMPS = {
    "areal": "AReaL can dump them with rollout.dump_to_file / the workflow's dump_dir",
    "verl": "verl writes them to JSONL with trainer.rollout_data_dir",
}


def suggest(cause: Cause, config: dict[str, Any], seen: dict[str, int], framework: str = "areal", kind: str = "") -> tuple[str, ...]:
    """Suggestions for ``cause`` of an incident of ``kind`` in a run of ``framework``; ``seen`` counts event kinds around the onset."""

    def setting(key: str) -> str:
        return f"{key}={config[key]}" if key in config else key

    timeout = config.get("rollout.request_timeout")
    retries = config.get("rollout.request_retries")
    if cause == "inference_server_unresponsive":
        held = ""
        if isinstance(timeout, int | float) and isinstance(retries, int):
            held = f" each stuck rollout waited up to {timeout * retries / 60:.0f} min ({setting('rollout.request_timeout')} × {setting('rollout.request_retries')}) before failing;"
        return (
            f"The server accepted requests but stopped answering:{held} a shorter request timeout surfaces a hang "
            "within a step instead of an hour, and a health check on the server can stop training "
            "before it learns from empty rollouts.",
            "Look at the server's last scheduler activity before the onset (decode lines, watchdog) to see what it was stuck on.",
        )
    if cause == "inference_server_oom":
        pressure = ", ".join(f"{n} {k}" for k, n in sorted(seen.items()) if k in {"kv_cache_retract", "kv_cache_oom", "cuda_oom"})
        knobs = (f"{setting('sglang.mem_fraction_static')} or {setting('rollout.max_concurrent_rollouts')}" if framework == "areal"
                 else "the server's memory fraction (SGLang --mem-fraction-static; verl actor_rollout_ref.rollout.gpu_memory_utilization) or the concurrent requests")
        return (
            f"The server ran out of memory before it died ({pressure or 'memory errors'}): lower {knobs}, or shorten "
            "max_new_tokens, so the KV cache is not exhausted at peak load.",
        )
    killed = seen.get("process_killed") and not seen.get("host_oom_kill")
    oom_killer = ("A process was killed (SIGKILL) with no word of why: most often the kernel's OOM killer — look for "
                  "'Out of memory: Killed process' in `dmesg -T` or `journalctl -k` on the node, at that time.")
    if cause == "inference_server_crash":
        relaunch = f"; {setting('recover.mode')} only relaunches on failures the launcher notices" if framework == "areal" else ""
        went = f"The server process went away (refused or reset connections, exit): read its log just before its exit for the reason{relaunch}."
        return (went, oom_killer) if killed else (went,)
    if cause == "reward_pipeline":
        return (
            "No infrastructure fault was logged around the onset: check the reward function and answer parsing on the "
            f"rollouts of the onset step ({_ROLLOUT_DUMPS.get(framework, 'dump a batch of them with their rewards')}).",
        )
    if cause == "loss_computation":
        return ("Print the sequence log-probs and the loss mask of one batch at the onset step: all zeros (no masked "
                "positions, a log-prob computed on the wrong tokens) make the policy loss 0 whatever the advantages.",)
    if cause == "numerical_divergence":
        return ("Loss or gradients went non-finite: lower the learning rate, check gradient clipping and the loss scale.",)
    if cause == "nccl_timeout":
        return ("A collective hung: find the rank that did not join (its last log lines) before raising the NCCL timeout.",)
    if cause == "training_worker_crash" and killed:
        return (oom_killer,)
    if cause == "training_worker_crash":
        return ("A training worker died: its exit detail (signal, OOM kill, traceback) is in the evidence lines.",)
    if kind == "reward_drop":
        return ("Nothing failed around the fall: compare the policy's entropy, KL and gradient norm before and after the "
                "onset (a policy that degraded), and what the run read then — its data shard and order, the reward "
                f"function's version ({_ROLLOUT_DUMPS.get(framework, 'dump a batch of rollouts with their rewards')}).",)
    return ()
