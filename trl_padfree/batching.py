"""Token-budget batching: mini-batches of whole examples whose real tokens fit a budget (opt-in).

Fixed-size mini-batches (the paper's setting, and the default everywhere in this package) make peak memory depend
on the unluckiest batch: eight long examples cost eight times one. :class:`TokenBudgetBatchSampler` instead fills
each mini-batch with as many whole examples as fit ``max_tokens`` real tokens (padding-free batches hold exactly
their real tokens, so the budget bounds the batch), in a shuffled order:

- **next-fit**: examples are taken in the shuffled order; a batch is closed when the next example does not fit. An
  example longer than the budget is a batch of its own (the caller decides whether such examples may exist: the
  launch truncates to ``max_length`` first). Examples are never cut.
- **the same number of batches every epoch**: the data passes (one shuffled permutation per pass, seeded by
  ``seed + pass``) are packed one after the other into one stream of batches, and epoch ``e`` is the batches
  ``[e * N * R, (e + 1) * N * R)`` of that stream (``R`` ranks, ``N = len(sampler)``, fixed by the first pass).
  Epoch 0 is exactly the first pass (with ``drop_last=False``, plus the first batches of the next pass to give
  every rank the same count); later epoch boundaries can fall a few batches inside a pass, since the same examples
  in another order pack into a slightly different number of batches. A constant ``len()`` is what the Trainer's
  step arithmetic assumes, and it makes resuming from a checkpoint exact: epoch ``e`` is a pure function of
  ``(lengths, max_tokens, seed, e)``, so skipping its first ``k`` batches gives the same batches as an
  uninterrupted run.
- **ranks**: the stream is dealt out round-robin, batch ``i`` of a step to rank ``i``; every rank gets ``N``
  batches per epoch. A pass ends with one batch that may be under-filled; every other batch holds more than
  ``max_tokens - longest example`` tokens (or is one over-long example), so within a step the ranks' real-token
  counts differ by less than the longest example, except in a step that holds the last batch of a pass.

The budget counts real tokens. With padded batches (``padding_free=False``) a batch costs ``examples x longest``
instead, which the budget does not bound.

Example:
    >>> sampler = TokenBudgetBatchSampler([5, 3, 8, 2, 7, 4], max_tokens=10, shuffle=False)
    >>> list(sampler)
    [[0, 1], [2, 3], [4], [5]]
    >>> len(sampler)
    4
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Sampler

__all__ = ["TokenBudgetBatchSampler", "pack_next_fit"]


def pack_next_fit(lengths: Sequence[int], order: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Split ``order`` (dataset indices) into consecutive batches of at most ``max_tokens`` tokens.

    A batch is closed when the next example does not fit; an example longer than ``max_tokens`` is a batch alone.

    >>> pack_next_fit([4, 4, 4, 12, 1], [0, 1, 2, 3, 4], max_tokens=8)
    [[0, 1], [2], [3], [4]]
    """
    batches: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for index in order:
        length = lengths[index]
        if current and tokens + length > max_tokens:
            batches.append(current)
            current, tokens = [], 0
        current.append(index)
        tokens += length
    if current:
        batches.append(current)
    return batches


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Batches of whole examples within ``max_tokens`` real tokens, for one rank (see the module docstring).

    Args:
        lengths: the number of tokens of every example of the dataset (after truncation), by index.
        max_tokens: the token budget of one mini-batch (of one rank).
        shuffle: a new seeded permutation for every pass over the data (else the dataset order every pass).
        seed: the seed of the permutations; the same seed gives the same batches.
        num_replicas: the number of data-parallel ranks.
        rank: this rank, in ``[0, num_replicas)``.
        drop_last: per epoch, leave out the first pass's last batches that would not give every rank one more
            (``N = K // num_replicas`` for a first pass of ``K`` batches) instead of completing the last step
            with the next pass's first batches (``N = ceil(K / num_replicas)``).

    Use it as a ``batch_sampler``: ``DataLoader(dataset, batch_sampler=sampler, collate_fn=collator)``, and call
    :meth:`set_epoch` before each epoch.
    """

    def __init__(
        self, lengths: Sequence[int], max_tokens: int, *, shuffle: bool = True, seed: int = 0,
        num_replicas: int = 1, rank: int = 0, drop_last: bool = False,
    ) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer (tokens per mini-batch), got {max_tokens!r}")
        if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
            raise ValueError(f"num_replicas must be a positive integer, got {num_replicas!r}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, num_replicas={num_replicas}), got {rank!r}")
        self.lengths = [int(n) for n in lengths]
        if not self.lengths:
            raise ValueError("TokenBudgetBatchSampler needs at least one example (lengths is empty)")
        bad = next((i for i, n in enumerate(self.lengths) if n < 1), None)
        if bad is not None:
            raise ValueError(f"every example needs at least one token; example {bad} has length {self.lengths[bad]}")
        self.max_tokens = max_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.drop_last = drop_last
        self.epoch = 0
        self._pass_sizes: list[int] = []  # number of batches of each data pass packed so far
        first = self._pass_size(0)
        self.num_batches = first // num_replicas if drop_last else math.ceil(first / num_replicas)
        if self.num_batches == 0:
            raise ValueError(
                f"max_tokens={max_tokens} packs the {len(self.lengths)} examples into {first} batch(es), fewer than "
                f"the {num_replicas} ranks, and drop_last=True leaves none: lower max_tokens or set drop_last=False"
            )

    # ------------------------------------------------------------------ the stream of batches
    def _order(self, data_pass: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.lengths)))
        generator = torch.Generator().manual_seed(self.seed + data_pass)
        return torch.randperm(len(self.lengths), generator=generator).tolist()

    def _pack(self, data_pass: int) -> list[list[int]]:
        return pack_next_fit(self.lengths, self._order(data_pass), self.max_tokens)

    def _pass_size(self, data_pass: int) -> int:
        while len(self._pass_sizes) <= data_pass:
            self._pass_sizes.append(len(self._pack(len(self._pass_sizes))))
        return self._pass_sizes[data_pass]

    def global_batches(self, epoch: int) -> list[list[int]]:
        """All ranks' batches of ``epoch``, in stream order (batch ``i`` goes to rank ``i % num_replicas``)."""
        start = epoch * self.num_batches * self.num_replicas
        stop = start + self.num_batches * self.num_replicas
        out: list[list[int]] = []
        data_pass, first_of_pass = 0, 0
        while first_of_pass < stop:
            size = self._pass_size(data_pass)
            if first_of_pass + size > start:  # this pass holds batches of the epoch
                batches = self._pack(data_pass)
                lo, hi = max(start - first_of_pass, 0), min(stop - first_of_pass, size)
                out.extend(batches[lo:hi])
            first_of_pass += size
            data_pass += 1
        return out

    # ------------------------------------------------------------------ Sampler API
    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch that the next ``iter()`` yields (the Trainer calls this before every epoch)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.global_batches(self.epoch)
        yield from batches[self.rank :: self.num_replicas]

    def __len__(self) -> int:
        return self.num_batches
