"""``trl-padfree bench``: one command line for every task. ``--task`` picks the task module (:data:`TASKS`), whose
docstring is the help text and whose ``add_options(parser, task)`` adds its own options (sft and dpo: those of
:class:`~.preset.Preset`); :func:`main` parses and hands the arguments to the module's ``main(parser, args)``.
``python -m benchmarks --worker SPEC OUT`` is a worker process (:mod:`.runner`)."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import NoReturn

TASKS: dict[str, str] = {
    "sft": "benchmarks.sft",
    "dpo": "benchmarks.dpo",
    "grpo": "benchmarks.rl",
    "rloo": "benchmarks.rl",
    "reward": "benchmarks.reward",
    "kto": "benchmarks.reward",
    "hybrid": "benchmarks.hybrid",
}
"""Each task of ``trl-padfree bench --task`` and the module that runs it."""


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


def add_output(p: argparse.ArgumentParser, name_help: str) -> None:
    """``--output-dir`` and ``--name``: where every task writes its report (:func:`~.report.write_report`)."""
    p.add_argument("--output-dir", type=Path, default=Path("bench-results"), help="where the reports are written")
    p.add_argument("--name", default=None, help=name_help)


def build_parser(task: str = "sft") -> Parser:
    """The parser of ``task``; one that is not a task gets sft's, which refuses it naming the choices."""
    task = task if task in TASKS else "sft"
    module = importlib.import_module(TASKS[task])
    p = Parser(prog="trl-padfree bench" + ("" if task == "sft" else f" --task {task}"), description=module.__doc__,
               formatter_class=HelpFormatter)
    p.add_argument("--task", choices=list(TASKS), default=task,
                   help="the benchmark: sft (default), dpo, grpo, rloo, reward or kto; each has its own options "
                   "(trl-padfree bench --task TASK --help)")
    module.add_options(p, task)
    return p


def main(argv: list[str] | None = None) -> int:
    """``trl-padfree bench``: run the task, write its report, print it; the exit code of its targets."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--worker"]:
        from .runner import worker_main

        return worker_main(argv[1], argv[2])
    parser = build_parser(task_of(argv))
    args = parser.parse_args(argv)
    return int(importlib.import_module(TASKS[args.task]).main(parser, args) or 0)
