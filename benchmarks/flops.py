"""The benchmark's one FLOP model: matmul FLOPs of every forward the models really ran, from the batch as the model
received it (2 FLOPs per multiply-add; a forward with gradients counts 3 forwards: forward + backward).

- linear layers per token slot fed to the model (a padded row's padding included), per layer: q/k/v/o
  ``2 (2 d^2 + 2 d d_kv)`` and the MLP ``2 * 3 d I``;
- attention per layer ``4 d`` per query-key pair the kernel is given, full rectangles (no causal halving): a padded
  row ``T^2``; a packed row ``sum(q_len * k_len)`` over its segments under a varlen kernel (``"padfree"``, flash
  attention), ``T^2`` under sdpa or eager (a dense block-diagonal mask); a hybrid model's gated-delta-rule layer
  costs ``2 C (3 d_k + 2 d_v) + 6 d_k d_v`` per value head and token slot, each sequence rounded up to the chunk
  ``C = 64`` (transformers' ``torch_chunk_gated_delta_rule``);
- the LM head ``2 d V`` per position projected: every position, ``logits_to_keep`` positions when given, the
  labelled ones under this package's scored-positions head;
- not counted: embeddings, norms, RoPE, activations, softmax, the loss, the optimizer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

VARLEN = ("padfree", "flash_attention_2", "flash_attention_3", "kernels-community/flash-attn")
CHUNK = 64


def _np(x: Any) -> np.ndarray:
    return np.asarray(x.detach().cpu() if hasattr(x, "detach") else x).astype(np.int64).reshape(-1)


def workload(kwargs: Mapping[str, Any], attn: str | None, scored: bool = False) -> dict[str, Any]:
    """Token slots, LM-head positions, query-key pairs and sequence lengths of one forward's keyword arguments.

    >>> import torch
    >>> padded = {"input_ids": torch.zeros(2, 5), "attention_mask": torch.ones(2, 5)}
    >>> workload(padded, "sdpa")
    {'slots': 10, 'head': 10, 'qk': 50, 'lengths': [5, 5]}
    >>> packed = {"input_ids": torch.zeros(1, 7), "position_ids": torch.tensor([[0, 1, 2, 3, 0, 1, 2]])}
    >>> workload(packed, "padfree")["qk"], workload(packed, "sdpa")["qk"]  # 4^2 + 3^2; 7^2
    (25, 49)
    >>> once = {"input_ids": torch.zeros(1, 6), "cu_seq_lens_q": torch.tensor([0, 4, 6]),
    ...         "cu_seq_lens_k": torch.tensor([0, 4, 7])}
    >>> workload(once, "padfree")["qk"]  # 4 x 4 + 2 x 3
    22
    """
    ids = kwargs.get("input_ids")
    rows, width = map(int, ids.shape if ids is not None else kwargs["inputs_embeds"].shape[:2])
    slots = rows * width
    cu_q, positions = kwargs.get("cu_seq_lens_q"), kwargs.get("position_ids")
    if attn in VARLEN and cu_q is not None:
        q, k = np.diff(_np(cu_q)), np.diff(_np(kwargs.get("cu_seq_lens_k", cu_q)))
        lengths, qk = q.tolist(), int((q * k).sum())
    elif attn in VARLEN and kwargs.get("attention_mask") is None and positions is not None and rows == 1:
        q = np.diff([*np.flatnonzero(_np(positions) == 0), slots])  # a sequence starts at each position 0
        lengths, qk = q.tolist(), int((q * q).sum())
    else:  # padded rows, or a packed row under a dense mask
        lengths, qk = [width] * rows, rows * width * width
    keep, labels = kwargs.get("logits_to_keep"), kwargs.get("shift_labels", kwargs.get("labels"))
    head = rows * keep if isinstance(keep, int) and keep > 0 else slots
    if scored and kwargs.get("fused_lm_head") and labels is not None:
        head = int((_np(labels) != -100).sum())
    return {"slots": slots, "head": head, "qk": qk, "lengths": lengths}


def forward_flops(shape: Mapping[str, int], work: Mapping[str, Any], hybrid: bool = False) -> float:
    """Matmul FLOPs of one forward of the model of ``shape`` over ``work`` (:func:`workload`).

    >>> tiny = dict(layers=4, hidden=256, intermediate=688, heads=8, kv_heads=4, vocab_size=2048)
    >>> forward_flops(tiny, {"slots": 1, "head": 1, "qk": 1, "lengths": [1]})
    6852608
    """
    d, layers, v = shape["hidden"], shape["layers"], shape["vocab_size"]
    d_kv = shape["kv_heads"] * (d // shape["heads"])
    mlp = 2 * 3 * d * shape["intermediate"]
    attention_layer = 2 * (2 * d * d + 2 * d * d_kv) + mlp
    head = 2 * d * v * work["head"]
    if not hybrid:
        return layers * (attention_layer * work["slots"] + 4 * d * work["qk"]) + head
    full = layers // 4
    linear = layers - full
    key, value, heads_v = 4 * 32, 8 * 32, 8  # linear_num_key_heads 4, value heads 8, head dims 32 (workloads.py)
    conv = 2 * key + value
    linear_slot = 2 * d * (conv + value + 2 * heads_v) + 2 * value * d + mlp + 2 * 4 * conv
    q_dim = d  # full attention: q with its output gate (2 q_dim), k, v, o
    full_slot = 2 * d * (2 * q_dim + 2 * d_kv) + 2 * q_dim * d + mlp
    chunk_slots = sum(-(-n // CHUNK) * CHUNK for n in work["lengths"])
    recurrence = heads_v * (2 * CHUNK * (3 * 32 + 2 * 32) + 6 * 32 * 32)
    return (full * (full_slot * work["slots"] + 4 * q_dim * work["qk"])
            + linear * (linear_slot * work["slots"] + recurrence * chunk_slots) + head)
