"""What a variant's result record measured, read alike by the report and the figure (reports of older versions too)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["step_medians"]


def step_medians(res: dict[str, Any]) -> tuple[float | None, float | None]:
    """Median wall seconds per timed step and the part outside compute (reports written before these were
    recorded: from ``step_seconds``, and the loop's ``collate_seconds`` as the part outside compute).

    >>> step_medians({"warmup_steps": 1, "step_seconds": [9.0, 1.0, 3.0, 2.0], "collate_seconds": [1, .1, .3, .2]})
    (2.0, 0.2)
    """
    if "median_step_seconds" in res:
        return res["median_step_seconds"], res.get("median_overhead_seconds")
    timed = slice(res.get("warmup_steps", 0), None)
    steps = res.get("step_seconds", [])[timed]
    rest = res.get("collate_seconds", [])[timed]
    return (statistics.median(steps) if steps else None), (statistics.median(rest) if rest else None)


def max_rel_diff(values: Sequence[float], reference: Sequence[float]) -> float:
    """Largest relative difference of two equally long series (inf when their lengths differ).

    >>> max_rel_diff([1.0, 2.2], [1.0, 2.0]), max_rel_diff([1.0], [1.0, 2.0])
    (0.10000000000000009, inf)
    """
    if len(values) != len(reference):
        return math.inf
    return max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(values, reference, strict=True)), default=0.0)
