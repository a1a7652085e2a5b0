"""Gated delta rule and Kimi Delta Attention (KDA) over a packed row, one sequence at a time.

transformers' torch fallbacks of flash-linear-attention's ``chunk_gated_delta_rule`` /
``fused_recurrent_gated_delta_rule`` (Qwen3.5, Qwen3-Next, OLMo-Hybrid, ...) and ``chunk_kda`` /
``fused_recurrent_kda`` (Kimi-Linear; ``transformers/models/kimi_linear/modeling_kimi_linear.py``) carry one
recurrent state along the whole row, so an example starts from the state its predecessor left. fla's varlen kernels
restart the state at every ``cu_seqlens`` boundary. A zero gate at a boundary cannot do that with the chunked torch
form (its in-chunk ``cumsum`` of ``log`` gates would meet ``-inf - -inf``), so :func:`per_sequence` runs the original
torch function on each sequence's slice (every chunk then lies inside one sequence), with that sequence's own
initial state, and concatenates: each output and gradient is exactly that of its example alone. The final states,
when asked for, are stacked per sequence (``(N, H, K, V)``), as fla returns them for ``cu_seqlens``.

>>> from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule as reference
>>> q, k, v = (torch.randn(1, 7, 2, 4) for _ in range(3))
>>> g, beta = -torch.rand(1, 7, 2), torch.rand(1, 7, 2)
>>> out, _ = per_sequence(reference, [0, 3, 7], q, k, v, g=g, beta=beta)
>>> alone, _ = reference(q[:, 3:], k[:, 3:], v[:, 3:], g=g[:, 3:], beta=beta[:, 3:])
>>> torch.equal(out[:, 3:], alone)
True
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import torch

from .varlen import (
    PACKING_KWARGS,
    PackedRowError,
    packed_bounds,
    refuse_unmarked_packing,
    refuse_unpacked_dense_mask,
)

__all__ = ["KERNELS", "per_sequence", "varlen_delta_rule"]

# Whole-row tensors (batch, tokens, ...) that are sliced per sequence; the state is per sequence (dim 0).
_STATE = "initial_state"


def per_sequence(original: Callable, bounds: list[int], *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """Run ``original`` (a delta-rule function returning ``(output, final_state)``) on each sequence of the packed
    row separately: every tensor argument shaped ``(B, T, ...)`` is flattened to one row and sliced at ``bounds``
    (start offsets over the ``B * T`` tokens plus the total); ``initial_state``, if given, holds one state per
    sequence. Returns the outputs concatenated back to ``(B, T, ...)`` and the final states stacked per sequence
    (or None)."""
    signature = inspect.signature(original)
    bound = signature.bind_partial(*args, **kwargs)
    named = dict(bound.arguments)
    extra: dict[str, Any] = {}
    for name, param in signature.parameters.items():
        if param.kind is inspect.Parameter.VAR_KEYWORD and name in named:
            extra = {k: v for k, v in named.pop(name).items() if k not in PACKING_KWARGS}
    query = named.get("query", args[0] if args else None)
    batch, length = query.shape[:2]
    sequences = len(bounds) - 1
    rows = {n: v.reshape(1, batch * length, *v.shape[2:]) for n, v in named.items()
            if isinstance(v, torch.Tensor) and n != _STATE and v.ndim >= 2 and tuple(v.shape[:2]) == (batch, length)}
    state = named.get(_STATE)
    if state is not None and state.shape[0] != sequences:
        raise PackedRowError(
            f"initial_state holds {state.shape[0]} states for a packed row of {sequences} sequences: pass one per "
            "sequence, or none."
        )
    outputs, finals = [], []
    for i, (start, end) in enumerate(pairwise(bounds)):
        call = {**named, **{n: v[:, start:end] for n, v in rows.items()}, **extra}
        if state is not None:
            call[_STATE] = state[i : i + 1]
        out, final = original(**call)
        outputs.append(out)
        finals.append(final)
    output = torch.cat(outputs, dim=1).reshape(batch, length, *outputs[0].shape[2:])
    final_state = None if any(f is None for f in finals) else torch.cat(finals, dim=0)
    return output, final_state


def varlen_delta_rule(original: Callable) -> Callable:
    """The replacement of one of transformers' torch delta-rule functions: packed (``cu_seqlens``,
    ``cu_seq_lens_q`` or ``seq_idx`` among the keyword arguments) through :func:`per_sequence`, anything else
    through ``original`` unchanged."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def delta_rule(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        query = signature.bind_partial(*args, **kwargs).arguments.get("query")
        batch, length = query.shape[:2]
        bounds = packed_bounds(batch, length, kwargs)
        if bounds is None:
            refuse_unmarked_packing(batch * length, original.__name__)
            return original(*args, **{k: v for k, v in kwargs.items() if k not in PACKING_KWARGS})
        refuse_unpacked_dense_mask(batch * length, len(bounds) - 1, original.__name__)
        return per_sequence(original, bounds, *args, **kwargs)

    return delta_rule


KERNELS: dict[str, Callable[[Callable], Callable]] = {
    "chunk_gated_delta_rule": varlen_delta_rule,
    "fused_recurrent_gated_delta_rule": varlen_delta_rule,
    "chunk_kda": varlen_delta_rule,
    "fused_recurrent_kda": varlen_delta_rule,
}
