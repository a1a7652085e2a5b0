"""Config parsing for ``trl-padfree train``: YAML + command line -> dataclasses, with strict key and type checks.

The launcher follows ``trl sft``'s conventions: every field of :class:`DataArguments`, the task's own arguments
(SFT's ``tasks.sft.CollatorArguments``), :class:`LaunchArguments`, TRL's ``SFTConfig`` and ``ModelConfig`` is one
flat key of the YAML file (``--config``) and one ``--flag`` of the command line; command-line values win over the
file. Parsing is TRL's own :class:`~trl.TrlParser` (an
``HfArgumentParser``), with three differences that make bad input fail fast and clearly:

- a key that no dataclass knows is an error naming the closest valid key (``difflib``), in the file and on the
  command line alike (TRL only warns, or fails on a pile of leftover strings);
- a YAML value of the wrong type is an error (TRL sets YAML values as argparse defaults, which argparse never
  converts nor checks);
- argparse errors raise :class:`ConfigError` (one line) instead of printing the usage and exiting.

The launcher's own defaults differ from ``SFTConfig``/``ModelConfig`` in three places: ``padding_free`` is True
(and is applied by this project's collator; TRL's own ``SFTConfig.padding_free`` is always turned off, since TRL
refuses a custom collator with it), ``attn_implementation`` is ``"auto"``, and ``bf16`` is True only where a GPU
supports it (TRL's default, True, makes ``SFTConfig`` refuse to start on a CPU-only machine). Fields left unset
that depend on the machine and the model (activation checkpointing, torch threads, pinned memory, progress bars)
are decided by :mod:`.defaults` once the config is valid; ``--help`` is :mod:`.help`'s grouped text.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from ..exception_text import one_line
from .help import install_help

__all__ = [
    "ConfigError",
    "DataArguments",
    "HeadLaunchArguments",
    "LaunchArguments",
    "LaunchConfig",
    "build_parser",
    "parse_arguments",
    "split_config_flag",
    "with_fields",
]


class ConfigError(ValueError):
    """Bad user input: ``main`` prints the message as one line and exits with code 2, before any work starts."""


class RefusedElsewhere(ConfigError):
    """Another process of a multi-process run refused its config (``launch.distributed``): this one stops too."""


@dataclass
class DataArguments:
    """Where the data comes from and how each record becomes one training text."""

    train_file: str | None = field(
        default=None,
        metadata={"help": "Local training data: a .json/.jsonl/.csv/.parquet file or a glob pattern of them."},
    )
    eval_file: str | None = field(
        default=None, metadata={"help": "Local evaluation data, in the same formats as train_file."}
    )
    dataset_name: str | None = field(
        default=None,
        metadata={"help": "A Hugging Face Hub dataset id or a local dataset directory (instead of train_file)."},
    )
    dataset_config: str | None = field(
        default=None, metadata={"help": "Configuration name of dataset_name (the `name` of load_dataset)."}
    )
    dataset_train_split: str = field(default="train", metadata={"help": "Split of dataset_name to train on."})
    dataset_test_split: str | None = field(
        default=None, metadata={"help": "Split of dataset_name to evaluate on (e.g. 'test'); none by default."}
    )
    eval_fraction: float | None = field(
        default=None,
        metadata={"help": "Hold out this fraction (0-1) of the training data for evaluation (seeded by `seed`)."},
    )
    max_train_examples: int | None = field(
        default=None, metadata={"help": "Use only the first N training examples (after the eval split)."}
    )
    max_eval_examples: int | None = field(default=None, metadata={"help": "Use only the first N eval examples."})
    template: str | None = field(
        default=None,
        metadata={
            "help": "Python format string over the dataset's fields giving each example's text, e.g. "
            "'### Question: {instruction}\\n### Answer: {output}'. Without it the dataset's own `text` "
            "(dataset_text_field), `prompt`+`completion` or `messages` (chat template) fields are used."
        },
    )


@dataclass
class LaunchArguments:
    """Pre-flight checks and run-time settings of the launcher itself."""

    template_check_examples: int = field(
        default=256,
        metadata={"help": "Fail before training if the response template is in none of the first N examples."},
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Start a new run in an output_dir that already holds one (its files are replaced as the new run "
            "writes its own; its other checkpoints stay, ignored by resume_from_checkpoint: true). Without it such "
            "an output_dir is refused unless resume_from_checkpoint is set."
        },
    )
    check_packing: bool = field(
        default=True,
        metadata={"help": "Probe the loaded model once: fail if packed examples leak into each other."},
    )
    torch_num_threads: int | None = field(
        default=None,
        metadata={
            "help": "CPU threads of torch during the run (torch.set_num_threads). Tiny models on a shared CPU "
            "train much faster with 1. Default: torch's own choice."
        },
    )
    max_tokens_per_batch: int | None = field(
        default=None,
        metadata={
            "help": "Token-budget batching (opt-in): each mini-batch of a rank holds as many whole examples as fit "
            "this many real tokens (trl_padfree.TokenBudgetBatchSampler), instead of per_device_train_batch_size "
            "examples. Default: fixed-size batches."
        },
    )


@dataclass
class HeadLaunchArguments(LaunchArguments):
    """:class:`LaunchArguments` plus the switch of the scored-positions LM head, for the tasks whose trainer has an
    LM head and takes ``scored_lm_head=`` (a task passes it on with ``Task.trainer_kwargs``; a task with the plain
    :class:`LaunchArguments` refuses the key as unknown rather than ignore it)."""

    scored_lm_head: bool = field(
        default=True,
        metadata={
            "help": "Score the loss with the scored-positions LM head (trl_padfree.scored_head: only the scored "
            "positions are projected, in bounded chunks, on every device); false: TRL's own LM head."
        },
    )


@dataclass(frozen=True)
class LaunchConfig:
    """Everything ``trl-padfree train`` was asked to do, parsed and (after validation) resolved; frozen.

    Each stage that resolves something returns a new config (``dataclasses.replace``), in this order:
    :func:`parse_arguments`, ``demo.resolve_package_paths``, ``validate.validate_config`` (with the task's
    ``resolve``), ``defaults.apply_defaults``, ``distributed.plan_nodes``, and ``model.load_model`` (the attention
    the model was loaded with, where ``auto`` fell back). The nested objects (``training``: TRL's ``SFTConfig`` /
    ``DPOConfig`` ..., a transformers ``TrainingArguments``; ``model``: ``ModelConfig``; ``data``, ``collator``,
    ``launch``) stay mutable dataclasses, but no stage assigns to them: a stage that adjusts one puts a copy with
    the new values in the new config (:func:`with_fields`; not ``dataclasses.replace``, which would run their
    ``__post_init__`` again, TrainingArguments' derivations and checks included, on values already resolved).
    ``tests/test_launch_config.py`` reads the launch's source to check that none assigns ``cfg.<field> =``.
    """

    data: DataArguments
    collator: Any  # the task's own arguments (sft: CollatorArguments, dpo: tasks.dpo.PreferenceArguments, ...)
    launch: LaunchArguments
    training: Any  # trl.SFTConfig or trl.DPOConfig (imported lazily: importing TRL takes seconds)
    model: Any  # trl.ModelConfig
    config_path: str | None = None
    padding_free: bool = True
    attn_implementation: str = "auto"
    attn_auto: bool = False  # attn_implementation was "auto": the launch may fall back (see launch.model)
    resume_from_checkpoint: str | bool | None = None
    explicit: frozenset[str] = frozenset()  # fields set in the YAML file or on the command line
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # the YAML's env mapping, set after validation
    run_id: str | None = None  # this run's id (launch.run_record), decided by validation
    model_init_kwargs: dict[str, Any] | None = None  # SFTConfig.model_init_kwargs, applied by the launcher
    notes: list[str] = dataclasses.field(default_factory=list)  # lines the resolving stages leave for the run to print
    task: str = "sft"  # the trainer: a name of launch.tasks.REGISTRY ("sft": trl-padfree train, "dpo", "grpo", ...)


def with_fields(obj: Any, **changes: Any) -> Any:
    """A shallow copy of the dataclass ``obj`` with ``changes`` set, ``obj`` unchanged and its ``__post_init__`` not
    run again (see :class:`LaunchConfig`).

    >>> a = DataArguments(template="x")
    >>> b = with_fields(a, template=None)
    >>> a.template, b.template
    ('x', None)
    """
    import copy

    new = copy.copy(obj)
    for name, value in changes.items():
        setattr(new, name, value)
    return new


#: Defaults of the launcher that differ from those of the dataclasses. ``gradient_checkpointing`` (TRL: True) is
#: unset, so that ``activation_checkpointing`` is decided by the launcher (``launch.defaults``) and transformers
#: warns about the deprecated alias only when a config really uses it.
LAUNCH_DEFAULTS: dict[str, Any] = {"padding_free": True, "attn_implementation": "auto", "gradient_checkpointing": None}

#: String fields for which a YAML boolean means something (``resume_from_checkpoint: true`` = the latest one).
_BOOL_AS_STRING = frozenset({"resume_from_checkpoint"})


def _strict_parser(dataclass_types: Sequence[type], prog: str) -> Any:
    """A ``TrlParser`` whose argparse errors raise :class:`ConfigError` instead of printing usage and exiting."""
    from trl import TrlParser

    class StrictTrlParser(TrlParser):
        def error(self, message: str) -> typing.NoReturn:
            raise ConfigError(message)

    return StrictTrlParser(
        dataclass_types,
        prog=prog,
        allow_abbrev=False,
        usage=f"{prog} --config configs/NAME.yaml [--field value ...]",
        description="Fine-tune a causal LM with SFTTrainer and the padding-free completion-only collator. "
        "--config FILE: a YAML mapping of any of the fields below (plus an optional `env` mapping of "
        "environment variables); command-line values override the file. Exit code 2 on bad input.",
    )


def argument_classes(task: str = "sft") -> tuple[type, ...]:
    """The dataclasses whose fields make up the config of ``task``, in parsing order (the task's, see
    :mod:`.tasks`): SFT: the data, collator and launcher arguments, ``SFTConfig``, ``ModelConfig``; DPO: the same
    with :class:`~.tasks.dpo.PreferenceArguments` for the collator's and ``DPOConfig`` for ``SFTConfig``.
    """
    from .tasks import get_task

    return get_task(task).argument_classes()


def build_parser(prog: str = "trl-padfree train", task: str = "sft") -> Any:
    """The launcher's ``TrlParser`` over :func:`argument_classes`, with the launcher's defaults."""
    from transformers.utils import is_torch_bf16_gpu_available

    from .tasks import get_task

    parser = _strict_parser(argument_classes(task), prog)
    parser.padfree_task = task
    get_task(task).configure_parser(parser)
    parser.set_defaults(**LAUNCH_DEFAULTS, bf16=is_torch_bf16_gpu_available())
    return install_help(parser, field_sections(task))  # --help: grouped, with this launcher's defaults


def field_sections(task: str = "sft") -> dict[str, str]:
    """The ``--help`` section (a key of :data:`~.help.GROUPS`) of each field of the launcher's own dataclasses and
    TRL's ``ModelConfig``, by the dataclass that holds it (the first, where two hold a field)."""
    from trl import ModelConfig

    sections: dict[str, str] = {}
    _, collator, launcher, *_ = argument_classes(task)  # (launcher: LaunchArguments or HeadLaunchArguments)
    for key, cls in (("data", DataArguments), ("collator", collator), ("launcher", launcher),
                     ("model", ModelConfig)):
        for f in dataclasses.fields(cls):
            sections.setdefault(f.name, key)
    return sections


def split_config_flag(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """Take ``--config PATH`` (or ``--config=PATH``) out of ``argv``."""
    args = list(argv)
    path = None
    for i, arg in enumerate(args):
        if arg == "--config":
            if i + 1 >= len(args):
                raise ConfigError("--config needs a path: trl-padfree train --config configs/NAME.yaml")
            path = args[i + 1]
            del args[i : i + 2]
            break
        if arg.startswith("--config="):
            path = arg.split("=", 1)[1]
            del args[i]
            break
    if any(a == "--config" or a.startswith("--config=") for a in args):
        raise ConfigError("--config was given twice; pass one config file and override fields with --field value")
    return path, args


def read_yaml_config(path: str) -> dict[str, Any]:
    """Read a launcher YAML file: a mapping of field names to values (an ``env`` mapping is allowed too)."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path!r} (relative paths start at {os.getcwd()})")
    try:
        with open(path, encoding="utf-8") as handle:
            config = yaml.safe_load(handle)
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); save the file as UTF-8"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a mapping of field names to values, got a {type(config).__name__}")
    for key in config:
        if not isinstance(key, str):
            raise ConfigError(f"{path}: field names must be strings, got {key!r}")
    return config


def _field_types(task: str = "sft") -> dict[str, Any]:
    """Resolved type annotation of every config field, by name (first dataclass wins, like the parser)."""
    types_: dict[str, Any] = {}
    for cls in argument_classes(task):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            types_.setdefault(f.name, hints.get(f.name, f.type))
    return types_


def _closest(name: str, candidates: Sequence[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest candidate, or ``""``."""
    match = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else ""


def _union_args(tp: Any) -> tuple[Any, ...]:
    return get_args(tp) if get_origin(tp) in (Union, types.UnionType) else (tp,)


def _mentions(tp: Any, kind: type) -> bool:
    """Whether the annotation ``tp`` admits values of container type ``kind`` (dict or list)."""
    return any(a is kind or get_origin(a) is kind for a in _union_args(tp))


def describe_type(tp: Any, choices: Sequence[Any] | None = None) -> str:
    """Human wording of a field's expected value, e.g. ``'an integer or null'``.

    >>> describe_type(int | None)
    'an integer or null'
    >>> describe_type(bool)
    'true or false'
    >>> describe_type(str, choices=["no", "steps", "epoch"])
    "one of 'no', 'steps', 'epoch'"
    """
    if choices:
        return "one of " + ", ".join(repr(c.value if isinstance(c, Enum) else c) for c in choices)
    words = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    parts: list[str] = []
    for arg in _union_args(tp):
        if arg is type(None):
            continue
        origin = get_origin(arg)
        if arg in words:
            parts.append(words[arg])
        elif arg is dict or origin is dict:
            parts.append("a mapping")
        elif arg is list or origin is list:
            parts.append("a list")
        elif origin is Literal:
            parts.append("one of " + ", ".join(repr(a) for a in get_args(arg)))
        elif isinstance(arg, type) and issubclass(arg, Enum):
            parts.append("one of " + ", ".join(repr(m.value) for m in arg))
        else:
            parts.append(getattr(arg, "__name__", str(arg)))
    text = " or ".join(dict.fromkeys(parts)) or "a value"
    if type(None) in _union_args(tp):
        text += " or null"
    return text


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a mapping"}.get(
        type(value), type(value).__name__
    )


class _ValueChecker:
    """Checks and converts YAML values with the parser's own argparse converters."""

    def __init__(self, parser: Any, source: str) -> None:
        self.actions: dict[str, argparse.Action] = {}
        for action in parser._actions:  # the first action of a dest is the field's (``--no_x`` comes after)
            if action.dest != "help" and action.option_strings:
                self.actions.setdefault(action.dest, action)
        self.types = _field_types(getattr(parser, "padfree_task", "sft"))
        self.source = source

    def wrong(self, key: str, value: Any, expected: str) -> ConfigError:
        return ConfigError(
            f"wrong type for {key!r} in {self.source}: expected {expected}, got {value!r} ({_kind(value)})"
        )

    def check(self, key: str, value: Any) -> Any:
        action = self.actions[key]
        tp = self.types.get(key, Any)
        expected = describe_type(tp, action.choices)
        if value is None:
            if type(None) in _union_args(tp) or action.default is None:
                return None
            raise self.wrong(key, value, expected)
        if isinstance(value, dict):
            if _mentions(tp, dict):
                return value
            raise self.wrong(key, value, expected)
        if isinstance(value, list):
            if action.nargs in ("+", "*"):
                return [self.scalar(key, v, action, expected) for v in value]
            if _mentions(tp, list):
                return value
            raise self.wrong(key, value, expected)
        if action.nargs in ("+", "*"):
            return [self.scalar(key, value, action, expected)]
        return self.scalar(key, value, action, expected)

    def scalar(self, key: str, value: Any, action: argparse.Action, expected: str) -> Any:
        from trl.scripts._hf_argparser import string_to_bool

        convert = action.type or str
        if isinstance(value, bool) and convert is not string_to_bool:
            if key in _BOOL_AS_STRING:
                return str(value).lower()
            raise self.wrong(key, value, expected)
        if convert is string_to_bool and not isinstance(value, (bool, str)):
            raise self.wrong(key, value, expected)
        if convert is int and isinstance(value, float):
            raise self.wrong(key, value, expected)
        if isinstance(value, (list, dict)):
            raise self.wrong(key, value, expected)
        try:
            converted = convert(value if isinstance(value, (str, bool)) else str(value))
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            raise self.wrong(key, value, expected) from None
        if action.choices is not None and converted not in action.choices:
            names = [str(c.value if isinstance(c, Enum) else c) for c in action.choices]
            raise ConfigError(
                f"invalid value for {key!r} in {self.source}: {value!r} is not {expected}{_closest(str(value), names)}"
            )
        return converted


def _other_task_field(name: str, task: str) -> ConfigError | None:
    """The one line for a key of another trainer's config that ``task`` refuses (an SFT-only field given to
    ``trl-padfree dpo``), or None."""
    from .tasks import get_task

    return get_task(task).foreign_field(name)


def _check_config_values(parser: Any, config: dict[str, Any], source: str) -> dict[str, Any]:
    """Reject unknown keys and wrongly typed values of a YAML config; return the values converted."""
    checker = _ValueChecker(parser, source)
    valid = sorted(checker.actions)
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key not in checker.actions:
            if (other := _other_task_field(key, getattr(parser, "padfree_task", "sft"))) is not None:
                raise other
            raise ConfigError(f"unknown key {key!r} in {source}{_closest(key, valid)}")
        out[key] = checker.check(key, value)
    return out


#: ``env:`` may set only variables that a training run reads: these prefixes (Hugging Face libraries, experiment
#: trackers, torch / NCCL / OpenMP tuning).
ENV_PREFIXES = (
    "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "DATASETS_", "TRL_", "ACCELERATE_", "PEFT_",
    "WANDB_", "MLFLOW_", "COMET_", "NEPTUNE_", "CLEARML_", "DVCLIVE_", "AIM_", "SWANLAB_", "TRACKIO_",
    "TENSORBOARD_", "NCCL_", "GLOO_", "TORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_", "PYTORCH_", "CUDA_",
    "OMP_", "MKL_", "KMP_",
)  # fmt: skip
#: Allowed by prefix but read by torch when it looks at the GPUs, which it does before any config is read.
_ENV_GPUS = frozenset({"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"})
#: Allowed by prefix but read once, when huggingface_hub / datasets / transformers / torch are imported, which is
#: before any config is read (they are needed to parse it): set from the config they would silently do nothing.
_ENV_AT_IMPORT = frozenset({
    "HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE", "HF_MODULES_CACHE", "HF_XET_CACHE",
    "TRANSFORMERS_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT",
    "HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS", "HF_HUB_ENABLE_HF_TRANSFER",
    "HF_HUB_DISABLE_XET", "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT", "HF_DEBUG",
    "TRANSFORMERS_VERBOSITY", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
})  # fmt: skip
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _take_env(config: dict[str, Any], source: str) -> dict[str, str]:
    """TRL's convention: an ``env`` mapping in the YAML sets environment variables.

    Checked here (legal names, only :data:`ENV_PREFIXES`, scalar values) and returned; the launcher sets them only
    once the whole config is valid (:func:`~.validate.validate_config`).
    """
    env = config.pop("env", None)
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise ConfigError(f"'env' in {source} must be a mapping of variable names to values, got {_kind(env)}")
    out: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise ConfigError(
                f"env: {name!r} in {source} is not a valid environment variable name (letters, digits and _, not "
                "starting with a digit)"
            )
        if name in _ENV_GPUS or name in _ENV_AT_IMPORT:
            why = ("torch has looked at the GPUs before the config is read" if name in _ENV_GPUS else
                   "it is read when the libraries are imported, before the config is read")
            also = " or use torch_num_threads" if name.endswith("_NUM_THREADS") else ""
            raise ConfigError(
                f"env: {name} in {source} cannot take effect: {why}; set it in the shell instead "
                f"({name}=... trl-padfree train ...){also}"
            )
        if not name.startswith(ENV_PREFIXES):
            raise ConfigError(
                f"env: {name} in {source} is not a variable a training run reads; env may set only "
                f"{', '.join(p + '*' for p in ENV_PREFIXES)}; set other variables in the shell"
            )
        if isinstance(value, (dict, list)) or value is None:
            raise ConfigError(f"env: the value of {name} in {source} must be a string or a number, got {_kind(value)}")
        text = str(value)
        if "\0" in text:
            raise ConfigError(f"env: the value of {name} in {source} contains a NUL character")
        out[name] = text
    return out


def _reject_unknown_flags(parser: Any, remaining: Sequence[str]) -> None:
    """Name the first leftover command-line argument that the parser did not take."""
    if not remaining:
        return
    valid = sorted(a.dest for a in parser._actions if a.option_strings and a.dest != "help")
    first = remaining[0]
    if first.startswith("--"):
        name = first[2:].split("=", 1)[0]
        if (other := _other_task_field(name.removeprefix("no_"), getattr(parser, "padfree_task", "sft"))) is not None:
            raise other
        raise ConfigError(f"unknown option '--{name}' on the command line{_closest(name, valid)}")
    raise ConfigError(f"unexpected argument {first!r} on the command line; options look like --field value")


def cpu_for_several_processes(world_size: int, cuda_available: bool, explicit: frozenset[str] | set[str]) -> bool:
    """Whether to default ``use_cpu: true``: several processes started by a launcher (``WORLD_SIZE`` > 1) on a
    machine without a usable GPU, and ``use_cpu`` not set by the user. Without it accelerate and the Trainer build
    no process group on such a machine, and each process would train its own copy (the launch refuses that).

    >>> cpu_for_several_processes(2, False, set()), cpu_for_several_processes(2, True, set())
    (True, False)
    >>> cpu_for_several_processes(1, False, set()), cpu_for_several_processes(2, False, {"use_cpu"})
    (False, False)
    """
    return world_size > 1 and not cuda_available and "use_cpu" not in explicit


CPU_FOR_SEVERAL_PROCESSES_NOTE = (
    "use_cpu: true (several processes on a machine without a GPU: they train as one DDP run over gloo; set use_cpu "
    "to choose)"
)


def parse_arguments(argv: Sequence[str], prog: str = "trl-padfree train", task: str = "sft") -> LaunchConfig:
    """Parse ``[--config FILE] [--field value ...]`` into a :class:`LaunchConfig` (no validation beyond types).

    Raises :class:`ConfigError` for an unknown key, a wrongly typed value, a missing or malformed config file,
    and for errors raised by the dataclasses' own checks (e.g. ``SFTConfig``'s).
    """
    from .tasks import get_task

    config_path, args = split_config_flag(argv)
    parser = build_parser(prog, task)
    env: dict[str, str] = {}
    explicit = {a[2:].split("=", 1)[0].removeprefix("no_") for a in args if a.startswith("--")}
    if config_path is not None:
        config = read_yaml_config(config_path)
        explicit.update(config)
        env = _take_env(config, config_path)
        config = _check_config_values(parser, config, config_path)
        parser.set_defaults_with_config(**config)
    notes = []
    world_size = int(os.environ.get("WORLD_SIZE", "1")) if os.environ.get("WORLD_SIZE", "1").isdigit() else 1
    if world_size > 1 and "use_cpu" not in explicit:  # (as launch.distributed.launcher_world_size reads it)
        import torch

        if cpu_for_several_processes(world_size, torch.cuda.is_available(), explicit):
            parser.set_defaults(use_cpu=True)
            notes.append(CPU_FOR_SEVERAL_PROCESSES_NOTE)
    try:
        *parsed, remaining = parser.parse_args_into_dataclasses(args=args, return_remaining_strings=True)
    except RefusedElsewhere:  # raised while the process group formed (parsing SFTConfig creates it)
        raise
    except ConfigError as exc:
        raise ConfigError(f"command line: {exc}") from None
    except (ValueError, TypeError) as exc:  # raised by a dataclass's __post_init__
        message = one_line(exc, limit=None)
        if "bf16/gpu" in message:
            message = (
                "bf16: true needs a GPU with bfloat16 support and this machine has none; set bf16: false "
                "(or use_cpu: true for bfloat16 autocast on the CPU)"
            )
        raise ConfigError(f"invalid settings: {message}") from None
    _reject_unknown_flags(parser, remaining)
    data, collator, launch, training, model = parsed
    collator = get_task(task).parsed(collator)
    return LaunchConfig(
        task=task,
        data=data,
        collator=collator,
        launch=launch,
        training=training,
        model=model,
        config_path=config_path,
        padding_free=bool(getattr(training, "padding_free", getattr(collator, "padding_free", True))),
        attn_implementation=model.attn_implementation or "auto",
        resume_from_checkpoint=training.resume_from_checkpoint,
        explicit=frozenset(explicit),
        env=env,
        notes=notes,
    )
