"""TokenBudgetBatchSampler on its own: budget, whole examples, determinism, epochs, ranks (no model)."""

from __future__ import annotations

import random

import pytest
from torch.utils.data import DataLoader

from trl_padfree import TokenBudgetBatchSampler
from trl_padfree.batching import pack_next_fit


def flan_like_lengths(n: int = 300, seed: int = 0) -> list[int]:
    """Skewed lengths (lognormal, 8..512 tokens), as in the paper's FLAN-like data."""
    rng = random.Random(seed)
    return [min(512, max(8, int(rng.lognormvariate(5.0, 0.8)))) for _ in range(n)]


def test_batches_hold_whole_examples_within_budget_and_cover_the_first_pass_once():
    lengths = flan_like_lengths()
    sampler = TokenBudgetBatchSampler(lengths, max_tokens=1024, seed=3)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))  # epoch 0 = one pass, no repeats
    assert all(sum(lengths[i] for i in b) <= 1024 for b in batches)
    # next-fit: each batch but the last was closed because the next example did not fit
    for batch, following in zip(batches, batches[1:], strict=False):
        assert sum(lengths[i] for i in batch) + lengths[following[0]] > 1024
    assert len(sampler) == len(batches)


def test_an_example_longer_than_the_budget_is_a_batch_of_its_own():
    assert pack_next_fit([3, 50, 3, 3], [0, 1, 2, 3], max_tokens=10) == [[0], [1], [2, 3]]
    sampler = TokenBudgetBatchSampler([3, 50, 3, 3], max_tokens=10, shuffle=False)
    assert list(sampler) == [[0], [1], [2, 3]]


def test_same_seed_same_batches_other_seed_or_epoch_other_batches():
    lengths = flan_like_lengths()
    a = TokenBudgetBatchSampler(lengths, 2048, seed=7)
    b = TokenBudgetBatchSampler(lengths, 2048, seed=7)
    c = TokenBudgetBatchSampler(lengths, 2048, seed=8)
    assert list(a) == list(b)
    assert list(a) != list(c)
    first = list(a)
    a.set_epoch(1)
    second = list(a)
    assert second != first  # reshuffled
    assert len(second) == len(first) == len(a)  # the same number of batches every epoch
    a.set_epoch(0)
    assert list(a) == first  # an epoch is a pure function of the seed and the epoch


def test_epochs_are_consecutive_slices_of_one_stream_of_passes():
    lengths = flan_like_lengths(120)
    sampler = TokenBudgetBatchSampler(lengths, 700, seed=1)
    stream = pack_next_fit(lengths, sampler._order(0), 700) + pack_next_fit(lengths, sampler._order(1), 700)
    stream += pack_next_fit(lengths, sampler._order(2), 700)
    n = len(sampler)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        assert list(sampler) == stream[epoch * n : (epoch + 1) * n]


def test_ranks_get_the_same_number_of_disjoint_batches_with_balanced_tokens():
    lengths = flan_like_lengths(301)
    budget, world = 1500, 3
    samplers = [TokenBudgetBatchSampler(lengths, budget, seed=5, num_replicas=world, rank=r) for r in range(world)]
    single = TokenBudgetBatchSampler(lengths, budget, seed=5)
    for epoch in range(3):
        for s in samplers:
            s.set_epoch(epoch)
        per_rank = [list(s) for s in samplers]
        assert len({len(p) for p in per_rank}) == 1 and len(per_rank[0]) == len(samplers[0])
        steps = list(zip(*per_rank, strict=True))
        assert [b for step in steps for b in step] == samplers[0].global_batches(epoch)  # dealt out round-robin
        seen = [i for step in steps for b in step for i in b]
        if epoch == 0:
            assert set(seen) == set(range(len(lengths)))
            assert len(seen) - len(set(seen)) == sum(len(b) for b in seen_extra(single, world))
        # stated tolerance: within a step, real tokens differ by less than the longest example, except in a step
        # holding the last (under-filled) batch of a data pass
        ends = pass_last_batches(samplers[0], 3)
        for step in steps:
            if any(b in ends for b in step):
                continue
            tokens = [sum(lengths[i] for i in b) for b in step]
            assert max(tokens) - min(tokens) < max(lengths), (epoch, tokens)


def seen_extra(single: TokenBudgetBatchSampler, world: int) -> list[list[int]]:
    """The next pass's batches that complete the last step of epoch 0 (drop_last=False)."""
    k = len(single)
    extra = -k % world
    return pack_next_fit(single.lengths, single._order(1), single.max_tokens)[:extra]


def pass_last_batches(sampler: TokenBudgetBatchSampler, passes: int) -> list[list[int]]:
    return [pack_next_fit(sampler.lengths, sampler._order(p), sampler.max_tokens)[-1] for p in range(passes)]


def test_drop_last_leaves_out_the_incomplete_step():
    lengths = [4] * 10  # budget 8: five batches of two
    kept = TokenBudgetBatchSampler(lengths, 8, shuffle=False, num_replicas=2, rank=1, drop_last=True)
    assert list(kept) == [[2, 3], [6, 7]] and len(kept) == 2
    completed = TokenBudgetBatchSampler(lengths, 8, shuffle=False, num_replicas=2, rank=1)
    assert list(completed) == [[2, 3], [6, 7], [0, 1]] and len(completed) == 3  # next pass completes the step


def test_works_as_a_dataloader_batch_sampler():
    data = [{"n": n} for n in [5, 3, 8, 2, 7, 4]]
    loader = DataLoader(data, batch_sampler=TokenBudgetBatchSampler([5, 3, 8, 2, 7, 4], 10, shuffle=False),
                        collate_fn=lambda rows: [r["n"] for r in rows])
    assert list(loader) == [[5, 3], [8, 2], [7], [4]]
    assert len(loader) == 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lengths": [1, 2], "max_tokens": 0}, "max_tokens must be a positive integer"),
        ({"lengths": [], "max_tokens": 8}, "needs at least one example"),
        ({"lengths": [3, 0], "max_tokens": 8}, "example 1 has length 0"),
        ({"lengths": [3], "max_tokens": 8, "num_replicas": 2, "rank": 2}, "rank must be in [0, num_replicas=2)"),
        ({"lengths": [3], "max_tokens": 8, "num_replicas": 2, "drop_last": True}, "lower max_tokens or set drop_last"),
    ],
)
def test_bad_arguments_say_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError) as excinfo:
        TokenBudgetBatchSampler(**kwargs)
    assert message in str(excinfo.value)
