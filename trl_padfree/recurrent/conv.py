"""Short causal convolution (``causal_conv1d_fn``) over a packed row, reset at every sequence boundary.

transformers' torch fallback of ``causal_conv1d_fn`` (e.g. ``transformers/models/qwen3_5/modeling_qwen3_5.py``) runs
one ``F.conv1d`` over the whole row, so the first ``kernel_size - 1`` tokens of an example see the last tokens of
the example before it; the CUDA package ``causal-conv1d`` keeps them apart with ``seq_idx``. :func:`causal_conv1d_packed`
is the same convolution with a tap dropped wherever it would reach into another sequence, so every output equals
the one of its example run alone. :data:`KERNELS` maps the kernel's name to the factory that wraps transformers'
fallback (see :mod:`trl_padfree.recurrent`).

>>> x = torch.arange(1.0, 6.0).reshape(1, 1, 5)  # one channel, two sequences: [1, 2, 3] and [4, 5]
>>> w = torch.tensor([[1.0, 10.0]])  # out[t] = x[t - 1] + 10 * x[t]
>>> causal_conv1d_packed(x, w, seq_idx=torch.tensor([[0, 0, 0, 1, 1]])).tolist()
[[[10.0, 21.0, 32.0, 40.0, 54.0]]]
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN

from .varlen import PACKING_KWARGS, packed_seq_idx, refuse_unmarked_packing, refuse_unpacked_dense_mask

__all__ = ["KERNELS", "causal_conv1d_packed", "varlen_causal_conv1d_fn"]


def causal_conv1d_packed(hidden_states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                         activation: str | None = None, *, seq_idx: torch.Tensor) -> torch.Tensor:
    """Depthwise causal conv1d of ``hidden_states`` ``(B, C, T)`` with ``weight`` ``(C, K)``, reset where ``seq_idx``
    ``(B, T)`` (or ``(1, T)``) changes: output ``t`` sums ``weight[:, K-1-j] * x[t-j]`` over the lags ``j`` whose
    token ``t-j`` belongs to the same sequence as ``t``. Same dtype handling as transformers' fallback (computed in
    the weight's dtype, returned in the input's)."""
    _, _, length = hidden_states.shape
    kernel = weight.shape[-1]
    x = hidden_states.to(weight.dtype)
    seq = seq_idx.to(x.device)
    out = x * weight[:, kernel - 1, None]
    for lag in range(1, min(kernel, length + 1)):
        shifted = F.pad(x, (lag, 0))[..., :length]
        same = (F.pad(seq, (lag, 0), value=-1)[..., :length] == seq).unsqueeze(1)
        out = out + torch.where(same, shifted, 0.0) * weight[:, kernel - 1 - lag, None]
    if bias is not None:
        out = out + bias[:, None]
    if activation is not None:
        out = ACT2FN[activation](out)
    return out.to(hidden_states.dtype)


def varlen_causal_conv1d_fn(original: Callable) -> Callable:
    """The replacement of transformers' torch ``causal_conv1d_fn``: packed (``seq_idx``, ``cu_seqlens`` or the
    collator's ``cu_seq_lens_q`` among the keyword arguments) through :func:`causal_conv1d_packed`, anything else
    through ``original`` unchanged."""

    @functools.wraps(original)
    def causal_conv1d_fn(hidden_states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                         activation: str | None = None, **kwargs: Any) -> torch.Tensor:
        batch, _, length = hidden_states.shape
        seq = packed_seq_idx(batch, length, kwargs)
        if seq is None:
            refuse_unmarked_packing(batch * length, "causal_conv1d_fn")
            rest = {k: v for k, v in kwargs.items() if k not in PACKING_KWARGS}
            return original(hidden_states, weight, bias, activation=activation, **rest)
        refuse_unpacked_dense_mask(batch * length, lambda: int(seq.unique().numel()), "causal_conv1d_fn")
        return causal_conv1d_packed(hidden_states, weight, bias, activation, seq_idx=seq)

    return causal_conv1d_fn


KERNELS: dict[str, Callable[[Callable], Callable]] = {"causal_conv1d_fn": varlen_causal_conv1d_fn}
