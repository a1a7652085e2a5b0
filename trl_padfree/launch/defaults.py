"""Run-time defaults of the fields left unset, from the machine and the model (docs/usage.md): activation
checkpointing on CUDA for models of 1e9 parameters or more, ``torch_num_threads`` (:mod:`trl_padfree.threads`),
no pinned memory on the CPU, no progress bars when the output is not a terminal."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from typing import Any

from ..threads import HIDDEN_PER_THREAD, cores, processes_on_this_machine, threads_default
from .config import LaunchConfig, with_fields

__all__ = [
    "HIDDEN_PER_THREAD",
    "LARGE_MODEL_PARAMETERS",
    "ModelShape",
    "apply_defaults",
    "checkpointing_default",
    "threads_default",
]

#: Models with at least this many parameters are "large": activation checkpointing is on by default on CUDA.
LARGE_MODEL_PARAMETERS = 1_000_000_000


@dataclass(frozen=True)
class ModelShape:

    hidden_size: int | None = None
    parameters: int | None = None


def checkpointing_default(device: str, parameters: int | None) -> bool:
    """Whether activation checkpointing pays: CUDA and a model of at least 1e9 parameters.

    >>> checkpointing_default("cuda", 7_000_000_000), checkpointing_default("cuda", 500_000_000)
    (True, False)
    >>> checkpointing_default("cpu", 7_000_000_000), checkpointing_default("cuda", None)
    (False, False)
    """
    return device == "cuda" and parameters is not None and parameters >= LARGE_MODEL_PARAMETERS


def model_shape(cfg: LaunchConfig, count_parameters: bool) -> ModelShape:
    """Hidden size (and, when asked, the parameter count, on the meta device) from the model's config, or None."""
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(
            cfg.model.model_name_or_path,
            revision=cfg.model.model_revision,
            trust_remote_code=cfg.training.trust_remote_code,
        )
    except Exception:  # the model's own loading reports the problem later, with context
        return ModelShape()
    text = getattr(config, "get_text_config", lambda: config)()
    hidden = getattr(text, "hidden_size", None)
    parameters = None
    if count_parameters:
        try:
            import torch
            from transformers import AutoModelForCausalLM

            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config, trust_remote_code=cfg.training.trust_remote_code)
            parameters = sum(p.numel() for p in model.parameters())
        except Exception:
            parameters = None
    return ModelShape(hidden_size=hidden if isinstance(hidden, int) else None, parameters=parameters)


def apply_defaults(cfg: LaunchConfig, device: str | None = None, shape: ModelShape | None = None
                   ) -> tuple[LaunchConfig, dict[str, Any]]:
    """``(cfg with its unset machine-dependent fields filled, what was chosen)``; ``device``: ``"cuda"`` or
    ``"cpu"`` (default: the run's); ``shape``: read from the model's config when not given."""
    if device is None:
        from .validate import training_device

        device = training_device(cfg)
    explicit = cfg.explicit
    chosen: dict[str, Any] = {}
    wants_checkpointing = not ({"activation_checkpointing", "gradient_checkpointing"} & explicit)
    wants_threads = cfg.training.torch_num_threads == "auto" and not os.environ.get("OMP_NUM_THREADS")
    if shape is None and (wants_threads or wants_checkpointing):
        shape = model_shape(cfg, count_parameters=wants_checkpointing and device == "cuda")
    shape = shape or ModelShape()
    training: dict[str, Any] = {}  # the changes of TRL's config
    if wants_checkpointing:
        on = checkpointing_default(device, shape.parameters)
        training["activation_checkpointing"] = training["gradient_checkpointing"] = on  # (TRL reads the old name)
        chosen["activation_checkpointing"] = on
    if wants_threads:
        chosen["torch_num_threads"] = threads_default(device, shape.hidden_size, cores(), processes_on_this_machine())
        training["torch_num_threads"] = chosen["torch_num_threads"]
    elif cfg.training.torch_num_threads == "auto":  # OMP_NUM_THREADS chose
        training["torch_num_threads"] = None
    if "disable_tqdm" not in explicit and not (sys.stdout.isatty() and sys.stderr.isatty()):
        training["disable_tqdm"] = chosen["disable_tqdm"] = True
    if device == "cpu" and "dataloader_pin_memory" not in explicit:
        training["dataloader_pin_memory"] = chosen["dataloader_pin_memory"] = False
    return replace(cfg, training=with_fields(cfg.training, **training)), chosen
