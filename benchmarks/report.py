"""The one report path of every task: the output directory checked before any work starts, the run, the report
files (:func:`write_report`: JSON, Markdown and, where the task plots, PNG), the printed tables and the verdict of
the targets; and what the tasks' reports share: ratios over a baseline run and the Markdown's common lines."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .flops import flop_ratio
from .preset import fmt_params
from .runner import load_average, machine_info
from .targets import verdict


def unwritable_dir(path: Path) -> str | None:
    """Why ``path`` cannot be (created as) a writable directory, or None. Creates nothing.

    >>> import tempfile, pathlib
    >>> with tempfile.NamedTemporaryFile() as f:
    ...     print(unwritable_dir(pathlib.Path(f.name)) == "it is a file, not a directory",
    ...           unwritable_dir(pathlib.Path(f.name) / "sub") == f"{f.name} is a file, not a directory")
    True True
    """
    if path.exists():
        if not path.is_dir():
            return "it is a file, not a directory"
        return None if os.access(path, os.W_OK | os.X_OK) else "it is not writable"
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is a file, not a directory"
    return None if os.access(parent, os.W_OK | os.X_OK) else f"{parent} is not writable, so it cannot be created"


def refuse_unusable(parser: Any, device: str, output_dir: Path) -> None:
    """``parser.error`` (exit 2, one line) when ``output_dir`` cannot be written or ``device`` is CUDA without one."""
    reason = unwritable_dir(output_dir)
    if reason:
        parser.error(f"--output-dir {output_dir}: {reason}; pass a directory that can be written")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            parser.error(f"--device {device} but torch.cuda.is_available() is False; use --device cpu")


def write_report(report: dict[str, Any], output_dir: Path, name: str, markdown: Callable[[dict[str, Any]], str],
                 plot: Callable[[dict[str, Any], Path], None] | None = None) -> dict[str, Path]:
    """Write ``<name>.json``, ``<name>.md`` (``markdown(report)``) and, with a ``plot``, ``<name>.png`` under
    ``output_dir``; return their paths."""
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = {ext: output_dir / f"{name}.{ext}" for ext in ("json", "md", "png")[: 3 if plot else 2]}
    paths["json"].write_text(json.dumps(report, indent=1, default=str) + "\n")
    paths["md"].write_text(markdown(report))
    if plot:
        plot(report, paths["png"])
    return paths


def printed_markdown(report: dict[str, Any]) -> str:
    """The Markdown of a task that reports what it printed (``report["title"]``, ``report["printed"]`` lines).

    >>> print(printed_markdown({"title": "t", "printed": ["a  1", "b  2"]}), end="")
    # t
    <BLANKLINE>
    ```
    a  1
    b  2
    ```
    """
    return f"# {report['title']}\n\n```\n" + "\n".join(report["printed"]) + "\n```\n"


def print_and_report(report: dict[str, Any], args: Any, lines: list[str]) -> dict[str, Path]:
    """Print ``lines`` and write them with ``report`` (:func:`printed_markdown`) as ``--output-dir``/``--name``
    (default ``<task>-cpu``) say: the report of a task without its own tables (grpo, rloo, reward, kto)."""
    print("\n".join(lines))
    report.update(title=f"trl-padfree bench --task {args.task}", printed=lines)
    paths = write_report(report, args.output_dir, args.name or f"{args.task}-cpu", printed_markdown)
    print("Wrote " + ", ".join(str(p) for p in paths.values()))
    return paths


def run_and_report(parser: Any, args: Any, config: Any, run: Callable[[Any], dict[str, Any]],
                   markdown: Callable[[dict[str, Any]], str], plot: Callable[[dict[str, Any], Path], None], stem: str,
                   unit: str = "") -> int:
    """A preset task's run from its parsed ``args`` and ``config``: a bad option or an unusable ``--output-dir`` or
    device exits 2 in one line before any work; then the run line, ``run(config)``, the report files (``markdown``,
    ``plot``), the tables, and the verdict of the targets (0, or 1 when a judged target failed)."""
    try:
        config.validate()
    except ValueError as exc:
        parser.error(str(exc))
    refuse_unusable(parser, config.device, args.output_dir)
    print(f"{parser.prog}: Llama {config.layers}x{config.hidden} ({fmt_params(config.parameter_count())} "
          f"parameters), {config.dtype} on {config.device}, batch {config.batch_size}{unit}, {config.warmup} warm-up + "
          f"{config.steps} timed steps, variants {', '.join(config.variants)}")
    report = run(config)
    paths = write_report(report, args.output_dir, args.name or stem, markdown, plot)
    print("\n" + markdown(report))
    print("Wrote " + ", ".join(str(p) for p in paths.values()))
    return verdict(report)


def new_report(benchmark: str, config: Any, **config_extra: Any) -> dict[str, Any]:
    """A preset task's report before its measurements: what it compares, when, the run's config, the machine."""
    return {
        "benchmark": benchmark,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {**dataclasses.asdict(config), **config_extra, "parameters": config.parameter_count()},
        "machine": machine_info(config.device, threads=config.threads),
    }


def finish_report(report: dict[str, Any], evaluate_targets: Callable[[dict[str, Any]], list]) -> dict[str, Any]:
    """The load average at the end and the task's targets, judged from the measurements."""
    report["machine"]["load_average_end"] = load_average()
    report["targets"] = evaluate_targets(report)
    return report


# ---- what the reports share --------------------------------------------------------------------------------------
def max_rel_diff(values: Sequence[float], reference: Sequence[float]) -> float:
    """Largest relative difference of two equally long series (inf when their lengths differ).

    >>> max_rel_diff([1.0, 2.2], [1.0, 2.0]), max_rel_diff([1.0], [1.0, 2.0])
    (0.10000000000000009, inf)
    """
    if len(values) != len(reference):
        return math.inf
    return max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(values, reference, strict=True)), default=0.0)


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


def ratios(config: dict[str, Any] | None, res: dict[str, Any], base: dict[str, Any],
           stepwise: bool = True) -> dict[str, Any]:
    """A run's measured ratios over a ``base`` run; with the run's ``config`` the workload's FLOP ratio
    (:func:`~.flops.flop_ratio`) and the measured real-tokens/s ratio's share of it. ``stepwise``: the two trained
    the same mini-batches, so their steps are compared one by one (median step speed-up, train-loss difference)."""
    warm = base["warmup_steps"]
    throughput = res["tokens_per_second"] / base["tokens_per_second"]
    flops = None if config is None else flop_ratio(config, res, base)
    return {
        "throughput_ratio": throughput,
        "flop_ratio": flops,
        "share_of_flop_ratio": None if flops is None else throughput / flops,
        # Per timed step, baseline seconds / variant seconds (same examples in both): robust to load spikes.
        "median_step_speedup": statistics.median(
            b / v for b, v in zip(base["step_seconds"][warm:], res["step_seconds"][warm:], strict=True)
        ) if stepwise else None,
        "cpu_throughput_ratio": None if res["tokens_per_cpu_second"] is None
        else res["tokens_per_cpu_second"] / base["tokens_per_cpu_second"],
        "memory_ratio": res["peak_memory_mb"] / base["peak_memory_mb"],
        "train_loss_max_rel_diff": max_rel_diff(res["train_loss"], base["train_loss"]) if stepwise else None,
        "same_steps": res["optimizer_steps"] == base["optimizer_steps"],
    }


def machine_line(m: dict[str, Any]) -> str:
    """The report's machine: device, CPUs and threads, library versions, the load average at start and end."""
    return (
        f"- Machine: {m['gpu'] or m['cpu']} ({m['cpu_count']} CPUs, {m['torch_threads']} torch threads); "
        f"torch {m['torch']}, transformers {m['transformers']}"
        + (f", trl {m['trl']}" if m.get("trl") else "") + f", trl-padfree {m['trl_padfree']}"
        + (f" (git {m['git']})" if m.get("git") else "")
        + (f", flash-attn {m['flash_attn']}" if m.get("flash_attn") else "") + f"; {m['platform']}"
        + (f"; load average (1/5/15 min) {m['load_average_start']} at start, {m.get('load_average_end')} at end"
           if m.get("load_average_start") else "")
    )


def model_line(c: dict[str, Any]) -> str:
    return (f"- Model: random-init Llama, {c['layers']} layers x {c['hidden']} hidden, {c['heads']} heads / "
            f"{c['kv_heads']} kv heads, MLP {c['intermediate']}, vocab {c['vocab_size']} "
            f"({fmt_params(c['parameters'])} parameters), {c['dtype']} on {c['device']}")


def target_lines(report: dict[str, Any]) -> list[str]:
    """The ``## Targets`` section: each target's verdict (PASS, FAIL, or n/a where it does not apply)."""
    return ["## Targets", "", *(f"- {check(t['holds'])}: {t['target']}: {t['shown']}" for t in report["targets"])]


def check(holds: bool | None) -> str:
    return {True: "PASS", False: "FAIL", None: "n/a"}[holds]


def fmt(value: float | None, spec: str = ".2f", suffix: str = "x") -> str:
    """A table cell: ``value`` in ``spec`` and ``suffix`` (by default a ratio), empty for None.

    >>> fmt(1.234), fmt(None), fmt(0.5, ".0%", ""), fmt(12345.6, ",.0f", "")
    ('1.23x', '', '50%', '12,346')
    """
    return "" if value is None else f"{value:{spec}}{suffix}"
