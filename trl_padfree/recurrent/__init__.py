"""Recurrent layers (short convolutions, gated delta rule, KDA, Mamba scans) that restart at every sequence
boundary of a packed row.

transformers' modeling files call their recurrent kernels through module globals decorated with
``use_kernel_func_from_hub_with_fallback(name, package)`` (``transformers/integrations/hub_kernels.py``): the
installed package's function when there is one (``causal-conv1d``, ``flash-linear-attention``, ``mamba-ssm``, which
read ``seq_idx`` / ``cu_seqlens`` and keep packed sequences apart), else a torch reference that cannot, and raises
when it gets ``seq_idx`` or ``cu_seqlens``. :func:`prepare_packed_layers` replaces, in the modeling modules of a
model's submodules, exactly those torch references with varlen-aware torch versions (built by the ``KERNELS``
factories of :mod:`.conv`, :mod:`.delta_rule` and :mod:`.mamba`), which fall through to the original
when a call carries no boundaries. A real package's function is never replaced.

When it applies (each is idempotent and cheap after the first time):

- ``"padfree"``'s mask builder (:func:`trl_padfree.attention.padfree_mask`), which transformers calls at the start
  of every forward with the model's config, runs :func:`prepare_packed_config` on the config's modeling module. So
  a model loaded with ``attn_implementation="padfree"`` handles the collator's packed batch from its first forward,
  called by hand, by the probe (:func:`trl_padfree.check_packing`) or by any trainer;
- this package's trainers call :func:`prepare_packed_layers` on their model when training starts (any attention);
- anyone can call :func:`prepare_packed_layers` on a model.

A packed row reaches the kernels with its boundaries when the batch has ``seq_idx`` or ``cu_seq_lens_q`` (the
collator's batches have both). One with only ``position_ids`` restarting is refused, under ``"padfree"``, with a
:class:`PackedRowError` naming what to pass, never run across sequences. ``prompt_once`` (a prompt shared by several
completions through the attention's key index) cannot share a recurrent state: :func:`refuse_shared_prompt` says so.

A kernel module contributes ``KERNELS: dict[str, Callable[[Callable], Callable]]``: the kernel's name as given to
``use_kernel_func_from_hub_with_fallback`` (``"chunk_gated_delta_rule"``; a module global of that exact name also
matches) -> a factory taking transformers' torch function and returning its replacement; and optionally
``patch_model(model) -> list[str]`` for patches of methods, run by :func:`prepare_packed_layers`.

>>> from trl_padfree.families import tiny_family_model
>>> model = tiny_family_model("qwen3_5_text", "sdpa")  # Qwen3.5: gated delta rule layers with short convolutions
>>> prepare_packed_layers(model)
['qwen3_5.causal_conv1d_fn', 'qwen3_5.torch_chunk_gated_delta_rule', 'qwen3_5.torch_recurrent_gated_delta_rule']
>>> recurrent_layer_types(model)
['Qwen3_5GatedDeltaNet']
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

import torch

from . import conv, delta_rule, mamba
from .varlen import PackedRowError, note_mask

KERNEL_MODULES: list[ModuleType] = [conv, delta_rule, mamba]  # each contributes KERNELS (and maybe patch_model)

__all__ = [
    "KERNEL_MODULES", "PackedRowError", "hub_function", "kernels", "note_mask", "prepare_packed_config",
    "prepare_packed_layers", "recurrent_layer_types", "refuse_shared_prompt", "torch_fallback_name",
]  # fmt: skip

_REPLACED = "__trl_padfree_original__"  # attribute of a replacement: the function it wraps
_DONE_MODULES: dict[str, list[str]] = {}  # modeling module -> its globals prepare_packed_config replaced


def kernels() -> dict[str, Callable[[Callable], Callable]]:
    """Every kernel module's ``KERNELS``, merged (kernel name -> factory)."""
    merged: dict[str, Callable[[Callable], Callable]] = {}
    for module in KERNEL_MODULES:
        merged.update(getattr(module, "KERNELS", {}))
    return merged


def hub_function(fn: Any) -> Any:
    """The function under a ``kernels`` layer, else ``fn`` itself.

    Where the ``kernels`` package is installed (transformers 5.25 requires it), its ``use_kernel_forward_from_hub``
    turns a decorated function into an instance of a one-off ``nn.Module`` class whose ``forward`` calls the
    function (``kernels/_internals/layer/layer.py``, ``_create_func_module``); transformers' fallback wrapper is
    then inside it. There is no public accessor, so the function is read from ``forward``'s closure.

    >>> hub_function(len) is len
    True
    """
    forward = getattr(type(fn), "forward", None)
    if (not isinstance(fn, torch.nn.Module) or type(fn).__qualname__ != "_create_func_module.<locals>.Func"
            or getattr(forward, "__closure__", None) is None):
        return fn
    cells = dict(zip(forward.__code__.co_freevars, forward.__closure__, strict=True))
    inner = cells.get("func")
    return inner.cell_contents if inner is not None and callable(inner.cell_contents) else fn


def _fallback_closure(fn: Any) -> dict[str, Any] | None:
    """The closure of transformers' ``use_kernel_func_from_hub_with_fallback`` wrapper, or None for anything else."""
    fn = hub_function(fn)
    code = getattr(fn, "__code__", None)
    if code is None or fn.__closure__ is None:
        return None
    cells = dict(zip(code.co_freevars, fn.__closure__, strict=True))
    if not {"func_name", "is_new_implementation", "torch_function"} <= cells.keys():
        return None
    try:
        return {name: cell.cell_contents for name, cell in cells.items()}
    except ValueError:  # an empty cell
        return None


def torch_fallback_name(fn: Any) -> str | None:
    """The kernel name of ``fn`` if it is transformers' torch fallback (no kernel package behind it), else None.

    >>> from transformers.models.qwen3_5 import modeling_qwen3_5 as m
    >>> torch_fallback_name(m.causal_conv1d_update)  # causal-conv1d is not installed here
    'causal_conv1d_update'
    >>> torch_fallback_name(len) is None
    True
    """
    closure = _fallback_closure(fn)
    if closure is None or closure["is_new_implementation"]:
        return None
    return closure["func_name"]


def _own_torch_kernel(module: ModuleType, name: str, value: Any, factories: dict[str, Any]) -> str | None:
    """The kernel name of a global of ``module`` that is its own torch code for a kernel of ``factories``: the
    transformers fallback wrapper without a package, or a plain function of that name defined in the module itself
    (transformers 5.23's LFM3 defines an undecorated ``causal_conv1d_fn`` that ignores ``seq_idx``)."""
    kernel = torch_fallback_name(value)
    if kernel is not None:
        return kernel if (kernel in factories or name in factories) else None
    if (name in factories and inspect.isfunction(value) and value.__module__ == module.__name__
            and _fallback_closure(value) is None):
        return name
    return None


def _patch_module(module: ModuleType, factories: dict[str, Callable[[Callable], Callable]]) -> list[str]:
    """Replace the torch fallbacks among ``module``'s globals that a factory covers; names of those now replaced."""
    short = module.__name__.rsplit(".", 1)[-1].removeprefix("modeling_")
    names = []
    for name, value in sorted(vars(module).items()):
        if hasattr(value, _REPLACED):
            names.append(f"{short}.{name}")
            continue
        kernel = _own_torch_kernel(module, name, value, factories)
        if kernel is None:
            continue
        factory = factories.get(kernel) or factories[name]
        replacement = factory(hub_function(value))
        setattr(replacement, _REPLACED, value)
        setattr(module, name, replacement)
        names.append(f"{short}.{name}")
    return names


def prepare_packed_layers(model: Any) -> list[str]:
    """Make ``model``'s recurrent layers restart at every sequence boundary of a packed row (see the module docs).

    Replaces, in the modeling module of every submodule, the torch fallbacks of the kernels in :func:`kernels` with
    their varlen-aware versions, and runs each kernel module's ``patch_model``. Returns what is varlen-aware now,
    ``"<module>.<global>"`` (those replaced earlier included, so a second call returns the same list); empty for a
    model without such kernels, or whose kernels come from the installed CUDA packages. Idempotent.
    """
    factories = kernels()
    names: list[str] = []
    subs = model.modules() if hasattr(model, "modules") else [model]
    for name in dict.fromkeys(type(sub).__module__ for sub in subs):
        if name in sys.modules:  # the modeling module of every submodule
            names += _patch_module(sys.modules[name], factories)
    for kernel_module in KERNEL_MODULES:
        patch_model = getattr(kernel_module, "patch_model", None)
        if patch_model is not None:
            names += patch_model(model)
    return names


def prepare_packed_config(config: Any) -> None:
    """:func:`prepare_packed_layers` for the modeling module of ``config``'s model (the ``modeling_*`` module
    beside its ``configuration_*`` module), as far as it is imported; cheap after the first call per module.
    "padfree"'s mask builder calls it with the config transformers passes it."""
    if config is None:
        return
    name = type(config).__module__.replace(".configuration_", ".modeling_")
    module = sys.modules.get(name)
    if module is None:
        return
    done = _DONE_MODULES.get(name)
    if done is not None and all(hasattr(getattr(module, g, None), _REPLACED) for g in done):
        return
    _DONE_MODULES[name] = [n.rsplit(".", 1)[-1] for n in _patch_module(module, kernels())]


def recurrent_layer_types(model: Any) -> list[str]:
    """Class names of ``model``'s submodules whose ``forward`` calls a recurrent kernel (a short convolution, a
    linear-attention or state-space scan: anything transformers routes through
    ``use_kernel_func_from_hub_with_fallback``), in order of first appearance."""
    factories = kernels()
    found: list[str] = []
    modules: Iterable[Any] = model.modules() if hasattr(model, "modules") else []
    for sub in modules:
        cls = type(sub)
        if cls.__name__ in found:
            continue
        module = sys.modules.get(cls.__module__)
        forward = inspect.unwrap(getattr(cls, "forward", None) or (lambda: None))
        code = getattr(forward, "__code__", None)
        if module is None or code is None:
            continue
        if _calls_recurrent_kernel(module, code, factories):
            found.append(cls.__name__)
    return found


def _calls_recurrent_kernel(module: ModuleType, code: Any, factories: dict[str, Any], depth: int = 1) -> bool:
    """Whether ``code`` calls a recurrent kernel of ``module``, directly or through ``depth`` levels of module
    helpers under a ``kernels`` layer (transformers 5.25's ``causal_conv1d_forward`` calls ``causal_conv1d_fn``)."""
    for name in code.co_names:
        value = getattr(module, name, None)
        if (hasattr(value, _REPLACED) or _fallback_closure(value) is not None
                or _own_torch_kernel(module, name, value, factories) is not None):
            return True
        inner = hub_function(value)
        if (depth > 0 and inner is not value and getattr(inner, "__module__", None) == module.__name__
                and hasattr(inner, "__code__")
                and _calls_recurrent_kernel(module, inner.__code__, factories, depth - 1)):
            return True
    return False


def refuse_shared_prompt(model: Any, what: str = "prompt_once=True") -> None:
    """Raise ValueError, before any work, when ``model`` has a recurrent layer: a prompt shared through the
    attention's key index reaches only the attention layers, while a recurrent layer would run each completion
    on from the state of whatever precedes it in the row instead of the prompt's."""
    layers = recurrent_layer_types(model)
    if layers:
        raise ValueError(
            f"{what} cannot share a prompt with {layers[0]} layers (recurrent: each completion needs the state the "
            "prompt leaves, which only attention can share through the key index); set prompt_once=False."
        )
