"""Sequence boundaries of a packed row as the recurrent kernels read them.

A packed batch tells a kernel where its sequences start in one of three ways, all produced by this package's
collator (:mod:`trl_padfree.flattening`): ``seq_idx`` ``(B, T)`` (the example of every token; what the CUDA package
``causal-conv1d`` reads), ``cu_seqlens`` (what flash-linear-attention's varlen kernels read; transformers passes the
batch's ``cu_seq_lens_q`` under that name to the gated delta rule) or ``cu_seq_lens_q`` itself, which transformers
forwards unchanged to the convolution and to Kimi-Linear's KDA. The cumulative lengths count the flattened
``B * T`` tokens, as flash-attn's do.

>>> packed_bounds(1, 5, {"seq_idx": torch.tensor([[0, 0, 0, 1, 1]])})
[0, 3, 5]
>>> packed_seq_idx(1, 5, {"cu_seq_lens_q": torch.tensor([0, 2, 5], dtype=torch.int32)}).tolist()
[[0, 0, 1, 1, 1]]
>>> packed_bounds(1, 5, {}) is None  # not packed: the kernel runs as transformers wrote it
True
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import torch

__all__ = ["PACKING_KWARGS", "PackedRowError", "note_mask", "packed_bounds", "packed_seq_idx",
           "refuse_unmarked_packing", "refuse_unpacked_dense_mask", "sequence_starts"]

# The keyword arguments that carry a packed row's boundaries to a kernel; never passed on to the original.
PACKING_KWARGS = frozenset({"seq_idx", "cu_seqlens"})

# What "padfree"'s mask builder saw in the current forward (this thread/task): (tokens, packed, dense mask returned).
_MASK_SEEN: ContextVar[tuple[int, bool, bool] | None] = ContextVar("trl_padfree_mask_seen", default=None)


class PackedRowError(ValueError):
    """A packed row reached a recurrent kernel without its boundaries (``seq_idx`` / ``cu_seq_lens_q``)."""


def _cu(kwargs: dict[str, Any]) -> torch.Tensor | None:
    return next((kwargs[name] for name in ("cu_seqlens", "cu_seq_lens_q") if kwargs.get(name) is not None), None)


def sequence_starts(seq_idx: torch.Tensor) -> torch.Tensor:
    """Where a sequence begins in ``seq_idx`` ``(B, T)``: bool, every row's first token included."""
    starts = torch.ones(seq_idx.shape, dtype=torch.bool, device=seq_idx.device)
    starts[:, 1:] = seq_idx[:, 1:] != seq_idx[:, :-1]
    return starts


def packed_seq_idx(batch: int, length: int, kwargs: dict[str, Any]) -> torch.Tensor | None:
    """``seq_idx`` ``(B, T)`` (or ``(1, T)``) of the call's packed row, or None when the call carries no boundaries."""
    seq_idx = kwargs.get("seq_idx")
    if seq_idx is not None:
        if seq_idx.shape[-1] != length or seq_idx.ndim != 2 or seq_idx.shape[0] not in (1, batch):
            raise PackedRowError(
                f"seq_idx has shape {tuple(seq_idx.shape)}, but the layer's input is {batch} rows of {length} tokens: "
                "pass the seq_idx of this batch (shape (batch, tokens), as the collator makes it)."
            )
        if kwargs.get("cu_seqlens") is None and kwargs.get("cu_seq_lens_q") is None:
            return seq_idx
    cu = _cu(kwargs)
    if cu is None:
        return None
    bounds = _checked(cu, batch, length)
    tokens = torch.arange(batch * length, device=cu.device)
    return torch.bucketize(tokens, bounds[1:].to(tokens.dtype), right=True).reshape(batch, length)


def _checked(cu: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    if cu.ndim != 1 or cu.numel() < 2 or int(cu[-1]) != batch * length or int(cu[0]) != 0:
        raise PackedRowError(
            f"cu_seq_lens {cu.tolist() if cu.numel() < 20 else tuple(cu.shape)} do not cover the layer's "
            f"{batch} x {length} tokens: pass the cumulative lengths of this batch (0, ..., {batch * length})."
        )
    return cu


def packed_bounds(batch: int, length: int, kwargs: dict[str, Any]) -> list[int] | None:
    """Start offsets of the call's sequences over the flattened ``B * T`` tokens, plus the total (a row start is
    always a boundary), or None when the call carries no boundaries. Reads them on the host (one sync)."""
    cu = _cu(kwargs)
    if cu is not None:
        return [int(c) for c in _checked(cu, batch, length).tolist()]
    seq_idx = kwargs.get("seq_idx")
    if seq_idx is None:
        return None
    seq = packed_seq_idx(batch, length, {"seq_idx": seq_idx}).expand(batch, length)
    return sequence_starts(seq).reshape(-1).nonzero().reshape(-1).tolist() + [batch * length]


def note_mask(tokens: int | None, *, packed: bool = False, dense: bool = False) -> None:
    """Record what "padfree"'s mask builder saw in the current forward: a row of ``tokens`` tokens (None: forget),
    ``packed`` (position_ids restart), ``dense`` (it returned a dense mask, which the attention then follows). A
    kernel called on that row checks it (:func:`refuse_unmarked_packing`, :func:`refuse_unpacked_dense_mask`)."""
    _MASK_SEEN.set(None if tokens is None else (tokens, packed, dense))


def refuse_unmarked_packing(tokens: int, kernel: str) -> None:
    """Raise :class:`PackedRowError` when the current forward is a packed row of ``tokens`` tokens (position_ids
    restarting, seen by "padfree"'s mask builder) but the kernel got no ``seq_idx`` / ``cu_seq_lens_q``."""
    if _MASK_SEEN.get() in ((tokens, True, False), (tokens, True, True)):
        raise PackedRowError(
            f"{kernel}: this packed row (position_ids restart) came without seq_idx or cu_seq_lens_q, so the "
            "model's recurrent layers cannot tell its sequences apart; pass the whole packed batch of "
            "trl_padfree's collator (it has seq_idx and cu_seq_lens_q/k), not only input_ids and position_ids."
        )


def refuse_unpacked_dense_mask(tokens: int, sequences: int | Callable[[], int], kernel: str) -> None:
    """Raise :class:`PackedRowError` when the kernel gets ``sequences`` > 1 on a row of ``tokens`` tokens whose dense
    attention mask (built by "padfree" for a model that needs one) spans the whole row: transformers does not look
    for packed ``position_ids`` when a cache is passed, so that model's attention would mix the sequences.
    ``sequences`` may be a callable, evaluated only in that case (counting can need a device sync)."""
    if _MASK_SEEN.get() != (tokens, False, True):
        return
    sequences = sequences() if callable(sequences) else sequences
    if sequences > 1:
        raise PackedRowError(
            f"{kernel}: this packed row's attention mask spans all its {sequences} sequences (transformers does not "
            "split the mask of a model that needs a dense one when a cache is passed); call the model with "
            "use_cache=False."
        )
