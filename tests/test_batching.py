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
    assert all(sum(lengths[i] for i in b) <= 1024 for b in batches) and len(sampler) == len(batches)
    # next-fit: each batch but the last was closed because the next example did not fit
    for batch, following in zip(batches, batches[1:], strict=False):
        assert sum(lengths[i] for i in batch) + lengths[following[0]] > 1024
    # an example longer than the budget is a batch of its own
    assert list(TokenBudgetBatchSampler([3, 50, 3, 3], max_tokens=10, shuffle=False)) == [[0], [1], [2, 3]]


def test_same_seed_same_batches_other_seed_or_epoch_other_batches():
    lengths = flan_like_lengths()
    a, b, c = (TokenBudgetBatchSampler(lengths, 2048, seed=seed) for seed in (7, 7, 8))
    first = list(a)
    assert first == list(b) and first != list(c)
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
            # the next pass's batches that complete epoch 0's last step (drop_last=False) repeat examples
            extra = pack_next_fit(lengths, single._order(1), budget)[: -len(single) % world]
            assert len(seen) - len(set(seen)) == sum(len(b) for b in extra)
        # stated tolerance: within a step, real tokens differ by less than the longest example, except in a step
        # holding the last (under-filled) batch of a data pass
        ends = [pack_next_fit(lengths, samplers[0]._order(p), budget)[-1] for p in range(3)]
        for step in steps:
            if any(b in ends for b in step):
                continue
            tokens = [sum(lengths[i] for i in b) for b in step]
            assert max(tokens) - min(tokens) < max(lengths), (epoch, tokens)


def test_drop_last_leaves_out_the_incomplete_step():
    lengths = [4] * 10  # budget 8: five batches of two
    kept = TokenBudgetBatchSampler(lengths, 8, shuffle=False, num_replicas=2, rank=1, drop_last=True)
    assert list(kept) == [[2, 3], [6, 7]] and len(kept) == 2
    completed = TokenBudgetBatchSampler(lengths, 8, shuffle=False, num_replicas=2, rank=1)
    assert list(completed) == [[2, 3], [6, 7], [0, 1]] and len(completed) == 3  # next pass completes the step


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"lengths": [1, 2], "max_tokens": 0}, "max_tokens must be a positive integer"),
    ({"lengths": [], "max_tokens": 8}, "needs at least one example"),
    ({"lengths": [3, 0], "max_tokens": 8}, "example 1 has length 0"),
    ({"lengths": [3], "max_tokens": 8, "num_replicas": 2, "rank": 2}, "rank must be in [0, num_replicas=2)"),
    ({"lengths": [3], "max_tokens": 8, "num_replicas": 2, "drop_last": True}, "lower max_tokens or set drop_last"),
])
def test_bad_arguments_say_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError) as excinfo:
        TokenBudgetBatchSampler(**kwargs)
    assert message in str(excinfo.value)


def test_accelerate_sharding_is_a_pass_through_and_set_epoch_reaches_the_sampler_after_a_skip():
    """Resuming rank 1 of 2 mid-epoch: accelerate's shard, skip_first_batches, then set_epoch."""
    from accelerate.data_loader import prepare_data_loader, skip_first_batches

    from trl_padfree.trainer import keep_rank_batches

    lengths = flan_like_lengths(90)
    sampler = TokenBudgetBatchSampler(lengths, 900, seed=2, num_replicas=2, rank=1)
    loader = prepare_data_loader(DataLoader(list(range(90)), batch_sampler=sampler, collate_fn=list),
                                 num_processes=2, process_index=1, put_on_device=False)
    assert list(loader) != list(sampler)  # accelerate re-shards the rank's batches: half of them are lost
    keep_rank_batches(loader, sampler)
    assert list(loader) == list(sampler)
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    sampler.set_epoch(0)
    resumed = skip_first_batches(loader, 2)
    wrapper = resumed.batch_sampler.batch_sampler  # the Trainer's `underlying_sampler`
    wrapper.set_epoch(1)
    assert list(resumed) == epoch1[2:]


def test_trainer_token_budget_batches_and_exact_loss_normalisation(tok, tmp_path):
    """One SGD step over 2 token-budget micro-batches = lr x grad of the step's token-mean loss."""
    import torch
    from tiny_sft import make_trainer, tokenized_dataset, weights

    data = tokenized_dataset(tok, 40)
    budget, lr = 160, 0.5
    trainer = make_trainer(True, data, tok, str(tmp_path / "run"), max_tokens_per_batch=budget,
                           gradient_accumulation_steps=2, max_steps=1, optim="sgd", learning_rate=lr,
                           max_grad_norm=0.0)
    start = weights(trainer)
    trainer.train()
    sampler = trainer.token_budget_sampler
    first, second = sampler.global_batches(0)[:2]
    assert [len(b) for b in trainer.batch_ids] == [len(first), len(second)] and len(first) > 1
    assert trainer.batch_ids == [[data[i]["input_ids"] for i in batch] for batch in (first, second)]
    assert all(sum(len(ids) for ids in b) <= budget for b in trainer.batch_ids)
    assert trainer.num_items == [sum(trainer.trained_tokens)] * 2  # both micro-batches' trained tokens

    # by hand: one flattened batch of all the step's examples, token-mean loss, one SGD step
    reference = make_trainer(True, data, tok, str(tmp_path / "ref"))
    model = reference.model
    batch = reference.data_collator([{"input_ids": data[i]["input_ids"]} for i in first + second])
    labels = batch.pop("labels")
    logits = model(**batch).logits.float()
    loss = torch.nn.functional.cross_entropy(logits[0, :-1], labels[0, 1:], ignore_index=-100, reduction="mean")
    loss.backward()
    expected = {name: start[name] - lr * p.grad for name, p in model.named_parameters()}
    trained = weights(trainer)
    for name, value in expected.items():
        torch.testing.assert_close(trained[name], value, rtol=1e-5, atol=1e-7, msg=name)
    assert trainer.state.log_history[0]["loss"] == pytest.approx(loss.item(), rel=1e-5)


def test_trainer_resume_from_a_checkpoint_gives_the_same_batches(tok, tmp_path):
    """Resumed after epoch 1's first batch: exactly the batches and losses of the uninterrupted run."""
    from tiny_sft import losses, make_trainer, tokenized_dataset

    data = tokenized_dataset(tok, 24)
    config = dict(max_tokens_per_batch=200, max_steps=-1, num_train_epochs=2, save_strategy="steps")
    full = make_trainer(True, data, tok, str(tmp_path / "full"), save_steps=1000, **config)
    per_epoch = len(full.get_train_dataloader())
    assert per_epoch >= 3
    full.args.save_steps = per_epoch + 1  # a checkpoint after the first batch of epoch 1
    full.train()
    batches = full.batch_ids
    assert len(batches) == 2 * per_epoch and batches[:per_epoch] != batches[per_epoch:]  # reshuffled
    resumed = make_trainer(True, data, tok, str(tmp_path / "full"), save_steps=1000, **config)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / f"checkpoint-{per_epoch + 1}"))
    assert resumed.batch_ids == batches[per_epoch + 1 :]
    assert losses(resumed)[per_epoch + 1 :] == pytest.approx(losses(full)[per_epoch + 1 :], rel=1e-5)


def test_launch_max_tokens_per_batch(tmp_path):
    """``--max_tokens_per_batch N``: every step trains at most N real tokens; the run records it."""
    import json

    from paths import CONFIGS, DEMO, DEMO_MODEL

    from trl_padfree.launch import main

    (tmp_path / "train.jsonl").write_text(
        "\n".join((DEMO / "data" / "train.jsonl").read_text(encoding="utf-8").splitlines()[:60]) + "\n")
    out = tmp_path / "out"
    code = main(["--config", str(CONFIGS / "demo.yaml"), "--model_name_or_path", str(DEMO_MODEL),
                 "--train_file", str(tmp_path / "train.jsonl"), "--output_dir", str(out), "--max_steps", "4",
                 "--eval_strategy", "no", "--eval_on_start", "false", "--logging_steps", "1",
                 "--max_tokens_per_batch", "600", "--check_packing", "false"])
    assert code == 0
    summary = json.loads((out / "launch_summary.json").read_text())
    assert summary["max_tokens_per_batch"] == 600 and summary["world_size"] == 1
    seen = [e["num_tokens"] for e in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in e]
    per_step = [b - a for a, b in zip([0.0, *seen], seen, strict=False)]
    assert len(per_step) == 4 and all(0 < n <= 600 for n in per_step), per_step
