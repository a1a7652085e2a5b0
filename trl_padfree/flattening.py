"""Flattening a list of examples into one row (padding-free) or padding them into a rectangle.

Both layouts are built from the same flat arrays, so their labels are identical by construction.

Example:
    >>> ids, labels, cu = flatten_features([{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}])
    >>> ids.tolist(), labels, cu.tolist()
    ([5, 6, 7, 8, 9], None, [0, 3, 5])
    >>> batch = packed_batch(ids, ids.copy(), cu)
    >>> batch["position_ids"].tolist(), batch["cu_seq_lens_q"].tolist(), batch["max_length_q"]
    ([[0, 1, 2, 0, 1]], [0, 3, 5], 3)
    >>> batch["seq_idx"].tolist()
    [[0, 0, 0, 1, 1]]
    >>> padded = padded_batch(ids, ids.copy(), cu, pad_id=0, ignore_index=-100)
    >>> padded["input_ids"].tolist(), padded["attention_mask"].tolist()
    ([[5, 6, 7], [8, 9, 0]], [[1, 1, 1], [1, 1, 0]])
    >>> padded["labels"].tolist()
    [[5, 6, 7], [8, 9, -100]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch


def _as_array(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy().astype(np.int64, copy=False).reshape(-1)
    return np.asarray(value, dtype=np.int64).reshape(-1)


def flatten_features(
    features: Sequence[Mapping[str, Any]],
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Concatenate ``input_ids`` (and ``labels`` when every feature has them) of all examples.

    Returns ``(ids, labels_or_None, cu)`` where ``cu`` holds the example start offsets plus the total length.
    A feature carrying ``seq_lengths`` (a row TRL already packed) contributes one example per entry.
    """
    if not features:
        raise ValueError("the collator received an empty list of examples")
    arrays, label_arrays, lengths = [], [], []
    has_labels = all("labels" in f and f["labels"] is not None for f in features)
    for i, f in enumerate(features):
        if "input_ids" not in f:
            raise KeyError(
                f"example {i} has no 'input_ids' (keys: {sorted(f)}); tokenize the dataset first, or let "
                "SFTTrainer prepare it (do not set dataset_kwargs={'skip_prepare_dataset': True})."
            )
        ids = _as_array(f["input_ids"])
        arrays.append(ids)
        if has_labels:
            lab = _as_array(f["labels"])
            if lab.size != ids.size:
                raise ValueError(f"example {i}: 'labels' has {lab.size} entries but 'input_ids' has {ids.size}")
            label_arrays.append(lab)
        seq_lengths = f.get("seq_lengths")
        if seq_lengths is not None and len(seq_lengths) > 0:
            seq = [int(s) for s in seq_lengths]
            if sum(seq) != ids.size:
                raise ValueError(f"example {i}: seq_lengths {seq} do not add up to its {ids.size} tokens")
            lengths.extend(seq)
        else:
            lengths.append(ids.size)
    ids = np.concatenate(arrays)
    labels = np.concatenate(label_arrays) if has_labels else None
    cu = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu[1:])
    return ids, labels, cu


def packed_batch(ids: np.ndarray, labels: np.ndarray, cu: np.ndarray) -> dict[str, Any]:
    """One row of all examples, with the sequence boundaries varlen attention needs (no attention mask)."""
    lengths = np.diff(cu)
    n = int(cu[-1])
    position_ids = np.arange(n, dtype=np.int64) - np.repeat(cu[:-1], lengths)
    seq_idx = np.repeat(np.arange(lengths.size, dtype=np.int32), lengths)
    cu_t = torch.from_numpy(cu.astype(np.int32))
    max_len = int(lengths.max()) if lengths.size else 0
    return {
        "input_ids": torch.from_numpy(ids).view(1, n),
        "labels": torch.from_numpy(labels).view(1, n),
        "position_ids": torch.from_numpy(position_ids).view(1, n),
        "cu_seq_lens_q": cu_t,
        "cu_seq_lens_k": cu_t.clone(),
        "max_length_q": max_len,
        "max_length_k": max_len,
        "seq_idx": torch.from_numpy(seq_idx).view(1, n),
    }


def padded_length(lengths: np.ndarray, pad_to_multiple_of: int | None = None) -> int:
    """The row length a padded batch of these examples has."""
    width = int(lengths.max()) if lengths.size else 0
    if pad_to_multiple_of:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    return width


def padded_batch(
    ids: np.ndarray,
    labels: np.ndarray,
    cu: np.ndarray,
    *,
    pad_id: int,
    ignore_index: int,
    padding_side: str = "right",
    pad_to_multiple_of: int | None = None,
) -> dict[str, torch.Tensor]:
    """The ordinary rectangular batch: padding is masked by *position* (attention_mask 0, label ignore_index)."""
    lengths = np.diff(cu)
    width = padded_length(lengths, pad_to_multiple_of)
    rows = lengths.size
    col = np.arange(width)[None, :]
    if padding_side == "left":
        valid = col >= (width - lengths)[:, None]
    elif padding_side == "right":
        valid = col < lengths[:, None]
    else:
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    out_ids = np.full((rows, width), pad_id, dtype=np.int64)
    out_labels = np.full((rows, width), ignore_index, dtype=np.int64)
    out_ids[valid] = ids
    out_labels[valid] = labels
    return {
        "input_ids": torch.from_numpy(out_ids),
        "attention_mask": torch.from_numpy(valid.astype(np.int64)),
        "labels": torch.from_numpy(out_labels),
    }
