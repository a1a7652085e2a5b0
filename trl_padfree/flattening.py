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

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .inputs import read_examples


def flatten_features(
    features: Sequence[Any], *, vocab_size: int | None = None, ignore_index: int = -100,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Concatenate ``input_ids`` (and ``labels`` when any example has them) of all examples.

    Returns ``(ids, labels_or_None, cu)`` where ``cu`` holds the example start offsets plus the total length.
    Examples are read and checked by :func:`~trl_padfree.inputs.read_examples` (dicts or bare token ids; an example
    without labels in a batch where others have them gets its ``input_ids``). A feature carrying ``seq_lengths``
    (a row TRL already packed) contributes one example per entry.
    """
    examples = read_examples(features, vocab_size=vocab_size, ignore_index=ignore_index)
    sizes = examples.sizes
    if 0 in sizes:
        raise ValueError(
            f"example {sizes.index(0)} has no tokens; drop empty examples from the dataset (SFTTrainer does this "
            "during dataset preparation)."
        )
    lengths: list[int] = sizes
    if examples.seq_lengths is not None:
        lengths = []
        for i, (seq_lengths, size) in enumerate(zip(examples.seq_lengths, sizes, strict=True)):
            if seq_lengths is not None and len(seq_lengths) > 0:
                seq = [int(s) for s in seq_lengths]
                if sum(seq) != size:
                    raise ValueError(f"example {i}: seq_lengths {seq} do not add up to its {size} tokens")
                lengths.extend(seq)
            else:
                lengths.append(size)
    cu = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu[1:])
    return examples.ids, examples.labels, cu


def example_index(cu: np.ndarray) -> np.ndarray:
    """The example each token belongs to (``seq_idx``)."""
    return np.repeat(np.arange(cu.size - 1, dtype=np.int32), cu[1:] - cu[:-1])


def packed_batch(
    ids: np.ndarray, labels: np.ndarray, cu: np.ndarray, seq_idx: np.ndarray | None = None, *,
    pad_to_multiple_of: int | None = None, pad_id: int = 0, ignore_index: int = -100,
) -> dict[str, Any]:
    """One row of all examples, with the sequence boundaries varlen attention needs (no attention mask).

    With ``pad_to_multiple_of``, the row is padded at its end to the next multiple (as TRL 1.x does), and the padding
    is a segment of its own: one more entry in ``cu_seq_lens``, its own ``seq_idx``, positions restarting at 0 and
    labels ``ignore_index``; ``max_length`` counts it. So no example attends to it or is continued by it, and loss and
    gradients are those of the row without padding. A row already at a multiple gets nothing.

    >>> ids = np.array([5, 6, 7, 8, 9])
    >>> b = packed_batch(ids, ids.copy(), np.array([0, 3, 5]), pad_to_multiple_of=4, pad_id=0)
    >>> b["input_ids"].tolist(), b["labels"].tolist(), b["position_ids"].tolist()
    ([[5, 6, 7, 8, 9, 0, 0, 0]], [[5, 6, 7, 8, 9, -100, -100, -100]], [[0, 1, 2, 0, 1, 0, 1, 2]])
    >>> b["cu_seq_lens_q"].tolist(), b["seq_idx"].tolist(), b["max_length_q"]
    ([0, 3, 5, 8], [[0, 0, 0, 1, 1, 2, 2, 2]], 3)
    """
    if seq_idx is None:
        seq_idx = example_index(cu)
    extra = -int(cu[-1]) % pad_to_multiple_of if pad_to_multiple_of else 0
    if extra:
        ids = np.concatenate([ids, np.full(extra, pad_id, dtype=np.int64)])
        labels = np.concatenate([labels, np.full(extra, ignore_index, dtype=np.int64)])
        seq_idx = np.concatenate([seq_idx, np.full(extra, cu.size - 1, dtype=seq_idx.dtype)])
        cu = np.append(cu, cu[-1] + extra)
    n = int(cu[-1])
    position_ids = np.arange(n, dtype=np.int64) - cu[seq_idx]
    cu_t = torch.from_numpy(cu.astype(np.int32))
    max_len = int((cu[1:] - cu[:-1]).max()) if cu.size > 1 else 0
    # cu_seq_lens_k: the same boundaries (read-only) as cu_seq_lens_q
    return {"input_ids": torch.from_numpy(ids.reshape(1, n)), "labels": torch.from_numpy(labels.reshape(1, n)),
            "position_ids": torch.from_numpy(position_ids.reshape(1, n)), "cu_seq_lens_q": cu_t, "cu_seq_lens_k": cu_t,
            "max_length_q": max_len, "max_length_k": max_len,
            "seq_idx": torch.from_numpy(seq_idx.astype(np.int32, copy=False).reshape(1, n))}


def padded_length(lengths: np.ndarray, pad_to_multiple_of: int | None = None) -> int:
    """The row length a padded batch of these examples has."""
    width = int(lengths.max()) if lengths.size else 0
    if pad_to_multiple_of:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    return width


def padded_batch(
    ids: np.ndarray, labels: np.ndarray, cu: np.ndarray, *, pad_id: int, ignore_index: int,
    padding_side: str = "right", pad_to_multiple_of: int | None = None,
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
