"""The command line every task of ``trl-padfree bench`` shares: the task choice, the one-line error, the options
of the model preset, the steps and the device (:func:`add_common`), and the :class:`~.preset.Preset` they make."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, NoReturn

TASKS: dict[str, str] = {
    "sft": "benchmarks.cli",
    "dpo": "benchmarks.dpo",
    "grpo": "benchmarks.rl",
    "rloo": "benchmarks.rl",
    "reward": "benchmarks.reward",
    "kto": "benchmarks.reward",
}
"""Each task of ``trl-padfree bench --task`` and the module whose ``main(argv)`` runs it."""


def task_of(argv: list[str], default: str = "sft") -> str:
    """The ``--task`` a ``trl-padfree bench`` command line asks for (``default`` without one).

    >>> task_of(["--task", "dpo", "--steps", "2"]), task_of(["--task=kto"]), task_of(["--steps", "2"])
    ('dpo', 'kto', 'sft')
    """
    for i, arg in enumerate(argv):
        if arg.startswith("--task="):
            return arg.split("=", 1)[1]
        if arg == "--task" and i + 1 < len(argv):
            return argv[i + 1]
    return default


def csv(value: str) -> list[str]:
    """
    >>> csv("a, b,,c")
    ['a', 'b', 'c']
    """
    return [v.strip() for v in value.split(",") if v.strip()]


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The task's docstring as written, and every option's default."""


class Parser(argparse.ArgumentParser):
    """Bad input: one line on stderr (what is wrong and the fix), exit 2; no usage block."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def task_parser(task: str, description: str | None, prog: str | None = None) -> Parser:
    """A parser for ``task`` that accepts ``--task`` (every task's choice, so one command line names any)."""
    p = Parser(prog=prog or f"trl-padfree bench --task {task}", description=description,
               formatter_class=HelpFormatter)
    p.add_argument("--task", choices=list(TASKS), default=task,
                   help="the benchmark: sft (default), dpo, grpo, rloo, reward or kto; each has its own options "
                   "(trl-padfree bench --task TASK --help)")
    return p


def add_common(p: argparse.ArgumentParser, defaults: Any, presets: dict[str, dict[str, int]], **helps: str) -> None:
    """The options of a :class:`~.preset.Preset` (defaults from ``defaults``, an instance of the task's config);
    ``helps``: the task's words for ``batch``, ``seed``, ``length_scale``, ``max_length``, ``loss_rtol``,
    ``in_process`` and ``name``."""
    p.add_argument("--variants", type=csv, default=",".join(defaults.variants),
                   help=f"comma list of {', '.join(defaults.VARIANTS)}{helps.get('variants', '')}")
    p.add_argument("--model-size", choices=list(presets), default="tiny",
                   help="model preset; --layers/--hidden/... override single values")
    for flag in ("layers", "hidden", "intermediate", "heads", "kv-heads", "vocab-size"):
        p.add_argument(f"--{flag}", type=int, default=None, help="override the preset's value")
    p.add_argument("--batch-size", type=int, default=defaults.batch_size, help=helps["batch"])
    p.add_argument("--steps", type=int, default=defaults.steps, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=defaults.warmup, help="optimizer steps trained before timing starts")
    p.add_argument("--lr", type=float, default=defaults.lr, help="AdamW learning rate (constant)")
    p.add_argument("--seed", type=int, default=defaults.seed, help=helps["seed"])
    p.add_argument("--dtype", choices=DTYPES, default=defaults.dtype, help="model/optimizer dtype")
    p.add_argument("--device", default=defaults.device, help="cpu, cuda or cuda:N")
    p.add_argument("--threads", type=int, default=defaults.threads, help="torch threads per worker (0: torch's default)")
    p.add_argument("--length-scale", type=float, default=defaults.length_scale, help=helps["length_scale"])
    p.add_argument("--max-length", type=int, default=defaults.max_length, help=helps["max_length"])
    p.add_argument("--loss-rtol", type=float, default=None, help=helps["loss_rtol"])
    p.add_argument("--in-process", action="store_true", help=helps["in_process"])
    add_output(p, helps["name"])


def add_output(p: argparse.ArgumentParser, name_help: str) -> None:
    """``--output-dir`` and ``--name``: where every task writes its report (:func:`~.paths.write_report_files`)."""
    p.add_argument("--output-dir", type=Path, default=Path("bench-results"), help="where the reports are written")
    p.add_argument("--name", default=None, help=name_help)


def common_values(args: argparse.Namespace, presets: dict[str, dict[str, int]]) -> dict[str, Any]:
    """The :class:`~.preset.Preset` fields from parsed :func:`add_common` options (preset first, then overrides)."""
    model = dict(presets[args.model_size])
    for key in model:
        if getattr(args, key) is not None:
            model[key] = getattr(args, key)
    return dict(variants=args.variants, model_size=args.model_size, **model, batch_size=args.batch_size,
                steps=args.steps, warmup=args.warmup, lr=args.lr, seed=args.seed, dtype=args.dtype,
                device=args.device, threads=args.threads, length_scale=args.length_scale, max_length=args.max_length,
                subprocess=not args.in_process, loss_rtol=args.loss_rtol)


DTYPES = ("float32", "bfloat16", "float16")
