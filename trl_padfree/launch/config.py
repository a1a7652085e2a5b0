"""The launch's config: a strict ``trl.TrlParser`` over the trainer's config class, ``trl.ModelConfig`` and
:class:`LaunchArguments`, flat keys as in ``trl sft --config``. An unknown key, a value of the wrong type or one a
dataclass refuses is a one-line :class:`ConfigError` (with a did-you-mean hint) before anything is loaded."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import glob
import os
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ..exception_text import one_line


class ConfigError(ValueError):
    """Bad user input: ``main`` prints the message as one line and exits with code 2, before any work starts."""


def _field(default: Any, help_: str) -> Any:
    return field(default=default, metadata={"help": help_})


@dataclass
class LaunchArguments:
    """Where the data comes from, and the launch's own settings (every trainer)."""

    train_file: str | None = _field(None, "Local training data: a .json/.jsonl/.csv/.parquet file or a glob of them.")
    eval_file: str | None = _field(None, "Local evaluation data, as train_file.")
    dataset_name: str | None = _field(None, "A Hugging Face Hub dataset id or a local dataset directory.")
    dataset_config: str | None = _field(None, "Configuration name of dataset_name.")
    dataset_train_split: str = _field("train", "Split of dataset_name to train on.")
    dataset_test_split: str | None = _field(None, "Split of dataset_name to evaluate on.")
    eval_fraction: float | None = _field(None, "Hold out this fraction (0-1) of the training data for evaluation.")
    max_train_examples: int | None = _field(None, "Use only the first N training examples.")
    max_eval_examples: int | None = _field(None, "Use only the first N eval examples.")
    overwrite_output_dir: bool = _field(False, "Start a new run in an output_dir that already holds one (else "
                                               "refused unless resume_from_checkpoint is set).")


@dataclass
class SFTArguments(LaunchArguments):
    """``trl-padfree train``: how each record becomes one training text."""

    template: str | None = _field(None, "Python format string over the record's fields, e.g. '### Question: "
                                        "{instruction}\\n### Answer: {output}'; without it the records' text, "
                                        "prompt+completion or messages are used.")
    template_check_examples: int = _field(256, "Fail if the response template is in none of the first N examples.")


@dataclass
class ChatArguments(LaunchArguments):
    """``trl-padfree dpo`` / ``kto``: a chat template for conversational records."""

    chat_template_path: str | None = _field(None, "A .jinja chat template for a tokenizer without one.")


@dataclass
class RewardFunctionArguments(LaunchArguments):
    """``trl-padfree grpo`` / ``rloo``: the reward functions."""

    reward_funcs: list[str] | None = _field(None, "Reward functions: TRL's built-in ones by name, this package's "
                                                  "(answer_chars, answer_prefix, answer_overlap, exact_match) or "
                                                  "'module:function'.")


@dataclass
class LaunchConfig:
    """The parsed dataclasses (``launch``: the recipe's :class:`LaunchArguments`; ``training``: the trainer's config;
    ``model``: ``trl.ModelConfig``) and what the launch resolved; the checks and the recipe set fields in place."""

    launch: Any
    training: Any
    model: Any
    task: str = "sft"
    attn_auto: bool = False  # attn_implementation was "auto": the launch may fall back (see launch.model)
    explicit: frozenset[str] = frozenset()  # fields set in the YAML file or on the command line
    run_id: str | None = None
    model_init_kwargs: dict[str, Any] | None = None  # moved out of ``training``: the launch loads the model
    notes: list[str] = field(default_factory=list)  # lines for the run to print

    @property
    def padding_free(self) -> bool:
        return bool(self.training.padding_free)

    @property
    def attn_implementation(self) -> str:
        return self.model.attn_implementation or "auto"


def argument_classes(task: str = "sft") -> tuple[type, type, type]:
    """The recipe's ``ARGUMENTS`` and ``CONFIG``, and ``trl.ModelConfig``."""
    import trl

    from .tasks import get_task

    return get_task(task).ARGUMENTS, get_task(task).CONFIG, trl.ModelConfig


def did_you_mean(name: str, candidates: Sequence[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``candidates``, or ``""``.

    >>> did_you_mean("sdpaa", ["eager", "sdpa"]), did_you_mean("x", ["eager"])
    ("; did you mean 'sdpa'?", '')
    """
    match = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else ""


#: How a value's type is named in "wrong type" messages (a YAML value's, or the type a field expects).
_KINDS = {type(None): "null", bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
          dict: "a mapping"}


def _unknown(name: str, task: str, known: Sequence[str], keys: Sequence[str] = ()) -> str:
    """The hint after "unknown key/option": the trainer that takes ``name`` (first one that takes all the file's
    ``keys``), else a did-you-mean among ``known``."""
    from .tasks import COMMANDS, prog

    fields = {other: {f.name for c in argument_classes(other) for f in dataclasses.fields(c)} for other in COMMANDS}
    takers = [other for other in COMMANDS if other != task and name in fields[other]]
    if takers:
        best = next((other for other in takers if set(keys) <= fields[other]), takers[0])
        return f" (a field of {prog(best)}, not of {prog(task)})"
    return did_you_mean(name, known)


def build_parser(task: str = "sft") -> Any:
    """The strict ``TrlParser`` of ``task`` with the launch's defaults."""
    from transformers.utils import is_torch_bf16_gpu_available
    from trl import TrlParser

    from .tasks import prog

    class StrictTrlParser(TrlParser):
        explicit: set[str]
        source: str | None = None  # the config file

        def error(self, message: str) -> typing.NoReturn:
            raise ConfigError(f"command line: {message}")

        def set_defaults_with_config(self, **config: Any) -> list[str]:
            """TRL's, with each key and value checked and converted first."""
            actions = {a.dest: a for a in reversed(self._actions) if a.option_strings and a.dest != "help"}
            checked = {}
            for key, value in config.items():
                if key not in actions:
                    raise ConfigError(f"unknown key {key!r} in {self.source}{_unknown(key, task, sorted(actions), config)}")
                checked[key] = _checked(key, value, actions[key], hints.get(key, Any))
            self.explicit.update(checked)
            return super().set_defaults_with_config(**checked)

    def _checked(key: str, value: Any, action: argparse.Action, hint: Any, item: bool = False) -> Any:
        """A YAML value converted by the flag's own converter, or a ConfigError naming the field."""
        args = typing.get_args(hint) or (hint,)
        convert = action.type or str
        boolean = getattr(convert, "__name__", "") == "string_to_bool"  # (HfArgumentParser's converter of a bool)
        names = [str(c.value if isinstance(c, Enum) else c) for c in action.choices or ()]
        if value is None and (type(None) in args or action.default is None):
            return None
        if isinstance(value, (dict, list)) and any(a is type(value) or typing.get_origin(a) is type(value) for a in args):
            return value
        if action.nargs in ("+", "*") and not item and not isinstance(value, (dict, type(None))):
            return [_checked(key, v, action, Any, item=True) for v in (value if isinstance(value, list) else [value])]
        if isinstance(value, bool) and key == "resume_from_checkpoint":  # (true: the newest checkpoint)
            return str(value).lower()
        try:  # (a number is converted from its text: int("2.0") refuses a float for an integer field)
            if value is None or isinstance(value, (dict, list)) or isinstance(value, bool) != boolean and not (
                    boolean and isinstance(value, str)):
                raise TypeError
            converted = convert(value if isinstance(value, (str, bool)) else str(value))
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            expected = ("true or false" if boolean else f"one of {', '.join(map(repr, names))}" if names
                        else _KINDS.get(convert, getattr(convert, "__name__", "a value")))
            expected = "a list" if isinstance(value, (dict, list)) and action.nargs in ("+", "*") else expected
            quote = "; quote it: 'no' (YAML reads a bare no as false)" if value is False and "no" in names else ""
            raise ConfigError(f"wrong type for {key!r} in {parser.source}: expected {expected}"
                              f"{' or null' if type(None) in args else ''}, got {value!r} "
                              f"({_KINDS.get(type(value), type(value).__name__)}){quote}") from None
        if action.choices is not None and converted not in action.choices:
            raise ConfigError(f"invalid value for {key!r} in {parser.source}: {value!r} is not one of "
                              f"{', '.join(map(repr, names))}{did_you_mean(str(value), names)}")
        return converted

    classes = argument_classes(task)
    hints = {name: tp for cls in reversed(classes) for name, tp in typing.get_type_hints(cls).items()}  # first wins
    parser = StrictTrlParser(classes, prog=prog(task), allow_abbrev=False,
                             usage=f"{prog(task)} --config configs/NAME.yaml [--field value ...]")
    parser.explicit = set()
    parser.set_defaults(padding_free=True, attn_implementation="auto", gradient_checkpointing=None,
                        bf16=is_torch_bf16_gpu_available())
    return parser


def parse_arguments(argv: Sequence[str], task: str = "sft") -> LaunchConfig:
    """Parse ``[--config FILE] [--field value ...]`` into a :class:`LaunchConfig` (no validation beyond types)."""
    import yaml

    args = list(argv)
    if args.count("--config") > 1 or args[-1:] == ["--config"]:
        raise ConfigError("--config takes one path (--config configs/NAME.yaml); override fields with --field value")
    config_path = args[args.index("--config") + 1] if "--config" in args else None
    if config_path is not None and not os.path.isfile(config_path):
        from .demo import BUILTIN_CONFIGS

        here, guess = sorted(glob.glob("configs/*.yaml")), f"configs/{config_path}.yaml"
        raise ConfigError(f"config file not found: {config_path!r} (relative paths start at {os.getcwd()}); built-in "
                          f"configs: {', '.join(BUILTIN_CONFIGS)}" + (f"; here: {', '.join(here)}" if here else "")
                          + (f"; did you mean {guess!r}?" if guess in here else ""))
    parser = build_parser(task)
    parser.source = config_path
    parser.explicit.update(a[2:].split("=", 1)[0].removeprefix("no_") for a in args if a.startswith("--"))
    notes = []
    world = os.environ.get("WORLD_SIZE", "1")
    if world.isdigit() and int(world) > 1 and "use_cpu" not in parser.explicit:
        import torch

        if not torch.cuda.is_available():  # several CPU processes: one DDP run over gloo, not copies
            parser.set_defaults(use_cpu=True)
            notes.append("use_cpu: true (several processes on a machine without a GPU: they train as one DDP run "
                         "over gloo; set use_cpu to choose)")
    try:
        *parsed, remaining = parser.parse_args_and_config(args, return_remaining_strings=True)
    except ConfigError:
        raise
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{config_path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
                          "save the file as UTF-8") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{config_path}: not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    except (ValueError, TypeError, AttributeError) as exc:  # a dataclass's __post_init__, or TRL's file checks
        raise ConfigError(f"invalid settings: {one_line(exc, limit=None)}") from None
    if remaining:
        first = remaining[0]
        if not first.startswith("--"):
            raise ConfigError(f"unexpected argument {first!r} on the command line; options look like --field value")
        name = first[2:].split("=", 1)[0]
        known = sorted(a.dest for a in parser._actions if a.option_strings and a.dest != "help")
        raise ConfigError(f"unknown option '--{name}' on the command line{_unknown(name, task, known)}")
    return LaunchConfig(*parsed, task=task, explicit=frozenset(parser.explicit), notes=notes)
