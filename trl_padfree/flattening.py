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
from itertools import chain
from typing import Any

import numpy as np
import torch


def _as_array(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy().astype(np.int64, copy=False).reshape(-1)
    return np.asarray(value, dtype=np.int64).reshape(-1)


def _concat(values: list[Any], total: int | None) -> np.ndarray:
    if total is not None and all(type(v) is list for v in values):  # the common case: lists from `datasets`
        return np.fromiter(chain.from_iterable(values), dtype=np.int64, count=total)
    return np.concatenate([_as_array(v) for v in values])


def flatten_features(
    features: Sequence[Mapping[str, Any]],
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Concatenate ``input_ids`` (and ``labels`` when every feature has them) of all examples.

    Returns ``(ids, labels_or_None, cu)`` where ``cu`` holds the example start offsets plus the total length.
    A feature carrying ``seq_lengths`` (a row TRL already packed) contributes one example per entry.
    """
    if not features:
        raise ValueError("the collator received an empty list of examples")
    try:
        id_values = [f["input_ids"] for f in features]
    except KeyError:
        i, f = next((i, f) for i, f in enumerate(features) if "input_ids" not in f)
        raise KeyError(
            f"example {i} has no 'input_ids' (keys: {sorted(f)}); tokenize the dataset first, or let "
            "SFTTrainer prepare it (do not set dataset_kwargs={'skip_prepare_dataset': True})."
        ) from None
    sizes = [len(v) if type(v) is list else _as_array(v).size for v in id_values]
    if 0 in sizes:
        raise ValueError(
            f"example {sizes.index(0)} has no tokens; drop empty examples from the dataset (SFTTrainer does this "
            "during dataset preparation)."
        )
    total = sum(sizes)
    ids = _concat(id_values, total)
    labels = None
    if all(f.get("labels") is not None for f in features):
        label_values = [f["labels"] for f in features]
        label_sizes = [len(v) if type(v) is list else _as_array(v).size for v in label_values]
        if label_sizes != sizes:
            i = next(i for i, (a, b) in enumerate(zip(label_sizes, sizes, strict=True)) if a != b)
            raise ValueError(f"example {i}: 'labels' has {label_sizes[i]} entries but 'input_ids' has {sizes[i]}")
        labels = _concat(label_values, total)
    lengths: list[int] = sizes
    if any("seq_lengths" in f for f in features):
        lengths = []
        for i, (f, size) in enumerate(zip(features, sizes, strict=True)):
            seq_lengths = f.get("seq_lengths")
            if seq_lengths is not None and len(seq_lengths) > 0:
                seq = [int(s) for s in seq_lengths]
                if sum(seq) != size:
                    raise ValueError(f"example {i}: seq_lengths {seq} do not add up to its {size} tokens")
                lengths.extend(seq)
            else:
                lengths.append(size)
    cu = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu[1:])
    return ids, labels, cu


def example_index(cu: np.ndarray) -> np.ndarray:
    """The example each token belongs to (``seq_idx``)."""
    return np.repeat(np.arange(cu.size - 1, dtype=np.int32), cu[1:] - cu[:-1])


def packed_batch(
    ids: np.ndarray, labels: np.ndarray, cu: np.ndarray, seq_idx: np.ndarray | None = None
) -> dict[str, Any]:
    """One row of all examples, with the sequence boundaries varlen attention needs (no attention mask)."""
    n = int(cu[-1])
    if seq_idx is None:
        seq_idx = example_index(cu)
    position_ids = np.arange(n, dtype=np.int64) - cu[seq_idx]
    cu_t = torch.from_numpy(cu.astype(np.int32))
    max_len = int((cu[1:] - cu[:-1]).max()) if cu.size > 1 else 0
    return {
        "input_ids": torch.from_numpy(ids.reshape(1, n)),
        "labels": torch.from_numpy(labels.reshape(1, n)),
        "position_ids": torch.from_numpy(position_ids.reshape(1, n)),
        "cu_seq_lens_q": cu_t,
        "cu_seq_lens_k": cu_t,  # the same boundaries for queries and keys (read-only)
        "max_length_q": max_len,
        "max_length_k": max_len,
        "seq_idx": torch.from_numpy(seq_idx.astype(np.int32, copy=False).reshape(1, n)),
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
