"""``trl-padfree bench`` command line: the SFT task's arguments, the :class:`BenchConfig` they make, and
:func:`main`, which hands every other ``--task`` to its module (:data:`.args.TASKS`)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from .args import TASKS, add_common, common_values, csv, task_of, task_parser
from .config import SCHEDULES, BenchConfig
from .data import DATASETS
from .paths import run_and_report
from .plot import plot
from .preset import MODEL_PRESETS
from .report import evaluate_targets, to_markdown
from .runner import run_benchmark
from .targets import verdict
from .worker import _worker_main


def build_parser() -> argparse.ArgumentParser:
    import benchmarks as bench  # the package docstring is the help text

    p = task_parser("sft", bench.__doc__, prog="trl-padfree bench")
    d = BenchConfig()
    p.add_argument("--datasets", type=csv, default=",".join(d.datasets), help=f"comma list of {', '.join(DATASETS)}")
    add_common(p, d, MODEL_PRESETS, variants=" (packed-fa2 is skipped without CUDA + flash-attn)",
               batch="examples per optimizer step",
               seed="seed of the data and of the initial weights",
               length_scale="multiply the datasets' lengths (e.g. 0.1 for a quick smoke run)",
               max_length="examples are clipped to this length",
               loss_rtol="tolerance of the loss-equality target (default 1e-5 in float32, 1e-2 otherwise)",
               in_process="run variants in this process (faster start; CPU peak memory is then less exact)",
               name="output file stem (default: the device type, e.g. cpu)")
    p.add_argument("--eval-batches", type=int, default=d.eval_batches, help="eval mini-batches (after training)")
    p.add_argument("--min-length", type=int, default=d.min_length, help="examples are at least this long")
    p.add_argument("--prompt-fraction", type=float, default=d.prompt_fraction,
                   help="share of an example before the response template (not trained)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="token budget per mini-batch of the token-budget variant (default: the mean real tokens of "
                   "the fixed mini-batches)")
    p.add_argument("--repeats", type=int, default=d.repeats,
                   help="interleaved runs per variant; tokens/s is the median")
    p.add_argument("--schedule", choices=SCHEDULES, default=d.schedule,
                   help="interleaved: every variant in its own worker, trained in lockstep (step i of each, then "
                   "step i+1), so load drift on a shared machine hits all alike; all workers are alive at once, "
                   "each holding its model. sequential: one worker after the other")
    p.add_argument("--replot", type=Path, metavar="REPORT_JSON",
                   help="only rewrite the Markdown and PNG next to an existing report JSON (no training)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--worker-output", help=argparse.SUPPRESS)
    p.add_argument("--interactive", action="store_true", help=argparse.SUPPRESS)
    return p


def _read_report(path: Path) -> dict[str, Any]:
    """The report JSON at ``path``; ``ValueError`` with the reason when it is not one."""
    if not path.is_file():
        raise ValueError("no such file")
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    missing = [key for key in ("config", "machine", "datasets") if not isinstance(report, dict) or key not in report]
    if missing:
        raise ValueError(f"not a trl-padfree bench report (no {', '.join(repr(k) for k in missing)})")
    return report


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """A :class:`BenchConfig` from parsed arguments (model preset first, then explicit overrides)."""
    return BenchConfig(
        **common_values(args, MODEL_PRESETS), datasets=args.datasets, eval_batches=args.eval_batches,
        min_length=args.min_length, prompt_fraction=args.prompt_fraction, repeats=args.repeats,
        schedule=args.schedule, max_tokens=args.max_tokens,
    )


def main(argv: list[str] | None = None) -> int:
    """``trl-padfree bench``: run the benchmark, write JSON/Markdown/PNG, print the table and the targets."""
    argv = sys.argv[1:] if argv is None else argv
    task = task_of(argv)
    if task in TASKS and TASKS[task] != __name__:  # another task: its own module and options
        return int(importlib.import_module(TASKS[task]).main(argv) or 0)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.worker:
        return _worker_main(args.worker, args.worker_output, args.interactive)
    if args.replot:
        try:
            report = _read_report(args.replot)
        except ValueError as exc:
            parser.error(f"--replot {args.replot}: {exc}; pass a JSON report written by trl-padfree bench")
        report["targets"] = evaluate_targets(report)  # derived from the measurements: re-checked with this code
        args.replot.write_text(json.dumps(report, indent=1) + "\n")
        args.replot.with_suffix(".md").write_text(to_markdown(report))
        plot(report, args.replot.with_suffix(".png"))
        print(f"Wrote {args.replot.with_suffix('.md')}, {args.replot.with_suffix('.png')}")
        return verdict(report)
    return run_and_report(parser, args, config_from_args(args), run_benchmark, to_markdown, plot,
                          stem=args.device.split(":")[0])
