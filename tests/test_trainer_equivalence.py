"""Padding-free trains the same model as padding through the real ``SFTTrainer`` (CPU, fp32, AdamW): losses,
final weights and ``num_items_in_batch``, with gradient accumulation and on 2 DDP ranks."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_sft import losses, make_trainer, max_rel_diff, tokenized_dataset, weights
from two_ranks import run_on_two_ranks

LOSS_RTOL, WEIGHT_RTOL = 1e-5, 1e-4


def test_gradient_accumulation_padded_and_padding_free_train_the_same_model(tok, tmp_path):
    data = tokenized_dataset(tok, 48)
    runs, eval_loss = {}, {}
    for padding_free in (False, True):
        trainer = make_trainer(padding_free, data, tok, str(tmp_path / str(padding_free)),
                               per_device_train_batch_size=4, gradient_accumulation_steps=4, max_steps=3)
        trainer.train()
        runs[padding_free] = trainer
        eval_loss[padding_free] = trainer.evaluate(tokenized_dataset(tok, 16, seed=1))["eval_loss"]
    assert eval_loss[True] == pytest.approx(eval_loss[False], rel=1e-5)
    padded, flat = runs[False], runs[True]
    # the same examples in the same micro-batches, and the same trained-token count for the loss normaliser
    assert flat.batch_ids == padded.batch_ids and len(flat.batch_ids) == 12
    assert flat.trained_tokens == padded.trained_tokens
    assert flat.num_items == padded.num_items
    # num_items_in_batch = the trained tokens of the optimizer step's 4 micro-batches (the Trainer counts
    # labels[..., 1:]: the collator's -100 on each example's first token makes that exact in the flat row too)
    steps = [sum(flat.trained_tokens[i : i + 4]) for i in range(0, 12, 4)]
    assert flat.num_items == [n for n in steps for _ in range(4)]
    loss_padded, loss_flat = losses(padded), losses(flat)
    assert len(loss_flat) == 3
    rel = max(abs(a - b) / abs(b) for a, b in zip(loss_flat, loss_padded, strict=True))
    assert rel <= LOSS_RTOL, (loss_flat, loss_padded)
    assert max_rel_diff(weights(flat), weights(padded)) <= WEIGHT_RTOL
    # and training did move the weights (the comparison is not between two untouched models)
    untouched = make_trainer(False, data, tok, str(tmp_path / "init"))
    assert max_rel_diff(weights(flat), weights(untouched)) > 1e-3


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("ddp-equivalence")
    run_on_two_ranks("ddp_layouts.py", out, "sft", timeout=300)
    results = json.loads((out / "results.json").read_text())
    results["weights"] = {key: torch.load(out / f"{key}.pt") for key in [*results["runs"], "rank1"]}
    return results


def test_two_ddp_ranks_scored_head_trains_as_trls_head(ddp_results):
    """Scored head through DDP's forward: ranks in sync, weights TRL's fused head's."""
    runs, w = ddp_results["runs"], ddp_results["weights"]
    scored, trl_head = runs["padding_free=True,average_tokens=True"], runs["trl_head"]
    assert (scored["lm_head_state"], trl_head["lm_head_state"]) == ("scored", "trl: scored_lm_head=False")
    assert trl_head["world_size"] == 2
    rel = max(abs(a - b) / abs(b) for a, b in zip(scored["losses"], trl_head["losses"], strict=True))
    assert rel <= LOSS_RTOL
    assert max_rel_diff(w["rank1"], w["padding_free=True,average_tokens=True"]) == 0.0
    assert max_rel_diff(w["padding_free=True,average_tokens=True"], w["trl_head"]) <= WEIGHT_RTOL


@pytest.mark.parametrize("average_tokens", [True, False])
def test_two_ddp_ranks_padded_and_padding_free_train_the_same_model(ddp_results, average_tokens):
    padded, flat = (ddp_results["runs"][f"padding_free={pf},average_tokens={average_tokens}"] for pf in (False, True))
    assert flat["world_size"] == padded["world_size"] == 2
    for rank in ("0", "1"):
        assert flat["batch_ids"][rank] == padded["batch_ids"][rank]
        assert flat["num_items"][rank] == padded["num_items"][rank]
    # rank 0 and rank 1 trained different examples; with average_tokens_across_devices the normaliser is the
    # trained tokens of both ranks' micro-batches of the step, else each rank's own
    assert flat["batch_ids"]["0"] != flat["batch_ids"]["1"]
    own = {r: flat["trained_tokens"][r] for r in ("0", "1")}
    for i, n in enumerate(flat["num_items"]["0"]):
        step = slice(i - i % 2, i - i % 2 + 2)  # 2 micro-batches per optimizer step
        expected = sum(own["0"][step]) + (sum(own["1"][step]) if average_tokens else 0)
        assert n == expected
    rel = max(abs(a - b) / abs(b) for a, b in zip(flat["losses"], padded["losses"], strict=True))
    assert len(flat["losses"]) == 3 and rel <= LOSS_RTOL, (flat["losses"], padded["losses"])
    assert max_rel_diff(ddp_results["weights"][f"padding_free=True,average_tokens={average_tokens}"],
                        ddp_results["weights"][f"padding_free=False,average_tokens={average_tokens}"]) <= WEIGHT_RTOL


def test_two_ddp_ranks_with_token_budget_batches(tok, ddp_results):
    """2 ranks: each its own sampler batches, same count per step, normaliser counts both."""
    from trl_padfree import TokenBudgetBatchSampler

    data = tokenized_dataset(tok, 48)
    lengths = [len(ids) for ids in data["input_ids"]]
    budget = ddp_results["budget"]
    tokens = {}
    for rank in (0, 1):
        sampler = TokenBudgetBatchSampler(lengths, 150, seed=0, num_replicas=2, rank=rank)
        expected = [[data[i]["input_ids"] for i in batch] for batch in list(sampler)[:6]]
        assert budget["batch_ids"][str(rank)] == expected  # 3 steps x 2 micro-batches
        tokens[rank] = [sum(len(ids) for ids in batch) for batch in expected]
        assert all(n <= 150 for n in tokens[rank])
    assert max(abs(a - b) for a, b in zip(tokens[0], tokens[1], strict=True)) < max(lengths)  # stated tolerance
    trained = budget["trained_tokens"]
    for i, n in enumerate(budget["num_items"]["0"]):
        step = slice(i - i % 2, i - i % 2 + 2)
        assert n == sum(trained["0"][step]) + sum(trained["1"][step])
