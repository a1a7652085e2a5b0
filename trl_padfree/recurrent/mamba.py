"""Mamba and Mamba-2 layers that keep the examples of a packed row apart, in plain torch.

transformers 5.x wraps the kernels of its state-space layers with
``integrations/hub_kernels.py::use_kernel_func_from_hub_with_fallback``: without the CUDA packages (``mamba_ssm``,
``causal_conv1d``) the torch reference runs, and it raises when given ``seq_idx=`` or ``cu_seqlens=`` ("can't keep
packed sequences apart"). Some models also drop the packing arguments before their mixers (``Mamba2ForCausalLM``
calls its backbone without ``**kwargs``; ``JambaMambaDecoderLayer`` calls its mixer without them), so their scans
run across example boundaries silently.

Resetting a chunked scan at a boundary inside its cumulative sums is not exact (a decay of ``-inf`` gives NaN, a
large finite one rounds the decays within a sequence away). So every packed function here runs each sequence
alone: the tokens of a packed row are gathered into a right-padded batch of sequences (trailing padding cannot
reach earlier positions of a causal scan or convolution), transformers' own torch function runs on that batch, and
the outputs are scattered back. Values and gradients equal those of each sequence run alone, to rounding.

Two parts, for ``trl_padfree.recurrent``'s mechanism:

- :data:`KERNELS`: the global name of a kernel function in transformers' modeling files -> a factory taking the
  original (the torch fallback) and returning a replacement that runs packed when a packing argument is given and
  calls the original unchanged otherwise;
- :func:`patch_model`: method-level patches, so that every Mamba mixer of a model sees where its sequences start
  even when the model drops the packing arguments on the way (Mamba-2 mixers are given ``seq_idx``, Jamba's and
  Mamba-1's mixers run each sequence alone).

Example (a packed row of two sequences equals each sequence alone):

    >>> import torch
    >>> from transformers.models.bamba import modeling_bamba as mb
    >>> scan = KERNELS["mamba2_chunk_scan"](mb.mamba2_chunk_scan)
    >>> g = torch.Generator().manual_seed(0)
    >>> x, dt = torch.randn(1, 7, 2, 4, generator=g), torch.rand(1, 7, 2, generator=g)
    >>> B, C = torch.randn(1, 7, 1, 3, generator=g), torch.randn(1, 7, 1, 3, generator=g)
    >>> A, seq_idx = -torch.rand(2, generator=g), torch.tensor([[0, 0, 0, 1, 1, 1, 1]], dtype=torch.int32)
    >>> packed = scan(x, dt, A, B, C, chunk_size=2, seq_idx=seq_idx)
    >>> second = scan(x[:, 3:], dt[:, 3:], A, B[:, 3:], C[:, 3:], chunk_size=2)
    >>> torch.allclose(packed[:, 3:], second, atol=1e-6)
    True
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .varlen import packed_bounds, packed_seq_idx, sequence_starts

__all__ = ["KERNELS", "PackedLayout", "packed_chunk_scan", "packed_selective_scan", "packed_layout", "patch_model"]

# Arguments that describe a packed row; they are removed before transformers' torch function runs per sequence.
_PACKING_KEYS = ("seq_idx", "cu_seqlens", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
_DROP_KEYS = (*_PACKING_KEYS, "position_ids")

# The ``seq_idx`` (B, T) of the model call being run, set by patch_model's hook on a model that wraps the base model.
_CALL_SEQ_IDX: contextvars.ContextVar[torch.Tensor | None]
_CALL_SEQ_IDX = contextvars.ContextVar("padfree_call_seq_idx", default=None)

_CACHE_ADVICE = "a packed row cannot continue or keep a recurrent cache; pass use_cache=False for packed batches."


@dataclass(frozen=True)
class PackedLayout:
    """Where the sequences of a ``(B, T)`` batch lie, as right-padded batches of sequences of similar length.

    ``groups``: per batch of sequences, ``index`` ``(N, L)`` into the ``B*T`` flattened tokens (padding slots point
    at ``B*T``, a zero token appended) and ``valid`` ``(N, L)``, the real slots. Sequences are sorted by length and
    grouped so that a group's padding never exceeds its tokens (a long sequence does not pad every short one to its
    length). ``inverse``: the position of every row token among the groups' real slots, in order.
    """

    batch: int
    length: int
    groups: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    inverse: torch.Tensor

    def unpack(self, x: torch.Tensor, dim: int) -> list[torch.Tensor]:
        """``x`` with ``(B, T)`` at dims ``0`` and ``dim`` -> per group ``(N, L)`` there, each sequence from
        position 0."""
        moved = x.movedim(dim, 1)
        flat = moved.reshape(self.batch * self.length, *moved.shape[2:])
        flat = torch.cat([flat, flat.new_zeros(1, *flat.shape[1:])])
        return [flat[index].movedim(1, dim) for index, _ in self.groups]

    def repack(self, ys: list[torch.Tensor], dim: int) -> torch.Tensor:
        """The inverse of :meth:`unpack`: per group ``(N, L)`` at dims ``0`` and ``dim`` -> ``(B, T)``."""
        tokens = torch.cat([y.movedim(dim, 1)[valid] for y, (_, valid) in zip(ys, self.groups, strict=True)])
        return tokens[self.inverse].reshape(self.batch, self.length, *tokens.shape[1:]).movedim(1, dim)

    def run(self, function: Callable[..., torch.Tensor], inputs: dict[str, Any], dims: dict[str, int], out: int):
        """``function(**inputs)`` once per group, the ``dims`` entries of ``inputs`` unpacked along their dim; the
        outputs (time at dim ``out``) repacked into the row."""
        unpacked = {key: self.unpack(inputs[key], dim) for key, dim in dims.items() if inputs.get(key) is not None}
        outputs = [
            function(**(inputs | {key: parts[g] for key, parts in unpacked.items()}))
            for g in range(len(self.groups))
        ]
        return self.repack(outputs, out)


def _groups(lengths: list[int]) -> list[list[int]]:
    """Sequence numbers grouped for padded batches: longest first; a sequence joins the current group while the
    group's padded size stays within twice its tokens."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    tokens = 0
    for i in order:
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= 2 * (tokens + lengths[i]):
            groups[-1].append(i)
            tokens += lengths[i]
        else:
            groups.append([i])
            tokens = lengths[i]
    return groups


def _starts_to_layout(starts: torch.Tensor, batch: int, length: int) -> PackedLayout | None:
    """``starts`` (B, T) bool: where a sequence begins. ``None`` when every row is one sequence."""
    flat_starts = starts.reshape(-1).nonzero().reshape(-1)
    if flat_starts.numel() == batch:
        return None
    total = batch * length
    begins = flat_starts.tolist()
    lengths = [end - begin for begin, end in zip(begins, begins[1:] + [total], strict=True)]
    groups = []
    for members in _groups(lengths):
        width = lengths[members[0]]
        if width * len(members) == total:
            # a batch of sequences of the row's token count: one padding slot more, so that it never looks like
            # the packed row (the recurrent mechanism refuses a call of a packed row's size without boundaries,
            # see trl_padfree.recurrent.varlen)
            width += 1
        first = torch.tensor([begins[i] for i in members], device=starts.device)
        size = torch.tensor([lengths[i] for i in members], device=starts.device)
        offsets = torch.arange(width, device=starts.device)
        valid = offsets[None, :] < size[:, None]
        index = torch.where(valid, first[:, None] + offsets[None, :], torch.full_like(offsets, total)[None, :])
        groups.append((index, valid))
    order = torch.cat([index[valid] for index, valid in groups])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return PackedLayout(batch, length, tuple(groups), inverse)


def packed_layout(kwargs: dict[str, Any], batch: int, length: int) -> PackedLayout | None:
    """The sequences of a ``(batch, length)`` row from ``seq_idx`` ``(B, T)`` or ``cu_seqlens`` / ``cu_seq_lens_q``
    (1-D, over the flattened tokens); ``None`` when neither is given or every row is one sequence.

    >>> [index.tolist() for index, _ in packed_layout({"seq_idx": torch.tensor([[0, 0, 1]])}, 1, 3).groups]
    [[[0, 1], [2, 3]]]
    >>> layout = packed_layout({"cu_seq_lens_q": torch.tensor([0, 1, 9, 10])}, 1, 10)  # lengths 1, 8, 1
    >>> [index.tolist() for index, _ in layout.groups]  # the 8 and a 1 padded to 8; the other 1 alone
    [[[1, 2, 3, 4, 5, 6, 7, 8], [0, 10, 10, 10, 10, 10, 10, 10]], [[9]]]
    >>> packed_layout({}, 1, 3) is None
    True
    """
    seq_idx = packed_seq_idx(batch, length, kwargs)
    return None if seq_idx is None else _starts_to_layout(sequence_starts(seq_idx.expand(batch, length)), batch, length)


def _packing_given(kwargs: dict[str, Any]) -> bool:
    return any(kwargs.get(key) is not None for key in ("seq_idx", "cu_seqlens", "cu_seq_lens_q"))


def _plain(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in kwargs.items() if key not in _DROP_KEYS}


def _packed(name: str, params: tuple[str, ...], time: int, dims: tuple[str, ...], cache: tuple[str, ...]):
    """The packed form of transformers' torch function ``name``: its arguments (``params`` in order, plus
    ``seq_idx`` or ``cu_seqlens``) bound by name; the ``dims`` inputs (time at dim ``time``) run each sequence alone
    through the original; a truthy ``cache`` argument is refused."""

    def packed(original: Callable, *args: Any, **kwargs: Any) -> Any:
        bound = dict(zip(params, args, strict=False)) | kwargs
        shape = bound["hidden_states"].shape
        layout = packed_layout(bound, shape[0], shape[time])
        plain = _plain(bound)
        if layout is None:
            return original(**plain)
        if any(plain.get(key) is not None and plain.get(key) is not False for key in cache):
            raise ValueError(f"{name}: {_CACHE_ADVICE}")
        return layout.run(original, plain, dict.fromkeys(dims, time), out=time)

    packed.__doc__ = f"``{name}`` over a packed row, each sequence alone (``original`` is transformers' function)."
    return packed


# Mamba-2's chunked scan, the torch form of mamba_ssm's mamba_chunk_scan_combined: (B, T, H, P).
packed_chunk_scan = _packed(
    "mamba2_chunk_scan", ("hidden_states", "dt", "A", "B", "C", "chunk_size"), 1,
    ("hidden_states", "dt", "B", "C"), ("initial_states", "return_final_states"),
)
# Mamba-1's selective scan, the torch form of mamba_ssm's selective_scan_fn: channels first, time last (B, D, T).
packed_selective_scan = _packed(
    "mamba_selective_scan",
    ("hidden_states", "dt", "A", "B", "C", "D", "z", "delta_bias", "delta_softplus", "return_last_state"), 2,
    ("hidden_states", "dt", "B", "C", "z"), ("return_last_state",),
)


def _replacement(packed: Callable) -> Callable[[Callable], Callable]:
    """The factory: ``original`` unchanged for a call without packing arguments, else ``packed(original, ...)``."""

    def factory(original: Callable) -> Callable:
        return functools.wraps(original)(lambda *args, **kwargs: (
            packed(original, *args, **kwargs) if _packing_given(kwargs) else original(*args, **kwargs)))

    return factory


KERNELS: dict[str, Callable[[Callable], Callable]] = {
    "mamba2_chunk_scan": _replacement(packed_chunk_scan),
    "mamba_selective_scan": _replacement(packed_selective_scan),
    # The fused forms have no torch version in transformers: their fallback returns None and the mixer runs its
    # unfused path (convolution, then scan: the packed functions above). With packing arguments: None too.
    "mamba2_split_conv1d_scan_combined": _replacement(lambda original, *args, **kwargs: None),
    "mamba_inner_fn": _replacement(lambda original, *args, **kwargs: None),
    # selective_state_update advances one token per row (decoding): there is no boundary inside a step.
    "mamba2_selective_state_update": _replacement(lambda original, *args, **kwargs: original(*args, **_plain(kwargs))),
    "mamba_selective_state_update": _replacement(lambda original, *args, **kwargs: original(*args, **_plain(kwargs))),
}
"""transformers' global name of a kernel function -> the factory of its packed torch replacement."""


# ---------------------------------------------------------------------------------------------------------------
# Method-level patches


def _row_seq_idx(kwargs: dict[str, Any], shape: tuple[int, ...] | None) -> torch.Tensor | None:
    """A row's ``seq_idx`` from a call's arguments: ``seq_idx``, else ``cu_seq_lens_q``, else ``position_ids`` that
    restart (only without an attention mask); ``None`` when none says where sequences start."""
    seq_idx = kwargs.get("seq_idx")
    if seq_idx is not None or shape is None or len(shape) != 2:
        return seq_idx
    cu = kwargs.get("cu_seq_lens_q")
    if cu is not None:
        return packed_seq_idx(*shape, {"cu_seq_lens_q": cu}).to(torch.int32)
    position_ids = kwargs.get("position_ids")
    if position_ids is None or kwargs.get("attention_mask") is not None or position_ids.shape[-1] != shape[1]:
        return None
    position_ids = position_ids.reshape(-1, shape[1]).expand(shape[0], -1)
    starts = torch.ones(shape, dtype=torch.bool, device=position_ids.device)
    starts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    if int(starts.sum()) == shape[0]:
        return None
    return (starts.to(torch.int32).cumsum(-1) - 1).to(torch.int32)


def _call_shape(kwargs: dict[str, Any]) -> tuple[int, ...] | None:
    for key in ("input_ids", "inputs_embeds"):
        value = kwargs.get(key)
        if value is not None:
            return tuple(value.shape[:2])
    return None


def _arguments(forward: Callable, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by name (a ``**kwargs`` parameter flattened)."""
    try:
        signature = inspect.signature(forward)
        bound = signature.bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):
        return dict(kwargs)
    named: dict[str, Any] = {}
    for name, value in bound.items():
        if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[name] = value
    return named


def _enter_call(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
    named = _arguments(module.forward, args, kwargs)
    module._padfree_call_tokens.append(_CALL_SEQ_IDX.set(_row_seq_idx(named, _call_shape(named))))


def _leave_call(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
    if module._padfree_call_tokens:
        _CALL_SEQ_IDX.reset(module._padfree_call_tokens.pop())


def _give_seq_idx(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """The base model passes its ``**kwargs`` to every layer (and so to every mixer and kernel): give it the row's
    ``seq_idx`` when the call has none. Inside the model's call, so that checkpointed layers recompute with it."""
    if kwargs.get("seq_idx") is None:
        named = _arguments(module.forward, args, kwargs)
        shape = _call_shape(named)
        seq_idx = _row_seq_idx(named, shape)
        outer = _CALL_SEQ_IDX.get()
        if seq_idx is None and outer is not None and shape == tuple(outer.shape):
            seq_idx = outer
        if seq_idx is not None:
            kwargs = {**kwargs, "seq_idx": seq_idx.to(torch.int32)}
    return args, kwargs


def _layer_hands_boundaries(forward: Callable) -> Callable:
    """A decoder layer that calls its Mamba-1 mixer with only ``hidden_states``, ``cache`` and ``attention_mask``
    (``JambaMambaDecoderLayer``): the row's boundaries go to the mixer as the ``attention_mask`` argument, a 1-D
    ``cu_seq_lens`` tensor (the form ``"padfree"``'s mask builder gives packed rows), which the patched mixer reads.
    An argument, not a context: a checkpointed layer recomputes its forward with the same arguments."""
    signature = inspect.signature(forward)

    @functools.wraps(forward)
    def patched(*args: Any, **kwargs: Any) -> Any:
        named = _arguments(forward, args, kwargs)
        hidden_states = named.get("hidden_states")
        mask = named.pop("attention_mask", None)
        if not isinstance(hidden_states, torch.Tensor):
            return forward(*args, **kwargs)
        seq_idx = _row_seq_idx(named, tuple(hidden_states.shape[:2]))
        if seq_idx is None or (mask is not None and mask.ndim == 1):
            return forward(*args, **kwargs)
        if mask is not None:
            raise ValueError(
                f"{type(forward.__self__).__name__}: a packed row (seq_idx / cu_seq_lens) came with a padding "  # type: ignore[attr-defined]
                "attention_mask; pass one or the other, not both."
            )
        bound = signature.bind(*args, **kwargs)
        bounds = packed_bounds(*seq_idx.shape, {"seq_idx": seq_idx})  # sequence starts in the flat row, plus the total
        bound.arguments["attention_mask"] = torch.tensor(bounds, dtype=torch.int32, device=hidden_states.device)
        return forward(*bound.args, **bound.kwargs)

    return patched


def _run_each_sequence(forward: Callable) -> Callable:
    """A Mamba-1 mixer (Jamba's): run each sequence of a packed row alone, as a right-padded batch. The boundaries
    come as ``seq_idx`` / ``cu_seqlens``, or as a 1-D ``attention_mask`` (``cu_seq_lens``, from its layer)."""

    @functools.wraps(forward)
    def patched(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        batch, length = hidden_states.shape[:2]
        attention_mask = kwargs.get("attention_mask")
        if isinstance(attention_mask, torch.Tensor) and attention_mask.ndim == 1:
            kwargs = {**kwargs, "attention_mask": None, "cu_seqlens": attention_mask}
        layout = None if args else packed_layout(kwargs, batch, length)
        if layout is None:
            return forward(hidden_states, *args, **_plain(kwargs))
        # transformers 5.24 names the mixer's cache `cache`, 5.23 `cache_params`
        if kwargs.get("cache") is not None or kwargs.get("cache_params") is not None:
            raise ValueError(f"{type(forward.__self__).__name__}: {_CACHE_ADVICE}")  # type: ignore[attr-defined]
        inputs = _plain(kwargs) | {"hidden_states": hidden_states}
        return layout.run(forward, inputs, {"hidden_states": 1, "attention_mask": 1}, out=1)

    return patched


def _mixer_kind(module: torch.nn.Module) -> str | None:
    if not (hasattr(module, "A_log") and hasattr(module, "conv1d")):
        return None
    names = vars(sys.modules.get(type(module).__module__, object()))
    return "mamba2" if "mamba2_chunk_scan" in names else "mamba1" if "mamba_selective_scan" in names else None


def patch_model(model: torch.nn.Module) -> list[str]:
    """Make every Mamba mixer of ``model`` see where the sequences of a packed row start. Idempotent.

    The row's boundaries come from the model's call (``seq_idx``, else ``cu_seq_lens_q``, else restarting
    ``position_ids`` without an attention mask). The base model is given them as ``seq_idx`` (a forward pre-hook),
    which its layers pass on to the mixers and their kernels (``mamba_ssm``'s on CUDA, :data:`KERNELS`' torch
    forms otherwise); a wrapper around the base model (``Mamba2ForCausalLM``, which calls its backbone without its
    ``**kwargs``) has a hook that reads them first. Decoder layers that call their mixer without ``**kwargs``
    (Jamba's) hand the boundaries to the mixer, which runs each sequence alone (``selective_scan_fn`` takes no
    ``seq_idx``). All of it happens inside the model's call, so checkpointed layers recompute the same way. No
    kernel function is replaced here. Returns the names of what it patched (empty when the model has no Mamba
    mixer, and on a second call).

    >>> from transformers import Mamba2Config, Mamba2ForCausalLM
    >>> model = Mamba2ForCausalLM(Mamba2Config(vocab_size=16, hidden_size=16, num_hidden_layers=1, num_heads=4,
    ...                                        head_dim=8, state_size=4, n_groups=1, chunk_size=4))
    >>> patch_model(model)
    ['backbone (Mamba2Model: seq_idx for its layers)', '(Mamba2ForCausalLM call: the row boundaries)']
    >>> patch_model(model)
    []
    """
    mixers = [(name, module) for name, module in model.named_modules() if _mixer_kind(module) is not None]
    if not mixers:
        return []
    patched: list[str] = []
    for name, module in mixers:
        if _mixer_kind(module) != "mamba1" or getattr(module, "_padfree_mamba_patched", False):
            continue
        module.forward = _run_each_sequence(module.forward)
        module._padfree_mamba_patched = True
        patched.append(f"{name} ({type(module).__name__}: each sequence alone)")
        parent_name = name.rpartition(".")[0]
        parent = model.get_submodule(parent_name)
        if not getattr(parent, "_padfree_mamba_patched", False):
            parent.forward = _layer_hands_boundaries(parent.forward)
            parent._padfree_mamba_patched = True
            patched.append(f"{parent_name} ({type(parent).__name__}: boundaries for its mixer)")
    base = getattr(model, "base_model", model)
    if not getattr(base, "_padfree_seq_idx_hook", False):
        base.register_forward_pre_hook(_give_seq_idx, with_kwargs=True)
        base._padfree_seq_idx_hook = True
        base_name = next((n for n, m in model.named_modules() if m is base), "") or "(model)"
        patched.append(f"{base_name} ({type(base).__name__}: seq_idx for its layers)")
    if base is not model and not getattr(model, "_padfree_call_hook", False):
        model._padfree_call_tokens = []
        model.register_forward_pre_hook(_enter_call, with_kwargs=True)
        model.register_forward_hook(_leave_call, with_kwargs=True, always_call=True)
        model._padfree_call_hook = True
        patched.append(f"({type(model).__name__} call: the row boundaries)")
    return patched
