"""``trl-padfree preview --config x.yaml [-n 3] [--field value ...]``: the first examples as the trainer sees them.

The config is read and validated exactly as ``trl-padfree train`` reads it (bad input: one line, exit 2), then the
data pipeline of the run is applied by the config's task (its ``preview``; SFT: :func:`~.tasks.sft_data.prepare_data`:
formatting, tokenization, truncation, the collator's labels, dropping examples without a trained token); no model
is loaded and nothing is written.

Each shown example is its exact text (token bytes, special tokens literally) with the trained tokens marked: in
colour on a terminal, between ``[[`` and ``]]`` otherwise. The counts at the end cover the whole training set.
It is the tool to reach for when a loss looks wrong (axolotl's ``preprocess --debug``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

__all__ = ["main", "marked_text"]

IGNORE_INDEX = -100
OPEN, CLOSE = "[[", "]]"
_GREEN, _DIM, _RESET = "\033[1;32m", "\033[2m", "\033[0m"
_USAGE = "usage: trl-padfree preview --config configs/NAME.yaml [-n 3] [--task TASK] [--field value ...]"


def _spans(labels: Sequence[int]) -> list[tuple[int, int, bool]]:
    """Runs of consecutive tokens that are all trained or all masked: ``(start, end, trained)``.

    >>> _spans([-100, -100, 5, 6, -100, 7])
    [(0, 2, False), (2, 4, True), (4, 5, False), (5, 6, True)]
    """
    runs: list[tuple[int, int, bool]] = []
    for i, label in enumerate(labels):
        trained = label != IGNORE_INDEX
        if runs and runs[-1][2] == trained:
            runs[-1] = (runs[-1][0], i + 1, trained)
        else:
            runs.append((i, i + 1, trained))
    return runs


def marked_text(data: bytes, starts: Sequence[int], labels: Sequence[int], color: bool = False) -> str:
    """The text of one example (its bytes, token ``i`` at ``data[starts[i]:starts[i+1]]``), trained runs marked.

    >>> marked_text(b"Q: hi A: yes<eos>", [0, 2, 5, 8, 12, 17], [-100, -100, -100, 7, 8])
    'Q: hi A:[[ yes<eos>]]'
    """
    out = []
    for start, end, trained in _spans(labels):
        text = data[starts[start] : starts[end]].decode("utf-8", errors="replace")
        if color:
            out.append(f"{_GREEN}{text}{_RESET}" if trained else f"{_DIM}{text}{_RESET}")
        else:
            out.append(f"{OPEN}{text}{CLOSE}" if trained else text)
    return "".join(out)


def _split_n(argv: Sequence[str]) -> tuple[int, list[str]]:
    """Take ``-n N`` / ``--num_examples N`` out of ``argv``."""
    from .config import ConfigError

    args, n = list(argv), 3
    for flag in ("-n", "--num_examples", "--num-examples"):
        while flag in args:
            i = args.index(flag)
            if i + 1 >= len(args):
                raise ConfigError(f"{flag} needs a number of examples, e.g. {flag} 3")
            try:
                n = int(args[i + 1])
            except ValueError:
                raise ConfigError(f"{flag} must be a whole number of examples, got {args[i + 1]!r}") from None
            if n < 1:
                raise ConfigError(f"{flag} must be at least 1, got {n}")
            del args[i : i + 2]
    return n, args


def guess_task(argv: Sequence[str]) -> str:
    """The trainer a config is for, from the fields it sets: how ``preview`` tells the configs apart without a flag.

    The trainer of :mod:`.tasks` that has the most of the config's fields that ``trl-padfree train`` lacks
    (``prompt_once``, ``beta``: DPO; ``num_generations``: GRPO), the first registered on a tie; none: SFT.
    ``preview --task NAME`` says it instead (:func:`_split_task`).

    >>> guess_task(["--prompt_once", "true"]), guess_task(["--max_steps", "3"]), guess_task(["--num_generations", "4"])
    ('dpo', 'sft', 'grpo')
    """
    import dataclasses

    import yaml

    from .config import argument_classes
    from .tasks import task_names

    keys = {a[2:].split("=", 1)[0].removeprefix("no_") for a in argv if a.startswith("--")}
    if "--config" in argv[:-1] and os.path.isfile(path := argv[argv.index("--config") + 1]):
        try:
            with open(path, encoding="utf-8") as handle:
                config = yaml.safe_load(handle)
        except (yaml.YAMLError, UnicodeDecodeError):
            config = None  # (parsing says what is wrong with it)
        keys |= set(config) if isinstance(config, dict) else set()
    fields = {name: {f.name for cls in argument_classes(name) for f in dataclasses.fields(cls)}
              for name in task_names()}
    scores = {name: len(keys & (own - fields["sft"])) for name, own in fields.items() if name != "sft"}
    best = max(scores, key=scores.__getitem__, default="sft")
    return best if scores.get(best) else "sft"


def _split_task(args: list[str]) -> tuple[str | None, list[str]]:
    """``--task NAME`` taken out of ``args`` (None where not given), checked against the launch's tasks.

    >>> _split_task(["--config", "x.yaml", "--task", "kto"])
    ('kto', ['--config', 'x.yaml'])
    >>> _split_task(["--task=dpo"])
    ('dpo', [])
    """
    from .config import ConfigError
    from .tasks import task_names

    task, rest, i = None, [], 0
    while i < len(args):
        if args[i] == "--task" or args[i].startswith("--task="):
            if "=" in args[i]:
                task = args[i].split("=", 1)[1]
            elif i + 1 < len(args):
                task, i = args[i + 1], i + 1
            else:
                task = ""
        else:
            rest.append(args[i])
        i += 1
    if task is not None and task not in task_names():
        raise ConfigError(f"--task must be one of {', '.join(task_names())} (the trainer the config is for), got "
                          f"{task!r}")
    return task, rest


def main(argv: Sequence[str] | None = None) -> int:
    """Print the preview; 0 done, 2 bad input (one line on stderr)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or {"-h", "--help"} & set(argv):
        import textwrap

        print(_USAGE + "\n\n" + textwrap.fill(
            "Show the first N (default 3) training examples as trl-padfree train prepares them, trained tokens "
            "marked (colour on a terminal, [[ ]] otherwise), and how many tokens are trained. Takes the same "
            "config and --field overrides as train (trl-padfree train --help lists them); loads no model, "
            "writes nothing. Exit status: 0 done, 2 bad input.", width=100))
        return 0
    from .config import ConfigError
    from .console import quiet_progress

    guessed = None
    try:
        n, args = _split_n(argv)
        task, args = _split_task(args)
        from . import load_config
        from .demo import builtin_config
        from .tasks import get_task
        from .tokenizer import load_tokenizer

        args = builtin_config(args)  # --config demo / demo-chat / demo-dpo: the configs shipped in the package
        if task is None:  # a DPO config (trl-padfree dpo) shows its pairs, a GRPO one its groups
            task = guessed = guess_task(args)
        cfg = load_config(args, check_environment=False, task=task)
        with quiet_progress():
            tokenizer = load_tokenizer(cfg)
            lines = get_task(task).preview(cfg, tokenizer, n, sys.stdout.isatty())
    except ConfigError as exc:
        hint = ""
        if guessed not in (None, "sft"):  # told from fields that several trainers have: say how, and the way out
            from .tasks import get_task

            hint = (f" (previewed as a config of {get_task(guessed).prog}, told from its fields; for another trainer's "
                    "config add --task, e.g. --task kto)")
        print(f"trl-padfree preview: error: {exc}{hint}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0
