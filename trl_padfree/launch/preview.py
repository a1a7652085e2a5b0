"""``trl-padfree preview --config x.yaml [-n 3] [--field value ...]``: the first examples as the trainer sees them
(the config's task's ``preview``), trained tokens marked (colour on a terminal, ``[[ ]]`` otherwise), then the counts
over the training set; no model is loaded and nothing is written."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["main", "marked_text", "token_marker"]

IGNORE_INDEX = -100
OPEN, CLOSE = "[[", "]]"
_GREEN, _DIM, _RESET = "\033[1;32m", "\033[2m", "\033[0m"
_USAGE = """usage: trl-padfree preview --config configs/NAME.yaml [-n 3] [--task TASK] [--field value ...]

Show the first N (default 3) training examples as trl-padfree train prepares them, trained tokens marked (colour on
a terminal, [[ ]] otherwise), and how many tokens are trained. Takes the same config and --field overrides as train
(trl-padfree train --help lists them); loads no model, writes nothing. Exit status: 0 done, 2 bad input."""


def marked_text(data: bytes, starts: Sequence[int], labels: Sequence[int], color: bool = False) -> str:
    """The text of one example (its bytes, token ``i`` at ``data[starts[i]:starts[i+1]]``), each run of trained
    tokens marked (``color``: trained in green, the rest dim).

    >>> marked_text(b"Q: hi A: yes<eos>", [0, 2, 5, 8, 12, 17], [-100, -100, -100, 7, 8])
    'Q: hi A:[[ yes<eos>]]'
    >>> marked_text(b"Q: hi A: yes", [0, 2, 5, 8, 12], [-100, -100, -100, 7], color=True)
    '\\x1b[2mQ: hi A:\\x1b[0m\\x1b[1;32m yes\\x1b[0m'
    """
    out, start = [], 0
    for trained, run in itertools.groupby(labels, key=lambda label: label != IGNORE_INDEX):
        end = start + len(list(run))
        text = data[starts[start] : starts[end]].decode("utf-8", errors="replace")
        start = end
        if color:
            out.append(f"{_GREEN if trained else _DIM}{text}{_RESET}")
        else:
            out.append(f"{OPEN}{text}{CLOSE}" if trained else text)
    return "".join(out)


def token_marker(tokenizer: Any, color: bool = False) -> Callable[[Sequence[int], Sequence[int]], str]:
    """``mark(ids, labels)``: the exact text of ``ids``, the tokens whose label is not -100 marked."""
    import numpy as np

    from trl_padfree.token_text import TokenText

    text = TokenText.from_tokenizer(tokenizer)

    def mark(ids: Sequence[int], labels: Sequence[int]) -> str:
        raw, starts = text.decode(np.asarray(ids, dtype=np.int64))
        return marked_text(raw, starts.tolist(), labels, color)

    return mark


def _options(argv: Sequence[str]) -> tuple[int, str | None, list[str]]:
    """``(n, task or None, the rest of argv)``: ``-n N`` and ``--task NAME`` taken out.

    >>> _options(["--config", "x.yaml", "--task", "kto", "-n", "2", "--max_steps", "-1"])
    (2, 'kto', ['--config', 'x.yaml', '--max_steps', '-1'])
    """
    import argparse

    from .config import ConfigError
    from .tasks import task_names

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    parser.add_argument("-n", "--num_examples", "--num-examples", type=int, default=3)
    parser.add_argument("--task")
    try:
        options, rest = parser.parse_known_args(list(argv))
    except argparse.ArgumentError as exc:
        raise ConfigError(f"{exc} (-n: a whole number of examples)") from None
    if options.num_examples < 1:
        raise ConfigError(f"-n must be at least 1, got {options.num_examples}")
    if options.task is not None and options.task not in task_names():
        raise ConfigError(f"--task must be one of {', '.join(task_names())} (the trainer the config is for), got "
                          f"{options.task!r}")
    return options.num_examples, options.task, rest


def guess_task(argv: Sequence[str]) -> str:
    """The trainer a config is for: the task with the most of its fields that ``train`` lacks (first on a tie; none:
    SFT), unless ``--task NAME`` says it.

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


def main(argv: Sequence[str] | None = None) -> int:
    """Print the preview; 0 done, 2 bad input (one line on stderr)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or {"-h", "--help"} & set(argv):
        print(_USAGE)
        return 0
    from . import load_config
    from .config import ConfigError
    from .console import quiet_progress
    from .demo import builtin_config
    from .tasks import get_task
    from .tokenizer import load_tokenizer

    guessed = None
    try:
        n, task, args = _options(argv)
        args = builtin_config(args)  # --config demo / demo-chat / demo-dpo: the configs shipped in the package
        if task is None:  # a DPO config (trl-padfree dpo) shows its pairs, a GRPO one its groups
            task = guessed = guess_task(args)
        cfg = load_config(args, check_environment=False, task=task)
        with quiet_progress():
            lines = get_task(task).preview(cfg, load_tokenizer(cfg), n, sys.stdout.isatty())
    except ConfigError as exc:
        hint = ""
        if guessed not in (None, "sft"):  # told from fields that several trainers have: say how, and the way out
            from .tasks import prog

            hint = (f" (previewed as a config of {prog(guessed)}, told from its fields; for another trainer's "
                    "config add --task, e.g. --task kto)")
        print(f"trl-padfree preview: error: {exc}{hint}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0
