"""Matmul FLOPs of the benchmark's Llama over a batch exactly as the model received it, and a run's workload.

Counted per forward (2 FLOPs per multiply-add). A training step is a small multiple of its forward (forward +
backward is about three forwards; DPO adds a reference forward) with the same factor in every variant, so the FLOP
ratio of two variants is the ratio of their forwards:

- linear layers, per token slot fed to the model (a padded row's padding included) and per layer: the q/k/v/o
  projections ``2 * (2 d^2 + 2 d d_kv)`` and the MLP ``2 * 3 d I``;
- attention, per layer: ``4 d`` per query-key pair the kernel computes (QK^T and AV), the full rectangle of each
  segment (no causal halving, in any layout): a padded row ``T^2`` (sdpa with a padding mask is dense), a packed
  row under a varlen kernel (``"padfree"``, flash attention) ``sum(length^2)`` over its examples, a packed row
  under sdpa/eager with transformers' block-diagonal mask ``(sum(length))^2`` (the mask is dense);
- the LM head: ``2 d V`` per position whose logits are computed;
- not counted: embeddings, norms, RoPE, activations, softmax, the loss and the optimizer (elementwise, or the same
  in every layout).

A run records the :class:`Workload` of every step's batch; :func:`timed_flops` sums a run's timed steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .preset import MODEL_KEYS

__all__ = ["HYBRID_KEYS", "Workload", "chunked_slots", "flop_ratio", "flops_per_real_token", "forward_flops",
           "hybrid_forward_flops", "is_varlen", "model_shape", "sft_workload", "timed_flops"]


@dataclass(frozen=True)
class Workload:
    """What one forward over a batch computes: token slots through the layers, positions through the LM head, and
    ``sum(q_len * k_len)`` over the attention segments (full rectangles)."""

    slots: int
    head_slots: int
    attention_qk: int
    #: token slots the chunked gated delta rule computes (a hybrid model's linear-attention layers): each call's
    #: sequence padded to a multiple of its chunk (:func:`chunked_slots`); 0 for a model without such layers.
    chunk_slots: int = field(default=0, repr=False)


def forward_flops(model: Mapping[str, int], work: Workload) -> dict[str, float]:
    """Matmul FLOPs of one forward (see the module docstring), split into linear layers, attention and LM head.

    ``model``: ``layers``, ``hidden``, ``intermediate``, ``heads``, ``kv_heads``, ``vocab_size``.

    >>> tiny = dict(layers=4, hidden=256, intermediate=688, heads=8, kv_heads=4, vocab_size=2048)
    >>> forward_flops(tiny, Workload(slots=1, head_slots=1, attention_qk=1))
    {'linear': 5799936, 'attention': 4096, 'lm_head': 1048576, 'total': 6852608}
    """
    if "linear_layers" in model:
        return hybrid_forward_flops(model, work)
    d, layers = model["hidden"], model["layers"]
    d_kv = model["kv_heads"] * (d // model["heads"])
    per_slot = 2 * (2 * d * d + 2 * d * d_kv) + 2 * 3 * d * model["intermediate"]
    linear = layers * per_slot * work.slots
    attention = layers * 4 * d * work.attention_qk
    head = 2 * d * model["vocab_size"] * work.head_slots
    return {"linear": linear, "attention": attention, "lm_head": head, "total": linear + attention + head}


#: The extra sizes of a hybrid (linear + full attention) model, as a benchmark config names them (:mod:`.hybrid`).
HYBRID_KEYS = ("linear_layers", "head_dim", "linear_key_heads", "linear_value_heads", "linear_key_head_dim",
               "linear_value_head_dim", "conv_kernel", "chunk_size")


def model_shape(config: Mapping[str, Any]) -> dict[str, int]:
    """The model sizes :func:`forward_flops` needs, from a benchmark config (as a dict); a hybrid model's config
    adds :data:`HYBRID_KEYS`."""
    return {k: config[k] for k in (*MODEL_KEYS, *HYBRID_KEYS) if k in config}


def hybrid_forward_flops(model: Mapping[str, int], work: Workload) -> dict[str, float]:
    """Matmul FLOPs of one forward of a Qwen3.5-style hybrid (``transformers/models/qwen3_5/modeling_qwen3_5.py``):
    ``linear_layers`` gated-delta-rule layers and ``layers - linear_layers`` full-attention ones, every layer with
    the SwiGLU MLP ``2 * 3 d I`` per slot.

    - full attention, per slot: q (with its output gate, ``2 H h_d``), k, v (``H_kv h_d`` each) and o projections;
      ``4 H h_d`` per query-key pair (full rectangles, as for the Llama);
    - gated delta rule, per slot: the projections ``in_proj_qkv`` (``2 H_k d_k + H_v d_v``), ``in_proj_z``
      (``H_v d_v``), ``in_proj_a``/``in_proj_b`` (``H_v`` each), ``out_proj``, and the depthwise short convolution
      (``conv_kernel`` taps per channel of ``2 H_k d_k + H_v d_v``); per ``chunk_slots`` slot and value head, the
      chunked recurrence of ``torch_chunk_gated_delta_rule`` with chunk ``C``: ``2 C (3 d_k + 2 d_v)`` for the
      in-chunk products (``k_beta k^T``, ``q k^T``, the two triangular solves, ``attn @ v``, full squares) and
      ``6 d_k d_v`` for reading and writing the state. Linear in the sequence length: a padded row costs its width,
      a packed one its examples' lengths (each rounded up to the chunk).

    >>> shape = dict(layers=4, linear_layers=3, hidden=256, intermediate=688, heads=8, kv_heads=4, vocab_size=2048,
    ...              head_dim=32, linear_key_heads=4, linear_value_heads=8, linear_key_head_dim=32,
    ...              linear_value_head_dim=32, conv_kernel=4, chunk_size=64)
    >>> f = forward_flops(shape, Workload(slots=1, head_slots=1, attention_qk=1, chunk_slots=1))
    >>> f["attention"] == 4 * 8 * 32 + 3 * 8 * (2 * 64 * (3 * 32 + 2 * 32) + 6 * 32 * 32)
    True
    """
    d, layers, linear_layers = model["hidden"], model["layers"], model["linear_layers"]
    full_layers = layers - linear_layers
    q_dim = model["heads"] * model["head_dim"]
    kv_dim = model["kv_heads"] * model["head_dim"]
    key_dim = model["linear_key_heads"] * model["linear_key_head_dim"]
    value_dim = model["linear_value_heads"] * model["linear_value_head_dim"]
    conv_dim = 2 * key_dim + value_dim
    mlp = 2 * 3 * d * model["intermediate"]
    full_slot = 2 * d * (2 * q_dim + 2 * kv_dim) + 2 * q_dim * d + mlp
    linear_slot = 2 * d * (conv_dim + value_dim + 2 * model["linear_value_heads"]) + 2 * value_dim * d + mlp
    linear_slot += 2 * model["conv_kernel"] * conv_dim
    chunk, dk, dv = model["chunk_size"], model["linear_key_head_dim"], model["linear_value_head_dim"]
    recurrence = model["linear_value_heads"] * (2 * chunk * (3 * dk + 2 * dv) + 6 * dk * dv)
    linear = (full_layers * full_slot + linear_layers * linear_slot) * work.slots
    attention = full_layers * 4 * q_dim * work.attention_qk + linear_layers * recurrence * work.chunk_slots
    head = 2 * d * model["vocab_size"] * work.head_slots
    return {"linear": linear, "attention": attention, "lm_head": head, "total": linear + attention + head}


def chunked_slots(lengths: list[int], chunk: int) -> int:
    """Token slots of a chunked recurrence over sequences of ``lengths``, each padded to a multiple of ``chunk``
    (``torch_chunk_gated_delta_rule`` pads every call's sequence; a packed row's sequences are separate calls).

    >>> chunked_slots([3, 64, 65], 64)
    256
    """
    return sum(-(-n // chunk) * chunk for n in lengths)


def timed_flops(config: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, float]:
    """Matmul FLOPs of one forward summed over a run's timed steps, by part (from its recorded ``workloads``)."""
    model, total = model_shape(config), {"linear": 0.0, "attention": 0.0, "lm_head": 0.0, "total": 0.0}
    for work in result["workloads"][result["warmup_steps"] :]:
        for key, value in forward_flops(model, Workload(**work)).items():
            total[key] += value
    return total


def flops_per_real_token(config: Mapping[str, Any], result: Mapping[str, Any]) -> float | None:
    """Forward matmul FLOPs per real (non-padding) token over a run's timed steps; None for a run recorded
    without workloads (reports written before they were).

    >>> tiny = dict(layers=4, hidden=256, intermediate=688, heads=8, kv_heads=4, vocab_size=2048)
    >>> run = {"warmup_steps": 1, "real_tokens": [9, 3], "workloads": [{}, dict(slots=4, head_slots=4, attention_qk=16)]}
    >>> flops_per_real_token(tiny, run) == forward_flops(tiny, Workload(4, 4, 16))["total"] / 3
    True
    >>> flops_per_real_token(tiny, {"warmup_steps": 0, "real_tokens": [3]}) is None
    True
    """
    if "workloads" not in result:
        return None
    tokens = sum(result["real_tokens"][result["warmup_steps"] :])
    return timed_flops(config, result)["total"] / tokens


def flop_ratio(config: Mapping[str, Any], result: Mapping[str, Any], baseline: Mapping[str, Any]) -> float | None:
    """How many times the FLOPs per real token of ``result`` the ``baseline`` run computed over its timed steps:
    the real-tokens/s ratio ``result`` would reach over ``baseline`` if time followed the counted FLOPs (for the
    same mini-batches simply the ratio of their FLOPs). None where either run has no recorded workloads."""
    mine, theirs = flops_per_real_token(config, result), flops_per_real_token(config, baseline)
    return None if mine is None or theirs is None else theirs / mine


#: Attention implementations that compute each packed example alone (no dense mask over the packed row).
_VARLEN = ("padfree", "flash_attention_2", "flash_attention_3", "flash_attention_4", "kernels-community/flash-attn")


def is_varlen(attn_implementation: str | None) -> bool:
    """Whether ``attn_implementation`` attends within each packed example only (sdpa and eager get a dense mask).

    >>> is_varlen("padfree"), is_varlen("flash_attention_2"), is_varlen("sdpa"), is_varlen(None)
    (True, True, False, False)
    """
    return attn_implementation in _VARLEN


def _np(value: Any) -> np.ndarray:
    return np.asarray(value.detach().cpu() if hasattr(value, "detach") else value)


def sft_workload(batch: Mapping[str, Any], varlen: bool) -> Workload:
    """The :class:`Workload` of a collated causal-LM batch as the model receives it; every position is scored.

    ``varlen``: the attention computes each packed example alone (``"padfree"``, flash attention); otherwise a
    packed row is one dense block-diagonal mask. A padded batch (``attention_mask``) is dense either way.

    >>> import torch
    >>> padded = {"input_ids": torch.zeros(2, 5, dtype=torch.long), "attention_mask": torch.ones(2, 5)}
    >>> sft_workload(padded, varlen=True)
    Workload(slots=10, head_slots=10, attention_qk=50)
    >>> packed = {"input_ids": torch.zeros(1, 7, dtype=torch.long), "position_ids": torch.tensor([[0, 1, 2, 3, 0, 1, 2]])}
    >>> sft_workload(packed, varlen=True), sft_workload(packed, varlen=False)  # 4^2 + 3^2; 7^2
    (Workload(slots=7, head_slots=7, attention_qk=25), Workload(slots=7, head_slots=7, attention_qk=49))
    """
    ids = batch["input_ids"]
    rows, width = int(ids.shape[0]), int(ids.shape[-1])
    slots = rows * width
    if "attention_mask" in batch or not varlen:
        return Workload(slots, slots, rows * width * width)
    if "cu_seq_lens_q" in batch:
        lengths = np.diff(_np(batch["cu_seq_lens_q"]).reshape(-1).astype(np.int64))
    else:
        starts = np.flatnonzero(_np(batch["position_ids"]).reshape(-1) == 0)
        lengths = np.diff([*starts.tolist(), slots])
    return Workload(slots, slots, int((lengths * lengths).sum()))
