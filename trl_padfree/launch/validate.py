"""Checks of a parsed :class:`~.config.LaunchConfig` before anything is loaded, each a one-line
:class:`~.config.ConfigError` naming the fix (the list, and the faults during a run: ``docs/faults.md``).
``check_environment=False`` skips what depends on this machine (CUDA, flash-attn, packages, the filesystem)."""

from __future__ import annotations

import glob
import importlib.util
import math
import os
import re
import tempfile
from collections.abc import Sequence
from typing import Any, NamedTuple

from ..exception_text import one_line
from .config import ConfigError, LaunchConfig, did_you_mean
from .data import data_builder


class Range(NamedTuple):
    """The legal values of a numeric field: ``low`` (``>`` when ``low_open``) up to ``high`` (``<`` when
    ``high_open``); ``hint``: what else the field accepts (test_launch_config refuses one value of each kind)."""

    low: float
    low_open: bool = False
    high: float | None = None
    high_open: bool = False
    hint: str = ""

    def admits(self, value: float) -> bool:
        return math.isfinite(value) and (value > self.low if self.low_open else value >= self.low) and (
            self.high is None or (value < self.high if self.high_open else value <= self.high))

    def text(self) -> str:
        text = f"{'greater than' if self.low_open else 'at least'} {self.low}"
        return text if self.high is None else f"{text} and {'less than' if self.high_open else 'at most'} {self.high}"


_SEED, _STEPS, _NULL = 2**32 - 1, "a number of steps, or a fraction of the run below 1", "or null"
#: Numeric fields that nothing upstream refuses before training (torch fails at the first step, or the run goes
#: wrong); null passes where the field allows it. A recipe adds its own (its ``RANGES``).
NUMERIC_RANGES: dict[str, Range] = {
    **dict.fromkeys(("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
                     "ddp_timeout", "max_train_examples", "max_eval_examples", "template_check_examples",
                     "ref_model_sync_steps"), Range(1)),
    **dict.fromkeys(("learning_rate", "weight_decay", "adam_epsilon", "eval_delay", "dataloader_num_workers"),
                    Range(0)),
    **dict.fromkeys(("adam_beta1", "adam_beta2", "label_smoothing_factor"), Range(0, high=1, high_open=True)),
    **dict.fromkeys(("logging_steps", "save_steps"), Range(0, True, hint=_STEPS)),
    **dict.fromkeys(("beta", "discopop_tau", "desirable_weight", "undesirable_weight"), Range(0, True)),
    **dict.fromkeys(("dataloader_prefetch_factor", "ddp_bucket_cap_mb"), Range(1, hint="or null for torch's default")),
    "eval_accumulation_steps": Range(1, hint="or null to gather eval outputs once at the end"),
    "max_grad_norm": Range(0, hint="0 turns gradient clipping off"),
    "neftune_noise_alpha": Range(0, True, hint="or null for no NEFTune noise"),
    "eval_steps": Range(0, True, hint="or null to evaluate every logging_steps"),
    "save_total_limit": Range(1, hint="or null to keep every checkpoint"),
    "seed": Range(0, high=_SEED),
    "data_seed": Range(0, high=_SEED, hint="or null to use seed"),
    "router_aux_loss_coef": Range(0, hint=_NULL),
    "dataset_num_proc": Range(1, hint="or null for one process"),
    "max_length": Range(2, hint="or null for no truncation"),
    "pad_to_multiple_of": Range(1, hint=_NULL),
    "eval_fraction": Range(0, True, 1, True),
    "ld_alpha": Range(0, high=1, hint="or null for plain sums"),
    "label_smoothing": Range(0, high=0.5, high_open=True),
    "precompute_ref_batch_size": Range(1, hint="or null for per_device_train/eval_batch_size"),
    "ref_model_mixup_alpha": Range(0, high=1),
    "center_rewards_coefficient": Range(0, hint="or null for none; TRL suggests 0.01"),
}
#: Step intervals that matter only under their strategy ("steps").
_INTERVAL_STRATEGY = {"logging_steps": "logging_strategy", "eval_steps": "eval_strategy", "save_steps": "save_strategy"}


def _check_numbers(cfg: LaunchConfig) -> None:
    from .tasks import get_task

    for name, legal in {**NUMERIC_RANGES, **getattr(get_task(cfg.task), "RANGES", {})}.items():
        value = next((getattr(p, name) for p in (cfg.training, cfg.model, cfg.launch) if hasattr(p, name)), None)
        strategy = getattr(cfg.training, _INTERVAL_STRATEGY.get(name, ""), "steps")
        if (isinstance(value, (int, float)) and not isinstance(value, bool) and not legal.admits(value)
                and getattr(strategy, "value", strategy) == "steps"):
            raise ConfigError(f"{name} must be {legal.text()}{f' ({legal.hint})' if legal.hint else ''}, got {value}")
    steps, epochs = cfg.training.max_steps, cfg.training.num_train_epochs
    if steps == 0 or steps < -1:
        raise ConfigError(f"max_steps must be at least 1 (or -1 to train for num_train_epochs), got {steps}")
    if steps == -1 and not (math.isfinite(epochs) and epochs > 0):
        raise ConfigError(f"num_train_epochs must be greater than 0 (or set max_steps to a number of steps), got "
                          f"{epochs}")


def check_attn_implementation(attn: str, own: Sequence[str] = ("auto",)) -> None:
    """A :class:`ConfigError` with a did-you-mean unless transformers knows ``attn`` (``padfree`` included), it is one
    of ``own`` or a hub kernel ``owner/repo`` (transformers refuses a misspelt name only when the model loads)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    import trl_padfree.attention  # noqa: F401  (registers "padfree")

    known = [*own, "eager", *sorted(k for k in ALL_ATTENTION_FUNCTIONS.valid_keys() if "|" not in k)]  # (paged|eager)
    if attn.removeprefix("paged|") not in known and "/" not in attn:
        raise ConfigError(f"attn_implementation {attn!r} is not one of {', '.join(known)} (or a hub kernel "
                          f"'owner/repo'){did_you_mean(attn, known)}")


def _check_names(cfg: LaunchConfig) -> None:
    """``attn_implementation`` and ``report_to``, which fail only when the model loads or the trainer is built."""
    from transformers.integrations import INTEGRATION_TO_CALLBACK

    check_attn_implementation(cfg.attn_implementation)
    report, known = cfg.training.report_to, [*INTEGRATION_TO_CALLBACK, "all", "none"]
    for name in [report] if isinstance(report, str) else report or []:
        if name not in known:
            raise ConfigError(f"report_to {name!r} is not one of {', '.join(known)}{did_you_mean(name, known)}")


#: ``model_init_kwargs`` keys that the launcher sets from fields of its own (the field to use instead).
_OWN_FIELDS = {"trust_remote_code": "trust_remote_code: true", "attn_implementation": "attn_implementation",
               "dtype": "dtype", "torch_dtype": "dtype", "revision": "model_revision",
               "quantization_config": "load_in_4bit / load_in_8bit"}


def _check_model_init_kwargs(cfg: LaunchConfig) -> None:
    """The launcher loads the model and applies these (TRL would only warn that it ignores them)."""
    kwargs = cfg.training.model_init_kwargs
    if kwargs is None:
        return
    if not isinstance(kwargs, dict):
        raise ConfigError(f"model_init_kwargs must be a mapping of from_pretrained arguments, got {kwargs!r}")
    for key in kwargs.keys() & _OWN_FIELDS.keys():
        raise ConfigError(f"model_init_kwargs may not set {key!r}: it has its own field; set {_OWN_FIELDS[key]} "
                          "instead")
    cfg.model_init_kwargs, cfg.training.model_init_kwargs = dict(kwargs), None


def _check_output_dir(out: str) -> None:
    """A writable directory, or one that can be created in a writable one (nothing is created)."""
    path = parent = os.path.abspath(os.path.expanduser(out))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        what = "is a file, not a directory" if parent == path else f"cannot be created: {parent!r} is a file"
        raise ConfigError(f"output_dir {out!r} {what}; choose another output_dir")
    try:
        tempfile.TemporaryFile(dir=parent).close()  # (unnamed where the filesystem allows, gone once closed)
    except OSError as exc:
        where = "is not writable" if parent == path else f"cannot be created in {parent!r}"
        raise ConfigError(f"output_dir {out!r} {where} ({exc.strerror or exc}); choose a directory you can write to"
                          ) from None


def _looks_local(name: str) -> bool:
    """A model/dataset name that can only be a local path (hub ids are ``name`` or ``owner/name``)."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


def _check_data(cfg: LaunchConfig) -> None:
    data = cfg.launch
    for key in ("train_file", "eval_file", "dataset_name", "dataset_config", "dataset_test_split", "template"):
        if getattr(data, key, None) == "":  # `--eval_file ""` on the command line switches a file off
            setattr(data, key, None)
    if data.train_file and data.dataset_name:
        raise ConfigError("set either train_file (local files) or dataset_name (hub or local dataset), not both")
    if not data.train_file and not data.dataset_name:
        raise ConfigError("no training data: set train_file (a local .jsonl/.json/.csv/.parquet) or dataset_name")
    if data.dataset_name and _looks_local(data.dataset_name) and not os.path.exists(data.dataset_name):
        raise ConfigError(f"dataset not found: dataset_name={data.dataset_name!r} is not an existing local path")
    for key in ("train_file", "eval_file"):
        pattern = getattr(data, key)
        if pattern and data_builder(pattern) and not glob.glob(os.path.expanduser(pattern)):  # (builder: the extension)
            raise ConfigError(f"data file not found: {key}={pattern!r} (relative paths start at the current "
                              f"directory {os.getcwd()})")
    sources = [k for k in ("eval_file", "eval_fraction", "dataset_test_split") if getattr(data, k) is not None]
    if len(sources) > 1:
        raise ConfigError(f"set only one source of eval data, got {' and '.join(sources)}")
    if data.dataset_test_split is not None and not data.dataset_name:
        raise ConfigError("dataset_test_split needs dataset_name; for local files use eval_file or eval_fraction")
    strategy = getattr(cfg.training.eval_strategy, "value", cfg.training.eval_strategy)
    for setting, on, off in ((f"eval_strategy is {strategy!r}", strategy != "no", "eval_strategy: 'no'"),
                             ("eval_on_start is true", cfg.training.eval_on_start, "eval_on_start: false")):
        if on and not sources:
            raise ConfigError(f"{setting} but there is no eval data: set eval_file, eval_fraction or "
                              f"dataset_test_split (or {off})")


def _check_model(cfg: LaunchConfig, check_environment: bool) -> None:
    name, model = cfg.model.model_name_or_path, cfg.model
    if not name:
        raise ConfigError("model_name_or_path is missing: set a local model directory or a hub model id")
    if not os.path.exists(os.path.expanduser(name)) and _looks_local(name):
        raise ConfigError(f"model not found: model_name_or_path={name!r} is not an existing directory (relative paths "
                          f"start at {os.getcwd()})")
    quantized = model.load_in_4bit or model.load_in_8bit
    if quantized and not model.use_peft:
        raise ConfigError("load_in_4bit/load_in_8bit train only LoRA adapters: also set use_peft: true")
    if check_environment and quantized and importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError("load_in_4bit/load_in_8bit need the bitsandbytes package and a CUDA GPU")
    targets = model.lora_target_modules
    if isinstance(targets, str) and targets != "all-linear" and re.fullmatch(r"[\w.]+", targets):
        # TRL turns a list of one name into a string, which peft reads as a regular expression over full module
        # names ("q_proj" then matches nothing); one name means what a list of names means: a module-name suffix
        model.lora_target_modules = [targets]
    if model.use_peft:
        from trl import get_peft_config

        try:  # TRL's (peft installed) and peft's checks of the LoRA settings, now rather than when the trainer is built
            get_peft_config(cfg.model)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"invalid LoRA settings (peft.LoraConfig): {one_line(exc, limit=None)}") from None


def training_device(cfg: LaunchConfig) -> str:
    """``"cuda"`` when a GPU is there and ``use_cpu`` is off, else ``"cpu"``."""
    import torch

    return "cuda" if torch.cuda.is_available() and not cfg.training.use_cpu else "cpu"


def resolve_attn_implementation(requested: str, device: str) -> str:
    """``"auto"`` -> the best implementation for ``device``; ``"flash_attention_2"`` only where it can run.

    >>> resolve_attn_implementation("auto", "cpu"), resolve_attn_implementation("sdpa", "cpu")
    ('padfree', 'sdpa')
    """
    from trl_padfree.attention import flash_attn_available, pick_attn_implementation

    if requested == "auto":
        return pick_attn_implementation(device)
    if requested == "flash_attention_2" and device != "cuda":
        raise ConfigError("attn_implementation 'flash_attention_2' needs a CUDA GPU and this run has none (no GPU, or "
                          "use_cpu: true); use attn_implementation: auto (picks 'padfree' here) or 'padfree'")
    if requested == "flash_attention_2" and not flash_attn_available():
        raise ConfigError("attn_implementation 'flash_attention_2' needs the flash-attn package, which is not usable "
                          "here (pip install flash-attn --no-build-isolation); or use attn_implementation: auto / "
                          "'padfree'")
    return requested


def validate_config(cfg: LaunchConfig, check_environment: bool = True) -> LaunchConfig:
    """Check ``cfg`` without loading anything and resolve it in place (returned): the recipe's ``check``,
    ``model_init_kwargs`` moved to the launcher and, with ``check_environment``, ``attn_implementation: auto``,
    ``output_dir``, ``resume_from_checkpoint`` and the run id."""
    from .resume import resolve_resume
    from .tasks import get_task

    _check_numbers(cfg)
    _check_names(cfg)
    _check_data(cfg)
    getattr(get_task(cfg.task), "check", lambda cfg: None)(cfg)  # the trainer's own settings (launch.tasks)
    if getattr(cfg.training, "prompt_once", False):  # (DPO, KTO, reward, GRPO): auto is pinned to padfree
        if cfg.attn_implementation not in ("auto", "padfree"):
            raise ConfigError(f"prompt_once: true needs attn_implementation 'padfree' (it alone reads the shared "
                              f"prompt keys), got {cfg.attn_implementation!r}: use auto or padfree")
        cfg.model.attn_implementation = "padfree"
    _check_model(cfg, check_environment)
    _check_model_init_kwargs(cfg)
    if not isinstance(cfg.training.output_dir, str) or not cfg.training.output_dir.strip():
        raise ConfigError("output_dir is empty: set the directory for checkpoints and the model, e.g. outputs/run1")
    if cfg.training.ddp_find_unused_parameters is None:
        # transformers' default: an extra autograd pass per step and a warning; the models trained here use every
        # trainable parameter in each forward (one that does not fails in DDP with torch's error naming the fix)
        cfg.training.ddp_find_unused_parameters = False
    if check_environment:
        cfg.attn_auto = cfg.attn_implementation == "auto"
        cfg.model.attn_implementation = resolve_attn_implementation(cfg.attn_implementation, training_device(cfg))
        _check_output_dir(cfg.training.output_dir)
        restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
        cfg.training.resume_from_checkpoint, cfg.run_id, note = resolve_resume(cfg, restart)
        cfg.notes += [note] if note else []
    return cfg


def describe(cfg: LaunchConfig) -> dict[str, Any]:
    """The run line's fields (logged at start)."""
    from .steps import prompt_once_settings, scored_head
    from .tasks import get_task

    threads = cfg.training.torch_num_threads
    return {
        "model": cfg.model.model_name_or_path,
        **({"trust_remote_code": True} if cfg.training.trust_remote_code else {}),
        "attn_implementation": cfg.attn_implementation, "dtype": cfg.model.dtype, "padding_free": cfg.padding_free,
        **getattr(get_task(cfg.task), "settings", prompt_once_settings)(cfg),
        "peft": bool(cfg.model.use_peft), "device": training_device(cfg), "bf16": bool(cfg.training.bf16),
        "activation_checkpointing": bool(cfg.training.activation_checkpointing),
        "torch_num_threads": (threads if threads != "auto" else None) or os.environ.get("OMP_NUM_THREADS")
        or "torch default",
        **scored_head(cfg),  # where the recipe's trainer has an LM head
        "output_dir": cfg.training.output_dir,
    }
