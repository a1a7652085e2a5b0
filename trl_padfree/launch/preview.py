"""``trl-padfree preview --config x.yaml [-n 3] [--task NAME] [--field value ...]``: the first N (default 3) training
examples as the trainer sees them, trained tokens marked (colour on a terminal, ``[[ ]]`` otherwise), then the counts
over the training set. Takes the config and ``--field`` overrides of the trainer (``--task``: which one, else told
from the config's fields); loads no model, writes nothing. Exit status: 0 done, 2 bad input."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

IGNORE_INDEX = -100
_GREEN, _DIM, _RESET = "\033[1;32m", "\033[2m", "\033[0m"


def marked_text(data: bytes, starts: Sequence[int], labels: Sequence[int], color: bool = False) -> str:
    """The text of one example (token ``i`` is ``data[starts[i]:starts[i+1]]``), each run of trained tokens marked.

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
        out.append(f"{_GREEN if trained else _DIM}{text}{_RESET}" if color else
                    f"[[{text}]]" if trained else text)
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


def scored(mark: Callable[..., str], prompt: list[int], response: list[int]) -> str:
    """The text of ``prompt + response``, ``response`` marked as scored."""
    return mark(prompt + response, [IGNORE_INDEX] * len(prompt) + response)


def percent(part: float, whole: float) -> str:
    return f"{100.0 * part / whole if whole else 0.0:.1f}%"


def _options(argv: Sequence[str]) -> tuple[int, str | None, list[str]]:
    """``(n, task or None, the rest of argv)``.

    >>> _options(["--config", "x.yaml", "--task", "kto", "-n", "2", "--max_steps", "-1"])
    (2, 'kto', ['--config', 'x.yaml', '--max_steps', '-1'])
    """
    from .config import ConfigError
    from .tasks import COMMANDS

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    parser.add_argument("-n", "--num_examples", "--num-examples", type=int, default=3)
    parser.add_argument("--task", choices=list(COMMANDS))
    try:
        options, rest = parser.parse_known_args(list(argv))
    except argparse.ArgumentError as exc:
        raise ConfigError(str(exc)) from None
    if options.num_examples < 1:
        raise ConfigError(f"-n must be at least 1, got {options.num_examples}")
    return options.num_examples, options.task, rest


def guess_task(argv: Sequence[str]) -> tuple[str, list[str]]:
    """``(the trainer a config is for, the others its fields fit as well)``: the task with the most of its fields
    that ``train`` lacks (the first of a tie; none: SFT).

    >>> guess_task(["--max_steps", "3"]), guess_task(["--num_generations", "4"]), guess_task(["--desirable_weight", "1"])
    (('sft', []), ('grpo', ['rloo']), ('kto', []))
    """
    import dataclasses

    import yaml

    from .config import argument_classes
    from .tasks import COMMANDS

    keys = {a[2:].split("=", 1)[0].removeprefix("no_") for a in argv if a.startswith("--")}
    if "--config" in argv[:-1] and os.path.isfile(path := argv[argv.index("--config") + 1]):
        with contextlib.suppress(yaml.YAMLError, UnicodeDecodeError), open(path, encoding="utf-8") as handle:
            config = yaml.safe_load(handle)  # (a file that is no YAML mapping: parsing says what is wrong with it)
            keys |= set(config) if isinstance(config, dict) else set()
    fields = {name: {f.name for cls in argument_classes(name) for f in dataclasses.fields(cls)}
              for name in COMMANDS}
    scores = {name: len(keys & (own - fields["sft"])) for name, own in fields.items() if name != "sft"}
    best = max(scores.values(), default=0)
    tied = [name for name, score in scores.items() if best and score == best]
    return (tied[0], tied[1:]) if tied else ("sft", [])


def main(argv: Sequence[str] | None = None) -> int:
    """Print the preview; 0 done, 2 bad input (one line on stderr)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or {"-h", "--help"} & set(argv):
        print("usage: " + __doc__.replace("``", ""))
        return 0
    from . import load_config
    from .config import ConfigError
    from .console import quiet_progress
    from .demo import builtin_config
    from .model import load_tokenizer
    from .tasks import get_task, prog

    try:
        n, task, args = _options(argv)
        args = builtin_config(args)  # --config demo / demo-chat / demo-dpo: the configs shipped in the package
        if task is None:  # a DPO config (trl-padfree dpo) shows its pairs, a GRPO one its groups
            task, others = guess_task(args)
            if others:
                print(f"trl-padfree preview: note: previewed as a config of {prog(task)} (its fields fit "
                      f"{', '.join(others)} too; --task <name> picks another)", file=sys.stderr)
        cfg = load_config(args, check_environment=False, task=task)
        with quiet_progress():
            lines = get_task(task).preview(cfg, load_tokenizer(cfg), n, sys.stdout.isatty())
    except ConfigError as exc:
        print(f"trl-padfree preview: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0
