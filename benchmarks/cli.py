"""``trl-padfree bench``: the command line of every task (:data:`~.workloads.TASKS`). Bad options exit 2 with one
line on stderr, before any work; the report prints figures and ratios, no verdict (exit 0 when every variant ran)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from .workloads import MODEL_SIZES, TASKS

#: The numeric options: flag, type, default, least value (a float: any finite value above it), help.
NUMBERS = (
    ("--batch-size", int, 8, 1, "records per step (GRPO/RLOO: micro-batch rows)"),
    ("--steps", int, 6, 1, "timed optimizer steps"),
    ("--warmup", int, 1, 0, "untimed optimizer steps first"),
    ("--rounds", int, 1, 1, "runs of every variant, in turns; the medians are reported"),
    ("--scale", float, 1.0, 0, "multiplies every length (e.g. 0.1 for a quick look)"),
    ("--max-length", int, 2048, 1, "each record part is clipped to this"),
    ("--groups", int, 4, 1, "grpo/rloo: prompts per step"),
    ("--gens", int, 8, 1, "grpo/rloo: completions per prompt (num_generations)"),
    ("--completion", int, 32, 1, "grpo/rloo: tokens per completion"),
    ("--prompt-mean", int, 150, 1, "grpo/rloo: mean prompt length (normal, sd mean/5)"),
    ("--threads", int, 1, 0, "torch threads per worker (0: torch's default)"),
)


def csv(value: str) -> list[str]:
    """The names of a comma list: ``"a, b,,c"`` is ``["a", "b", "c"]``."""
    return [v.strip() for v in value.split(",") if v.strip()]


def build_parser() -> argparse.ArgumentParser:
    """The options of every task; :func:`check` completes and validates them. A bad one: one line on stderr (what
    is wrong and the fix; no usage block), exit 2."""
    p = argparse.ArgumentParser(
        prog="trl-padfree bench", usage=argparse.SUPPRESS, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Padded vs padding-free training: the same records in the same batches, each variant in its own "
        "process through its real trainer; prints and writes the figures and their ratios over the first variant "
        "beside the FLOP ratio (docs/benchmark.md).")
    p.add_argument("--task", choices=list(TASKS), default="sft", help=f"the workload: {', '.join(TASKS)}")
    p.add_argument("--variants", type=csv, default=None,
                   help="comma list (default: the task's; the first is the baseline of the ratios); per task: "
                   + "; ".join(f"{t}: {', '.join(v.name for v in s.variants)}" for t, s in TASKS.items()))
    p.add_argument("--datasets", type=csv, default=None, help="sft/hybrid: comma list of flan, orcamath")
    p.add_argument("--model-size", choices=list(MODEL_SIZES), default=None,
                   help="random-init model shape (default tiny; smollm2-135m with --whole-step)")
    for flag, kind, default, _, text in NUMBERS:
        p.add_argument(flag, type=kind, default=default, help=text)
    p.add_argument("--whole-step", action="store_true",
                   help="grpo: TRL's whole-step defaults (no reference model, SGD) on SmolLM2-135M's shape")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--output-dir", type=Path, default=Path("bench-results"), help="where the report is written")
    p.add_argument("--name", default=None, help="report file stem (default: <task>-<device>)")
    return p


def check(p: argparse.ArgumentParser, opts: argparse.Namespace) -> None:
    """Complete ``opts`` with the task's defaults, or exit 2 naming the bad option."""
    task = TASKS[opts.task]
    if opts.datasets and task.datasets == ("",):
        p.error(f"--datasets is for --task sft or hybrid, not {opts.task}")
    opts.variants = opts.variants or [v.name for v in task.variants if not v.opt_in]
    opts.datasets = opts.datasets or list(task.datasets)
    for kind, given, known in (("variant", opts.variants, [v.name for v in task.variants]),
                               ("dataset", opts.datasets, task.datasets)):
        bad = [name for name in given if name not in known]
        if bad:
            p.error(f"unknown {kind} {bad[0]!r} for --task {opts.task}; choose from {', '.join(known)}")
    if opts.whole_step and opts.task != "grpo":
        p.error("--whole-step is for --task grpo")
    for flag, kind, _, least, _ in NUMBERS:
        value = getattr(opts, flag[2:].replace("-", "_"))
        if kind is int and value < least:
            p.error(f"{flag} must be >= {least}, got {value}")
        if kind is float and not (value > least and math.isfinite(value)):
            p.error(f"{flag} must be a finite number > {least}, got {value}")
    if opts.device != "cpu":
        import torch

        if not (opts.device.startswith("cuda") and torch.cuda.is_available()):
            p.error(f"--device {opts.device}: no such device here; use cpu, or cuda on a machine with a GPU")
    if opts.output_dir.exists() and not opts.output_dir.is_dir():
        p.error(f"--output-dir {opts.output_dir} is a file; pass a directory")
    flash = [v.name for v in task.variants if v.name in opts.variants and "flash" in (v.attn or "")]
    if flash and opts.device == "cpu":
        p.error(f"{flash[0]} needs --device cuda and flash-attn (pip install --no-build-isolation "
                "'trl-padfree[flash]')")
    opts.model_size = opts.model_size or ("smollm2-135m" if opts.whole_step else "tiny")
    opts.shape = dict(MODEL_SIZES[opts.model_size])
    opts.name = opts.name or f"{opts.task}{'-step' if opts.whole_step else ''}-{opts.device.split(':')[0]}"


def main(argv: list[str] | None = None) -> int:
    """``trl-padfree bench``: run the task, write and print its report."""
    p = build_parser()
    opts = p.parse_args(argv)
    check(p, opts)
    from .harness import run

    run(opts)
    return 0
