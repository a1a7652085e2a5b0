"""The ``trl-padfree`` command: it only dispatches to a sub-command's ``main(argv) -> int`` (the trainers': the
launch with a task), so ``trl-padfree --help`` stays fast (no torch import)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

#: Sub-command -> (the module whose ``main(argv)`` runs it, or ``task:NAME``: the launch with the recipe ``NAME`` of
#: :mod:`trl_padfree.launch.tasks`; the one-line help).
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": ("task:sft", "fine-tune a model from a YAML config (SFTTrainer + this collator)"),
    "dpo": ("task:dpo", "preference-train a model from a YAML config (DPOTrainer, padding-free)"),
    "grpo": ("task:grpo", "RL-train a model from a YAML config (GRPOTrainer, padding-free)"),
    "rloo": ("task:rloo", "RL-train a model from a YAML config (RLOOTrainer, padding-free)"),
    "reward": ("task:reward", "train a reward model from a YAML config (RewardTrainer, padding-free)"),
    "kto": ("task:kto", "KTO-train a model from a YAML config (KTOTrainer, padding-free)"),
    "preview": ("trl_padfree.launch.preview", "show the first examples of a config's data, trained tokens marked"),
    "check": ("trl_padfree.check", "probe whether a model keeps packed examples apart"),
    "bench": ("benchmarks.cli", "padded vs padding-free benchmark (a source checkout's benchmarks/ directory)"),
}
USAGE = "\n".join(["usage: trl-padfree {" + ",".join(SUBCOMMANDS) + "} [options]", "", "sub-commands:",
                   *(f"  {name:<8} {help_}" for name, (_, help_) in SUBCOMMANDS.items()),
                   "\nRun `trl-padfree SUBCOMMAND --help` for the options of one sub-command."])
BENCH_MISSING = (
    "trl-padfree bench: the benchmark is not part of the installed package; it is the benchmarks/ directory of "
    "a source checkout: clone the repository, `pip install -e '.[bench]'` there and run trl-padfree bench in it"
)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    name, rest = (argv or [""])[0], argv[1:]
    if name in {"-h", "--help"}:
        print(USAGE)
        return 0
    if name not in SUBCOMMANDS:  # (none: exit 2 as for an unknown one)
        problem = f"unknown sub-command {name!r}" if name else "a sub-command is needed"
        print(f"trl-padfree: {problem}.\n\n{USAGE}", file=sys.stderr)
        return 2
    target = SUBCOMMANDS[name][0]
    if target.startswith("task:"):
        from .launch import main as launch

        return int(launch(rest, task=target.removeprefix("task:")) or 0)
    if name == "bench":  # beside this package in a source checkout, not in the wheel
        root = Path(__file__).resolve().parent.parent
        if not (root / "benchmarks" / "__init__.py").is_file():
            print(BENCH_MISSING, file=sys.stderr)
            return 2
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
    return int(importlib.import_module(target).main(rest) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
