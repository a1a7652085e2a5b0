"""Which examples go into which mini-batch (fixed batches, or a token budget), and a fingerprint of the batch a
model really received, so that "the same mini-batches in every variant" is checked rather than assumed.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def fixed_batches(examples: Sequence[list[int]], batch_size: int) -> list[list[list[int]]]:
    """Consecutive mini-batches of ``batch_size`` examples, in order (the paper's fixed mini-batches).

    >>> fixed_batches([[1], [2], [3], [4]], 2)
    [[[1], [2]], [[3], [4]]]
    """
    return [list(examples[i : i + batch_size]) for i in range(0, len(examples), batch_size)]


def token_budget_batches(examples: Sequence[list[int]], max_tokens: int, seed: int) -> list[list[list[int]]]:
    """Mini-batches of whole examples chosen by :class:`trl_padfree.batching.TokenBudgetBatchSampler` (one epoch,
    shuffled with ``seed``): each holds as many examples as fit ``max_tokens`` real tokens."""
    from trl_padfree.batching import TokenBudgetBatchSampler

    sampler = TokenBudgetBatchSampler([len(e) for e in examples], max_tokens, shuffle=True, seed=seed)
    sampler.set_epoch(0)
    return [[examples[i] for i in indices] for indices in sampler]


def batch_fingerprint(batch: Mapping[str, Any]) -> str:
    """``"<examples>x<real tokens>:<crc32>"`` of a collated batch: its examples' real token ids in order and their
    lengths. A padded batch and the padding-free batch of the same examples, in the same order, get the same
    fingerprint (whichever collator built them: this project's or TRL's).

    >>> import torch
    >>> padded = {"input_ids": torch.tensor([[1, 2, 3], [4, 5, 0]]),
    ...           "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]])}
    >>> packed = {"input_ids": torch.tensor([[1, 2, 3, 4, 5]]), "position_ids": torch.tensor([[0, 1, 2, 0, 1]])}
    >>> batch_fingerprint(padded) == batch_fingerprint(packed), batch_fingerprint(packed)[:4]
    (True, '2x5:')
    >>> swapped = {"input_ids": torch.tensor([[4, 5, 1, 2, 3]]), "position_ids": torch.tensor([[0, 1, 0, 1, 2]])}
    >>> batch_fingerprint(swapped) == batch_fingerprint(packed)  # same tokens, other order
    False
    """
    ids = batch["input_ids"].detach().cpu()
    if "attention_mask" in batch:
        mask = batch["attention_mask"].detach().cpu().bool()
        real = ids[mask]
        lengths = mask.sum(dim=-1).tolist()
    else:
        real = ids.reshape(-1)
        starts = (batch["position_ids"].detach().cpu().reshape(-1) == 0).nonzero().flatten().tolist()
        lengths = np.diff([*starts, real.numel()]).tolist()
    crc = zlib.crc32(np.asarray(real, dtype=np.int64).tobytes())
    crc = zlib.crc32(np.asarray(lengths, dtype=np.int64).tobytes(), crc)
    return f"{len(lengths)}x{real.numel()}:{crc:08x}"
