"""The pass/fail targets of every task, as data: what each task's report judges (:mod:`.sft_report`,
:mod:`.dpo_report`; the RL, reward and KTO tasks print the share of the FLOP ratio against theirs), and the one
setup each speed target was set for; the throughput and memory targets every report judges alike. A run in another
setup reports its ratios with "n/a" as the verdict."""

from __future__ import annotations

from typing import Any

_TINY = dict(layers=4, hidden=256, heads=8, kv_heads=4, intermediate=688, vocab_size=2048)

TARGETS: dict[str, dict[str, Any]] = {
    "sft": {
        # real tokens/s over the baseline >= this share of the workload's FLOP ratio
        "flop_share": 0.9,
        # (dataset, variant, baseline) of the throughput targets
        "speed": (("flan", "packed-padfree", "padded-sdpa"), ("flan", "packed-padfree", "packed-sdpa"),
                  ("orcamath", "packed-padfree", "padded-sdpa")),
        # variants whose losses must equal padded (this project's layouts); trl-native is compared, not judged
        "loss_equal": ("packed-sdpa", "packed-padfree", "packed-fa2", "sft-padfree"),
        "memory_below": (("packed-padfree", "padded-sdpa"),),
        "speed_setup": {"device": "cpu", "dtype": "float32", "batch_size": 8, **_TINY, "length_scale": 1.0},
        "min_steps": 5,
        "speed_setup_text": "CPU, float32, tiny Llama (4 x 256, 8 / 4 heads, MLP 688, vocab 2048), batch 8, the "
                            "datasets' real lengths (--length-scale 1), >= 5 timed steps",
    },
    "dpo": {
        "flop_share": 0.85,
        "judged": ("dpo-padfree", "dpo-prompt-once"),
        "baseline": "dpo-trl-padded",
        "speed_setup": {"device": "cpu", "dtype": "float32", "threads": 1, "batch_size": 8, "subprocess": True,
                        **_TINY},
        "min_steps": 6,
        "speed_setup_text": "CPU, float32, 1 torch thread, tiny Llama (4 x 256, 8 / 4 heads, MLP 688, vocab 2048), "
                            "batch 8 pairs, >= 6 timed steps, each variant in its own worker",
    },
    # the issues' targets for the standalone tasks: measured speed-up >= this share of the layout's FLOP ratio
    "hybrid": {
        "flop_share": 0.85,
        "speed_setup": {"device": "cpu", "dtype": "float32", "threads": 1, "batch_size": 8, **_TINY,
                        "length_scale": 1.0},
        "min_steps": 5,
        "speed_setup_text": "CPU, float32, 1 torch thread, Qwen3.5-like hybrid (4 x 256, 8 / 4 heads, MLP 688, "
                            "vocab 2048), batch 8, the datasets' real lengths, >= 5 timed steps",
    },
    "grpo": {"flop_share": 0.85},
    "rloo": {"flop_share": 0.85},
    "reward": {"flop_share": 0.85},
    "kto": {"flop_share": 0.85},
}

MEMORY_SETUP_TEXT = ("CUDA, or CPU with each variant in its own worker process (not --in-process) at the datasets' "
                     "real lengths (--length-scale 1)")


def in_speed_setup(task: str, config: dict[str, Any]) -> bool:
    """Whether a run's ``config`` is the setup ``task``'s speed targets were set for.

    >>> tiny = {"device": "cpu", "dtype": "float32", "batch_size": 8, "layers": 4, "hidden": 256, "heads": 8,
    ...         "kv_heads": 4, "intermediate": 688, "vocab_size": 2048, "length_scale": 1.0, "steps": 10}
    >>> in_speed_setup("sft", tiny), in_speed_setup("sft", {**tiny, "steps": 1})
    (True, False)
    >>> in_speed_setup("sft", {**tiny, "length_scale": 0.1}), in_speed_setup("sft", {"device": "cuda"})
    (False, False)
    >>> dpo = {**tiny, "threads": 1, "subprocess": True, "steps": 6}
    >>> in_speed_setup("dpo", dpo), in_speed_setup("dpo", {**dpo, "threads": 2})
    (True, False)
    """
    t = TARGETS[task]
    return all(config.get(k) == v for k, v in t["speed_setup"].items()) and config.get("steps", 0) >= t["min_steps"]


def in_memory_setup(config: dict[str, Any]) -> bool:
    """Whether peak memory is each variant's own (:data:`MEMORY_SETUP_TEXT`): CUDA counts the tensors themselves;
    on CPU only a fresh worker's peak RSS is the variant's own, and only at real lengths is the activation memory
    more than the noise of a process's few hundred MB.

    >>> in_memory_setup({"device": "cuda:0", "subprocess": False, "length_scale": 0.1})
    True
    >>> in_memory_setup({"device": "cpu", "subprocess": True, "length_scale": 1.0})
    True
    >>> in_memory_setup({"device": "cpu", "subprocess": False, "length_scale": 1.0})
    False
    """
    if str(config.get("device", "cpu")).startswith("cuda"):
        return True
    return bool(config.get("subprocess", True)) and config.get("length_scale") == 1.0


def fmt_share(value: float, threshold: float) -> str:
    """A share in whole percent, or with two decimals where whole percent would round it onto the threshold (no
    "90%: FAIL").

    >>> fmt_share(0.8996, 0.9), fmt_share(0.9031, 0.9), fmt_share(1.0421, 0.9)
    ('89.96%', '90.31%', '104%')
    """
    return f"{value:.2%}" if round(value, 2) == threshold else f"{value:.0%}"


def share_target(target: str, task: str, measured: float | None, flops: float | None,
                 in_setup: bool) -> dict[str, Any]:
    """A throughput target: the ``measured`` real-tokens/s ratio >= ``task``'s share of the workload's FLOP ratio
    ``flops``; judged (``holds`` not None) only in the setup it was set for, and with FLOP counts."""
    need = TARGETS[task]["flop_share"]
    share = None if measured is None or flops is None else measured / flops
    if measured is None:
        shown = "not measured"
    elif flops is None:
        shown = f"{measured:.2f}x; no FLOP counts in this report (written before they were recorded)"
    else:
        shown = (f"{measured:.2f}x measured vs FLOP ratio {flops:.2f}x: {fmt_share(share, need)} of it (needs >= "
                 f"{need * flops:.2f}x)")
        if not in_setup:
            shown += f" (judged on the {TARGETS[task]['speed_setup_text']}; not this run's setup)"
    return {"target": target, "value": share, "throughput_ratio": measured, "flop_ratio": flops, "shown": shown,
            "holds": None if share is None or not in_setup else share >= need}


def memory_target(target: str, peak_mb: float | None, baseline_mb: float | None, in_setup: bool) -> dict[str, Any]:
    """A memory target: ``peak_mb`` below ``baseline_mb``, judged only where memory is each variant's own."""
    measured = peak_mb is not None and baseline_mb is not None
    shown = f"{peak_mb:.0f} vs {baseline_mb:.0f} MB" if measured else "not measured"
    if measured and not in_setup:
        shown += f" (judged only on {MEMORY_SETUP_TEXT})"
    return {"target": target, "value": peak_mb / baseline_mb if measured else None, "shown": shown,
            "holds": peak_mb < baseline_mb if measured and in_setup else None}


def flop_share_verdict(task: str, share: float) -> str:
    """One line: the share of the FLOP ratio a measured ratio reached, against ``task``'s target.

    >>> flop_share_verdict("grpo", 1.1), flop_share_verdict("kto", 0.5)
    ('target >= 85% of the FLOP ratio: holds', 'target >= 85% of the FLOP ratio: FAILS')
    """
    need = TARGETS[task]["flop_share"]
    return f"target >= {need:.0%} of the FLOP ratio: {'holds' if share >= need else 'FAILS'}"


def failed_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The judged targets of a report that failed (``holds`` False)."""
    return [t for t in report["targets"] if t["holds"] is False]


def verdict(report: dict[str, Any]) -> int:
    """0 when no judged target failed, else 1 (after saying which, on stderr)."""
    import sys

    failed = failed_targets(report)
    for target in failed:
        print(f"trl-padfree bench: target failed: {target['target']}: {target['shown']}", file=sys.stderr)
    return 1 if failed else 0
