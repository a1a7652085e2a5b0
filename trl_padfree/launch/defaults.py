"""Run-time defaults of the fields left unset, from the machine and the model (docs/usage.md): activation
checkpointing on CUDA for models of 1e9 parameters or more, ``torch_num_threads`` (:mod:`trl_padfree.threads`),
no pinned memory on the CPU, no progress bars when the output is not a terminal."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, NamedTuple

import torch

from ..threads import cores, processes_on_this_machine, threads_default
from .config import ConfigError, LaunchConfig

LARGE_MODEL_PARAMETERS = 1_000_000_000  # from this size activation checkpointing is on by default on CUDA


class ModelShape(NamedTuple):
    hidden_size: int | None = None
    parameters: int | None = None


def model_shape(cfg: LaunchConfig, count_parameters: bool) -> ModelShape:
    """Hidden size (and, when asked, the parameter count, on the meta device) from the model's config, or None."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from .model import load_pretrained

    try:
        config = load_pretrained(AutoConfig, cfg, "read the model config")
    except ConfigError:  # the model's own loading reports the problem later, with context
        return ModelShape()
    hidden, parameters = getattr(config.get_text_config(), "hidden_size", None), None
    if count_parameters:  # (on failure no count: no default from the model's size)
        with contextlib.suppress(Exception), torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=cfg.training.trust_remote_code)
            parameters = sum(p.numel() for p in model.parameters())
    return ModelShape(hidden if isinstance(hidden, int) else None, parameters)


def apply_defaults(cfg: LaunchConfig, device: str | None = None, shape: ModelShape | None = None
                   ) -> tuple[LaunchConfig, dict[str, Any]]:
    """``(cfg with its unset machine-dependent fields filled, what was chosen)``; ``device``: ``"cuda"`` or
    ``"cpu"`` (default: the run's); ``shape``: read from the model's config when not given."""
    from .validate import training_device

    device, explicit, threads = device or training_device(cfg), cfg.explicit, cfg.training.torch_num_threads
    wants_checkpointing = not ({"activation_checkpointing", "gradient_checkpointing"} & explicit)
    wants_threads = threads == "auto" and not os.environ.get("OMP_NUM_THREADS")  # (else OMP_NUM_THREADS chose)
    if shape is None and (wants_threads or wants_checkpointing):
        shape = model_shape(cfg, count_parameters=wants_checkpointing and device == "cuda")
    shape, chosen = shape or ModelShape(), {}
    if wants_checkpointing:
        chosen["activation_checkpointing"] = device == "cuda" and (shape.parameters or 0) >= LARGE_MODEL_PARAMETERS
    if wants_threads:
        chosen["torch_num_threads"] = threads_default(device, shape.hidden_size, cores(), processes_on_this_machine())
    if "disable_tqdm" not in explicit and not (sys.stdout.isatty() and sys.stderr.isatty()):
        chosen["disable_tqdm"] = True
    if device == "cpu" and "dataloader_pin_memory" not in explicit:
        chosen["dataloader_pin_memory"] = False
    for name, value in chosen.items():
        setattr(cfg.training, name, value)
    if wants_checkpointing:
        cfg.training.gradient_checkpointing = chosen["activation_checkpointing"]  # (TRL reads the old name)
    if threads == "auto" and not wants_threads:
        cfg.training.torch_num_threads = None
    return cfg, chosen
