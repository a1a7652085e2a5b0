"""Run-time defaults of ``trl-padfree train`` that depend on the machine and the model.

A field set in the YAML file or on the command line always wins; these apply only to fields left unset:

- ``activation_checkpointing`` (TRL's ``gradient_checkpointing`` defaults to True for everyone): on only where it
  pays, i.e. training on CUDA a *large* model, one of at least :data:`LARGE_MODEL_PARAMETERS` (1e9) parameters,
  where the activations of long sequences compete with the weights and optimizer states for GPU memory. Off on
  CPU (memory is rarely the limit there, and recomputing every layer costs ~30% more time) and for smaller models.
- ``torch_num_threads``: on CUDA, the cores of this machine (torch's default count, within the CPU affinity)
  divided by the processes on it (torch would give each process every core); on CPU, additionally one thread per :data:`HIDDEN_PER_THREAD` (256) units of the model's
  hidden size, since the matrices of small models are too small to split across threads (the demo model,
  hidden size 128, trains 10x faster on 1 thread than on 2 on a busy 2-core machine). ``OMP_NUM_THREADS`` set in
  the environment is respected as it is.
- ``dataloader_pin_memory``: off when training on the CPU (pinned memory is for copies to a GPU; on a CPU-only
  machine torch warns about it on every run).
- ``disable_tqdm``: progress bars off when stderr or stdout is not a terminal (a log file gets the Trainer's one
  line per logging step instead of escape-code junk).
- ``bf16`` is decided when parsing (:mod:`.config`): on only where a GPU supports it.
"""

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
    """What the defaults need to know about the model, read from its config without loading weights."""

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
    """Hidden size (and, when asked, the parameter count) from the model's config; unknown values are None.

    The parameters are counted on a model built on the meta device (no memory, no weights read).
    """
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
    """Fill the unset machine-dependent fields of a validated ``cfg``: returns the config so resolved (``cfg`` is
    not changed) and what was chosen.

    ``device`` is where training runs (``"cuda"`` or ``"cpu"``; default: this machine's, as the run uses it);
    ``shape`` is read from the model's config when not given.
    """
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
