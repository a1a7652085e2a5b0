"""``trl-padfree bench``: the command line of every task (:data:`~.workloads.TASKS`). Bad options exit 2 with one
line on stderr, before any work; the report prints figures and ratios, no verdict (exit 0 when every variant ran).
``python -m benchmarks --worker SPEC OUT`` is a worker process (:func:`~.harness.worker`)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import NoReturn

from .workloads import MODEL_SIZES, TASKS


def csv(value: str) -> list[str]:
    """
    >>> csv("a, b,,c")
    ['a', 'b', 'c']
    """
    return [v.strip() for v in value.split(",") if v.strip()]


class Parser(argparse.ArgumentParser):
    """Bad input: one line on stderr (what is wrong and the fix), exit 2; no usage block."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> Parser:
    p = Parser(prog="trl-padfree bench", description="Padded vs padding-free training: the same records in the same "
               "batches, each variant in its own process through its real trainer; prints and writes the figures "
               "and their ratios over the first variant beside the FLOP ratio (docs/benchmark.md).",
               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    names = ", ".join(TASKS)
    p.add_argument("--task", choices=list(TASKS), default="sft", help=f"the workload: {names}")
    p.add_argument("--variants", type=csv, default=None,
                   help="comma list (default: the task's; the first is the baseline of the ratios); per task: "
                   + "; ".join(f"{t}: {', '.join(v.name for v in s.variants)}" for t, s in TASKS.items()))
    p.add_argument("--datasets", type=csv, default=None, help="sft/hybrid: comma list of flan, orcamath")
    p.add_argument("--model-size", choices=list(MODEL_SIZES), default=None,
                   help="random-init model shape (default tiny; smollm2-135m with --whole-step)")
    p.add_argument("--batch-size", "--batch", type=int, default=8, help="records per step (GRPO/RLOO: micro-batch rows)")
    p.add_argument("--steps", type=int, default=6, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=1, help="untimed optimizer steps first")
    p.add_argument("--rounds", type=int, default=1, help="runs of every variant, in turns; the medians are reported")
    p.add_argument("--scale", "--length-scale", type=float, default=1.0,
                   help="multiplies every length (e.g. 0.1 for a quick look)")
    p.add_argument("--max-length", type=int, default=2048, help="each record part is clipped to this")
    p.add_argument("--groups", type=int, default=4, help="grpo/rloo: prompts per step")
    p.add_argument("--gens", type=int, default=8, help="grpo/rloo: completions per prompt (num_generations)")
    p.add_argument("--completion", type=int, default=32, help="grpo/rloo: tokens per completion")
    p.add_argument("--prompt-mean", type=int, default=150, help="grpo/rloo: mean prompt length (normal, sd mean/5)")
    p.add_argument("--whole-step", action="store_true",
                   help="grpo: TRL's whole-step defaults (no reference model, SGD) on SmolLM2-135M's shape")
    p.add_argument("--lr", type=float, default=1e-4, help="learning rate (constant)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data and the initial weights")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker (0: torch's default)")
    p.add_argument("--output-dir", type=Path, default=Path("bench-results"), help="where the report is written")
    p.add_argument("--name", default=None, help="report file stem (default: <task>-<device>)")
    return p


def check(p: Parser, opts: argparse.Namespace) -> None:
    """Complete ``opts`` with the task's defaults, or exit 2 naming the bad option."""
    task = TASKS[opts.task]
    names = [v.name for v in task.variants]
    opts.variants = opts.variants or list(task.default)
    bad = [v for v in opts.variants if v not in names]
    if bad:
        p.error(f"unknown variant {bad[0]!r} for --task {opts.task}; choose from {', '.join(names)}")
    opts.datasets = opts.datasets or list(task.datasets)
    if task.datasets == ("",) and opts.datasets != [""]:
        p.error(f"--datasets is for --task sft or hybrid, not {opts.task}")
    bad = [d for d in opts.datasets if d not in task.datasets]
    if bad:
        p.error(f"unknown dataset {bad[0]!r}; choose from {', '.join(task.datasets)}")
    if opts.whole_step and opts.task != "grpo":
        p.error("--whole-step is for --task grpo")
    for name in ("batch_size", "steps", "rounds", "groups", "gens", "completion", "prompt_mean", "max_length"):
        if getattr(opts, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(opts, name)}")
    for name in ("warmup", "threads"):
        if getattr(opts, name) < 0:
            p.error(f"--{name} must be >= 0, got {getattr(opts, name)}")
    for name in ("lr", "scale"):
        if not (getattr(opts, name) > 0 and math.isfinite(getattr(opts, name))):
            p.error(f"--{name} must be a finite number > 0, got {getattr(opts, name)}")
    if opts.device != "cpu":
        import torch

        if not (opts.device.startswith("cuda") and torch.cuda.is_available()):
            p.error(f"--device {opts.device}: no such device here; use cpu, or cuda on a machine with a GPU")
    if opts.output_dir.exists() and not opts.output_dir.is_dir():
        p.error(f"--output-dir {opts.output_dir} is a file; pass a directory")
    skipped = [v.name for v in task.variants if v.cuda_only and v.name in opts.variants and opts.device == "cpu"]
    if skipped:
        install = "pip install --no-build-isolation 'trl-padfree[flash]'"
        p.error(f"{skipped[0]} needs --device cuda and flash-attn ({install})")
    if opts.task == "hybrid":
        from transformers import CONFIG_MAPPING

        if "qwen3_5_text" not in CONFIG_MAPPING:
            p.error("--task hybrid needs transformers with qwen3_5_text (>= 5.2); upgrade transformers")
    opts.model_size = opts.model_size or ("smollm2-135m" if opts.whole_step else "tiny")
    opts.shape = dict(MODEL_SIZES[opts.model_size])
    opts.name = opts.name or f"{opts.task}{'-step' if opts.whole_step else ''}-{opts.device.split(':')[0]}"


def main(argv: list[str] | None = None) -> int:
    """``trl-padfree bench``: run the task, write and print its report."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--worker"]:
        from .harness import worker

        return worker(argv[1], argv[2])
    p = build_parser()
    opts = p.parse_args(argv)
    check(p, opts)
    from .harness import run

    run(opts)
    return 0
