"""The pass/fail targets of every task, as data: what each task's report judges (:mod:`.report`,
:mod:`.dpo_report`; the RL, reward and KTO tasks print the share of the FLOP ratio against theirs), and the one
setup each speed target was set for. A run in another setup reports its ratios with "n/a" as the verdict."""

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
