"""Static checks of a parsed :class:`~trl_padfree.launch.config.LaunchConfig`, before anything is loaded.

Each check raises :class:`~trl_padfree.launch.config.ConfigError` with one line that says what is wrong and how
to fix it. Checks that depend on this machine (CUDA, flash-attn, installed packages) can be skipped with
``check_environment=False``, which is how the shipped real-model configs are tested on a CPU-only machine.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from typing import Any

from .config import ConfigError, LaunchConfig

__all__ = ["DATA_EXTENSIONS", "data_builder", "resolve_attn_implementation", "validate_config"]

#: Local data formats and the ``datasets`` builder that reads each.
DATA_EXTENSIONS: dict[str, str] = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}

_FLASH = "flash_attention_2"


def data_builder(path: str) -> str:
    """The ``datasets`` builder name for a local data file (by extension).

    >>> data_builder("data/train.jsonl"), data_builder("x.parquet")
    ('json', 'parquet')
    """
    ext = os.path.splitext(path)[1].lower()
    if ext not in DATA_EXTENSIONS:
        raise ConfigError(
            f"unsupported data file {path!r}: use one of {', '.join(DATA_EXTENSIONS)} (or dataset_name for a hub "
            "dataset or a local dataset directory)"
        )
    return DATA_EXTENSIONS[ext]


def _check_data_file(key: str, pattern: str) -> None:
    data_builder(pattern)
    if not glob.glob(os.path.expanduser(pattern)):
        raise ConfigError(
            f"data file not found: {key}={pattern!r} (relative paths start at the current directory {os.getcwd()})"
        )


def _looks_local(name: str) -> bool:
    """A model/dataset name that can only be a local path (hub ids are ``name`` or ``owner/name``)."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


def _check_data(cfg: LaunchConfig) -> None:
    data = cfg.data
    for key in ("train_file", "eval_file", "dataset_name", "dataset_config", "dataset_test_split", "template"):
        if getattr(data, key) == "":  # `--eval_file ""` on the command line switches a file off
            setattr(data, key, None)
    if data.train_file and data.dataset_name:
        raise ConfigError("set either train_file (local files) or dataset_name (hub or local dataset), not both")
    if not data.train_file and not data.dataset_name:
        raise ConfigError("no training data: set train_file (a local .jsonl/.json/.csv/.parquet) or dataset_name")
    if data.train_file:
        _check_data_file("train_file", data.train_file)
    if data.dataset_name and _looks_local(data.dataset_name) and not os.path.exists(data.dataset_name):
        raise ConfigError(f"dataset not found: dataset_name={data.dataset_name!r} is not an existing local path")
    if data.eval_file:
        _check_data_file("eval_file", data.eval_file)
    if data.eval_fraction is not None and not 0.0 < data.eval_fraction < 1.0:
        raise ConfigError(f"eval_fraction must be between 0 and 1 (exclusive), got {data.eval_fraction}")
    sources = [k for k in ("eval_file", "eval_fraction", "dataset_test_split") if getattr(data, k) is not None]
    if len(sources) > 1:
        raise ConfigError(f"set only one source of eval data, got {' and '.join(sources)}")
    if data.dataset_test_split is not None and not data.dataset_name:
        raise ConfigError("dataset_test_split needs dataset_name; for local files use eval_file or eval_fraction")
    strategy = getattr(cfg.training.eval_strategy, "value", cfg.training.eval_strategy)
    if strategy != "no" and not sources:
        raise ConfigError(
            f"eval_strategy is {strategy!r} but there is no eval data: set eval_file, "
            "eval_fraction or dataset_test_split (or eval_strategy: 'no')"
        )
    for key in ("max_train_examples", "max_eval_examples"):
        value = getattr(data, key)
        if value is not None and value < 1:
            raise ConfigError(f"{key} must be at least 1, got {value}")


def _check_collator_and_trl(cfg: LaunchConfig) -> None:
    training = cfg.training
    if not cfg.collator.response_template:
        if cfg.data.template is not None:
            raise ConfigError(
                "response_template is missing: set the text that precedes every completion, e.g. '### Answer:'"
            )
        cfg.collator.response_template = None  # allowed for prompt/completion data only (checked by launch.data)
    if cfg.launch.template_check_examples < 1:
        raise ConfigError(f"template_check_examples must be at least 1, got {cfg.launch.template_check_examples}")
    threads = cfg.launch.torch_num_threads
    if threads is not None and threads < 1:
        raise ConfigError(f"torch_num_threads must be at least 1 (or null for torch's default), got {threads}")
    if training.packing:
        raise ConfigError(
            "packing is not supported by trl-padfree train: padding_free: true already removes padding and keeps "
            "the number of optimizer steps; set packing: false"
        )
    if training.assistant_only_loss:
        raise ConfigError(
            "assistant_only_loss does not apply here: the collator trains what follows response_template; for "
            "multi-turn data also set instruction_template; set assistant_only_loss: false"
        )
    if training.max_length is not None and training.max_length < 2:
        raise ConfigError(f"max_length must be at least 2 (or null for no truncation), got {training.max_length}")
    if training.dataloader_num_workers and training.dataloader_num_workers < 0:
        raise ConfigError(f"dataloader_num_workers must be >= 0, got {training.dataloader_num_workers}")


def _check_model(cfg: LaunchConfig, check_environment: bool) -> None:
    name = cfg.model.model_name_or_path
    if not name:
        raise ConfigError("model_name_or_path is missing: set a local model directory or a hub model id")
    if not os.path.exists(os.path.expanduser(name)) and _looks_local(name):
        raise ConfigError(
            f"model not found: model_name_or_path={name!r} is not an existing directory "
            f"(relative paths start at {os.getcwd()})"
        )
    if check_environment and cfg.model.use_peft and importlib.util.find_spec("peft") is None:
        raise ConfigError("use_peft: true needs the peft package: pip install peft")
    quantized = cfg.model.load_in_4bit or cfg.model.load_in_8bit
    if quantized and not cfg.model.use_peft:
        raise ConfigError("load_in_4bit/load_in_8bit train only LoRA adapters: also set use_peft: true")
    if check_environment and quantized and importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError("load_in_4bit/load_in_8bit need the bitsandbytes package and a CUDA GPU")


def _training_device(cfg: LaunchConfig) -> str:
    import torch

    return "cuda" if torch.cuda.is_available() and not cfg.training.use_cpu else "cpu"


def resolve_attn_implementation(requested: str, device: str) -> str:
    """``"auto"`` -> the best implementation for ``device``; ``"flash_attention_2"`` only where it can run.

    >>> resolve_attn_implementation("auto", "cpu")
    'padfree'
    >>> resolve_attn_implementation("sdpa", "cpu")
    'sdpa'
    """
    from trl_padfree.attention import pick_attn_implementation

    if requested == "auto":
        return pick_attn_implementation(device)
    if requested == _FLASH:
        from trl_padfree.attention import flash_attn_available

        if device != "cuda":
            raise ConfigError(
                "attn_implementation 'flash_attention_2' needs a CUDA GPU and this run has none (no GPU, or "
                "use_cpu: true); use attn_implementation: auto (picks 'padfree' here) or 'padfree'"
            )
        if not flash_attn_available():
            raise ConfigError(
                "attn_implementation 'flash_attention_2' needs the flash-attn package, which is not usable here "
                "(pip install flash-attn --no-build-isolation); or use attn_implementation: auto / 'padfree'"
            )
    return requested


def _check_resume(cfg: LaunchConfig) -> None:
    from transformers.trainer_utils import get_last_checkpoint

    value = cfg.resume_from_checkpoint
    if value is None or value is False:
        cfg.resume_from_checkpoint = None
        return
    output_dir = cfg.training.output_dir
    if isinstance(value, bool) or str(value).lower() in {"true", "last", "latest"}:
        last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
        if last is None:
            raise ConfigError(
                f"resume_from_checkpoint: {value!r} but {output_dir!r} holds no checkpoint-N directory; "
                "pass a checkpoint path or start without resume_from_checkpoint"
            )
        cfg.resume_from_checkpoint = last
    elif str(value).lower() in {"false", "none", "null", ""}:
        cfg.resume_from_checkpoint = None
    elif not os.path.isdir(value):
        raise ConfigError(f"checkpoint not found: resume_from_checkpoint={value!r} is not a directory")
    else:
        cfg.resume_from_checkpoint = str(value)


def validate_config(cfg: LaunchConfig, check_environment: bool = True) -> LaunchConfig:
    """Check ``cfg`` without loading anything and resolve what the run will use (in place; returns ``cfg``).

    Resolves ``attn_implementation`` (``"auto"`` -> ``"flash_attention_2"`` where usable, else ``"padfree"``),
    moves ``padding_free`` from ``SFTConfig`` to the collator (TRL's flag is set to False), turns
    ``resume_from_checkpoint: true``/``last`` into the latest checkpoint of ``output_dir``, and tells
    ``SFTTrainer`` to take the already-tokenized datasets as they are. With ``check_environment=False``
    the checks that depend on this machine (CUDA, flash-attn, optional packages, existing checkpoints)
    are skipped and ``"auto"`` is left unresolved.
    """
    _check_data(cfg)
    _check_collator_and_trl(cfg)
    _check_model(cfg, check_environment)
    training = cfg.training
    cfg.padding_free = bool(training.padding_free)
    training.padding_free = False  # the collator flattens by itself; TRL refuses a custom collator otherwise
    training.dataset_kwargs = {**(training.dataset_kwargs or {}), "skip_prepare_dataset": True}
    if check_environment:
        cfg.attn_auto = cfg.attn_implementation == "auto"
        cfg.attn_implementation = resolve_attn_implementation(cfg.attn_implementation, _training_device(cfg))
        cfg.model.attn_implementation = cfg.attn_implementation
        _check_resume(cfg)
    return cfg


def describe(cfg: LaunchConfig) -> dict[str, Any]:
    """A short summary of the resolved run (logged at start)."""
    return {
        "model": cfg.model.model_name_or_path,
        "attn_implementation": cfg.attn_implementation,
        "dtype": cfg.model.dtype,
        "padding_free": cfg.padding_free,
        "peft": bool(cfg.model.use_peft),
        "device": _training_device(cfg),
        "bf16": bool(cfg.training.bf16),
        "activation_checkpointing": bool(cfg.training.activation_checkpointing),
        "torch_num_threads": cfg.launch.torch_num_threads or os.environ.get("OMP_NUM_THREADS") or "torch default",
        "output_dir": cfg.training.output_dir,
    }
