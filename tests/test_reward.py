"""Padding-free and prompt-once reward-model training give TRL's padded RewardTrainer's model (CPU, fp32): every
metric, gradient and final weight over 3 SGD steps (tests/layout_runs.py), with margin, centering, implicit prompts,
pad == EOS; a pair packed with others gets its rewards alone."""

from __future__ import annotations

import layout_runs
import pytest
import tiny_reward as T
import torch

from trl_padfree import RewardConfig, RewardTrainer
from trl_padfree.reward_layout import DataCollatorForRewardPairs

RTOL = 1e-5


@pytest.mark.parametrize("case", [{}, {"margin": True, "center_rewards_coefficient": 0.01},
                                  {"explicit_prompt": False, "pad_is_eos": True},
                                  {"gradient_checkpointing": True, "pad_to_multiple_of": 8}],
                         ids=["plain", "margin-centered", "implicit-prompt-pad-is-eos", "checkpointing-pad-to-multiple"])
def test_three_layouts_train_the_same_model(tmp_path, case):
    case = dict(case)
    tok = T.tokenizer(pad_is_eos=case.pop("pad_is_eos", False))
    data = T.pairs(24, explicit_prompt=case.pop("explicit_prompt", True), margin=case.pop("margin", False))
    runs = layout_runs.train_layouts(T, data, tok, tmp_path, **case)
    layout_runs.assert_same_training(runs, T.same_step, T.grad_rtol)
    # prompt-once forwarded fewer tokens than it counted (the shared prefixes once), the counts agree
    once = runs["once"][0]
    batch = once.data_collator([once.train_dataset[i] for i in range(4)])
    assert batch["input_ids"].shape[1] < batch["num_tokens"]
    if "center_rewards_coefficient" in case:
        assert "margin" in runs["padfree"][0].train_dataset.column_names


def test_margin_and_centering_change_the_loss(tmp_path):
    """The margin and the centering term are in the loss (so the comparison above can fail on them)."""
    tok = T.tokenizer()
    losses = {}
    for name, margin, center in (("plain", False, None), ("margin", True, None), ("center", False, 0.5)):
        trainer = T.trainer("padfree", T.pairs(8, margin=margin), tok, str(tmp_path / name),
                            center_rewards_coefficient=center)
        batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
        with torch.no_grad():
            losses[name] = trainer.compute_loss(trainer.model, batch).item()
    assert losses["margin"] != pytest.approx(losses["plain"], rel=1e-3)
    assert losses["center"] > losses["plain"]


def test_pair_packed_with_others_has_its_rewards_alone(tmp_path):
    tok, data = T.tokenizer(), T.pairs(8)
    padded = T.trainer("padded", data, tok, str(tmp_path / "padded"))
    rows = [padded.train_dataset[i] for i in range(5)]
    with torch.no_grad():
        want = padded.model(**padded.data_collator(rows), use_cache=False).logits.squeeze(-1)
    for layout in ("padfree", "once"):
        trainer = T.trainer(layout, data, tok, str(tmp_path / layout))
        with torch.no_grad():
            together = trainer._flat_rewards(trainer.model, trainer.data_collator(rows))[1].squeeze(-1)
            alone = [trainer._flat_rewards(trainer.model, trainer.data_collator([r]))[1].squeeze(-1) for r in rows]
        assert torch.allclose(together, want, rtol=RTOL, atol=1e-6), (layout, together, want)
        for i, a in enumerate(alone):
            assert torch.allclose(together[[i, 5 + i]], a, rtol=RTOL, atol=1e-6)


def test_scores_are_read_where_trl_pools():
    """The reward of a sequence ending in pad tokens is read at its last non-pad token, as TRL's model reads it."""
    rows = [{"chosen_ids": [5, 6, 1, 1], "rejected_ids": [5, 6, 7, 1]}, {"chosen_ids": [8, 1, 9], "rejected_ids": [1]}]
    flat = DataCollatorForRewardPairs(pad_token_id=1)(rows)
    # row: [5 6 1 1][5 6 7 1][8 1 9][1] -> chosen at 1 and 10, rejected at 6 and 11 (all pad: its first token)
    assert flat["score_positions"].tolist() == [1, 10, 6, 11] and flat["num_tokens"] == 12
    padded = DataCollatorForRewardPairs(pad_token_id=1, pad_to_multiple_of=8)(rows)  # a segment of its own, unread
    assert padded["input_ids"].shape[1] == 16 and padded["cu_seq_lens_q"].tolist()[-2:] == [12, 16]
    assert padded["score_positions"].tolist() == [1, 10, 6, 11]
    once = DataCollatorForRewardPairs(pad_token_id=1, prompt_once=True)(rows)
    # pair 0 shares [5 6]: [5 6 1 1][6 7 1] (keys 5 + own); pair 1 shares nothing: [8 1 9][1]
    assert once["input_ids"].tolist() == [[5, 6, 1, 1, 6, 7, 1, 8, 1, 9, 1]]
    assert once["position_ids"].tolist() == [[0, 1, 2, 3, 1, 2, 3, 0, 1, 2, 0]]
    assert once["score_positions"].tolist() == [1, 9, 5, 10] and once["num_tokens"] == 12
    # a rejected sequence whose pooled token lies in the shared prefix is read there (the chosen segment's copy)
    inside = DataCollatorForRewardPairs(pad_token_id=1, prompt_once=True)(
        [{"chosen_ids": [5, 6, 1, 9], "rejected_ids": [5, 6, 1, 1]}])
    assert inside["input_ids"].tolist() == [[5, 6, 1, 9, 1, 1]] and inside["score_positions"].tolist() == [3, 1]
    with pytest.raises(ValueError, match="pair 0 has empty rejected_ids"):
        DataCollatorForRewardPairs(pad_token_id=1)([{"chosen_ids": [5], "rejected_ids": []}])


def test_padding_free_false_is_trl_unchanged_and_a_data_collator_is_refused(tmp_path):
    """(A leak, prompt-once under sdpa or without padding_free: tests/test_dpo.py, for reward models too.)"""
    import trl

    tok, data = T.tokenizer(), T.pairs(8)
    with pytest.raises(ValueError, match="do not pass a data_collator"):
        RewardTrainer(T.model("padfree", tok), args=T.config("padfree", str(tmp_path)), train_dataset=data,
                      processing_class=tok, data_collator=DataCollatorForRewardPairs(pad_token_id=0))
    ours = T.trainer("padded", data, tok, str(tmp_path / "ours"))
    assert type(ours.data_collator) is trl.trainer.reward_trainer.DataCollatorForPreference
    assert isinstance(ours.args, RewardConfig) and not ours.args.padding_free
    batch = ours.data_collator([ours.train_dataset[i] for i in range(4)])
    kwargs = T.config_kwargs("padded", str(tmp_path / "t"))
    del kwargs["padding_free"]
    theirs = trl.RewardTrainer(T.model("padded", tok), args=trl.RewardConfig(**kwargs), train_dataset=data,
                               processing_class=tok)
    with torch.no_grad():
        assert ours.compute_loss(ours.model, dict(batch)).item() == theirs.compute_loss(theirs.model, dict(batch)).item()


def test_peft_lora_trains_the_same_adapters(tmp_path):
    from peft import LoraConfig, TaskType

    peft = LoraConfig(task_type=TaskType.SEQ_CLS, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                      lora_dropout=0.0)
    runs = layout_runs.train_layouts(T, T.pairs(16), T.tokenizer(), tmp_path, ("padded", "padfree"), peft=peft)
    trained = {k for k, v in runs["padded"][0].model.named_parameters() if v.requires_grad}
    assert any("lora" in k for k in trained) and any("score" in k for k in trained)
    layout_runs.assert_same_training(runs, T.same_step)


def test_float64_gradients_on_one_batch(tmp_path, monkeypatch):
    """In float64 (RMSNorm too: Llama's computes in float32) every layout gives the same loss and gradients to 1e-12."""
    from transformers.models.llama import modeling_llama

    def rms_norm_in_input_dtype(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", rms_norm_in_input_dtype)
    tok, data = T.tokenizer(), T.pairs(8)
    grads, losses = {}, {}
    for layout in layout_runs.LAYOUTS:
        trainer = T.trainer(layout, data, tok, str(tmp_path / layout))
        trainer.model.double()
        batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
        trainer.model.zero_grad()
        loss = trainer.compute_loss(trainer.model, batch)
        loss.backward()
        losses[layout] = loss.item()
        grads[layout] = {n: p.grad.clone() for n, p in trainer.model.named_parameters()}
    for layout in ("padfree", "once"):
        assert abs(losses[layout] - losses["padded"]) <= 1e-12 * abs(losses["padded"])
        assert layout_runs.max_rel_diff(grads[layout], grads["padded"]) <= 1e-12, layout
