"""Padding-free and prompt-once reward-model training give TRL's padded RewardTrainer's model (CPU, fp32).

Through the real Trainer: per-step loss and every logged metric, every parameter's gradient before every optimizer
step (SGD, so the weights stay comparable step after step) and the final weights, over 3 optimizer steps with
gradient accumulation 2; with and without ``margin``, with ``center_rewards_coefficient``, an explicit and an
implicit prompt, and a pad token equal to EOS. A pair packed with others gets the rewards it has alone, and a
deliberately leaking attention is refused before the first step.
"""

from __future__ import annotations

import pytest
import tiny_reward as T
import torch
from test_dpo import leaky_attention
from transformers import AttentionInterface, TrainerCallback
from transformers.masking_utils import AttentionMaskInterface

from trl_padfree import RewardConfig, RewardTrainer
from trl_padfree.probe import PackingLeakError
from trl_padfree.reward import reward_padding_free_unavailable
from trl_padfree.reward_layout import DataCollatorForRewardPairs
from trl_padfree.reward_probe import check_reward_packing

RTOL = 1e-5
# prompt-once gradients: 1.08e-5 measured in fp32 (padding-free: 0.98e-5, same data): the shared prefix's gradient is
# summed before (not after) the backward of Llama's RMSNorm, which computes in fp32 even in an fp64 model; with an
# fp64 RMSNorm prompt-once is exact to 1e-15 (test_float64_gradients_on_one_batch)
ONCE_GRAD_RTOL = 2e-5
pytestmark = pytest.mark.skipif(reward_padding_free_unavailable() is not None,
                                reason=str(reward_padding_free_unavailable()))
METRICS = ("loss", "num_tokens", "min_reward", "mean_reward", "max_reward", "accuracy", "margin")


class GradRecorder(TrainerCallback):
    """Every parameter's gradient just before each optimizer step."""

    def __init__(self) -> None:
        self.steps: list[dict[str, torch.Tensor]] = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.steps.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})


def run_layouts(tmp_path, data, tok, **kwargs) -> dict[str, tuple[RewardTrainer, GradRecorder]]:
    out = {}
    for layout in T.LAYOUTS:
        trainer = T.trainer(layout, data, tok, str(tmp_path / layout), optim="sgd", **kwargs)
        recorder = GradRecorder()
        trainer.add_callback(recorder)
        recorder.initial = T.weights(trainer)
        trainer.train()
        out[layout] = (trainer, recorder)
    return out


def assert_same_training(runs: dict[str, tuple[RewardTrainer, GradRecorder]]) -> None:
    padded, padded_grads = runs["padded"]
    want = T.step_logs(padded)
    assert len(want) == 3 and len(padded_grads.steps) == 3
    for layout in ("padfree", "once"):
        trainer, grads = runs[layout]
        got = T.step_logs(trainer)
        assert len(got) == 3
        for step_got, step_want in zip(got, want, strict=True):
            # margin and mean reward are differences/means of rewards: judged against the rewards' size
            scale = max(abs(step_want["min_reward"]), abs(step_want["max_reward"]))
            for key in METRICS:
                a, b = step_got[key], step_want[key]
                tol = RTOL * max(abs(b), scale if key in ("margin", "mean_reward") else 0.0, 1e-7)
                assert abs(a - b) <= tol, (layout, key, a, b)
        assert len(grads.steps) == 3
        for step, (g, w) in enumerate(zip(grads.steps, padded_grads.steps, strict=True)):
            tol = RTOL if layout == "padfree" else ONCE_GRAD_RTOL
            assert T.max_rel_diff(g, w) <= tol, (layout, step, T.max_rel_diff(g, w))
        assert T.max_rel_diff(T.weights(trainer), T.weights(padded)) <= RTOL
    # training moved the weights: the comparison is not between untouched models
    assert T.max_rel_diff(T.weights(padded), padded_grads.initial) > 1e-4
    # prompt-once forwarded fewer tokens than it counted (the shared prefixes once), the counts agree
    once = runs["once"][0]
    batch = once.data_collator([once.train_dataset[i] for i in range(4)])
    assert batch["input_ids"].shape[1] < batch["num_tokens"]


@pytest.mark.parametrize(
    "case",
    [
        {},
        {"margin": True, "center_rewards_coefficient": 0.01},
        {"explicit_prompt": False, "pad_is_eos": True},
        {"gradient_checkpointing": True, "pad_to_multiple_of": 8},
    ],
    ids=["plain", "margin-centered", "implicit-prompt-pad-is-eos", "checkpointing-pad-to-multiple"],
)
def test_three_layouts_train_the_same_model(tmp_path, case):
    case = dict(case)
    tok = T.tokenizer(pad_is_eos=case.pop("pad_is_eos", False))
    data = T.pairs(24, explicit_prompt=case.pop("explicit_prompt", True), margin=case.pop("margin", False))
    runs = run_layouts(tmp_path, data, tok, **case)
    assert_same_training(runs)
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


def test_a_leaking_attention_is_refused_before_the_first_step(tmp_path):
    AttentionInterface.register("leaky_test", leaky_attention)
    AttentionMaskInterface.register("leaky_test", lambda *a, **k: None)
    tok, data = T.tokenizer(), T.pairs(8)
    for prompt_once in (False, True):
        report = check_reward_packing(T.model("padfree", tok, attn_implementation="leaky_test"),
                                      prompt_once=prompt_once)
        assert report.status == "leaks" and report.max_abs_diff > 100 * report.tolerance, report
        assert "attn_implementation='padfree'" in report.advice
    assert check_reward_packing(T.model("padfree", tok), prompt_once=True).status == "safe"
    trainer = T.trainer("padfree", data, tok, str(tmp_path), attn_implementation="leaky_test")
    with pytest.raises(PackingLeakError, match="LEAKS"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_bad_settings_are_refused(tmp_path):
    tok, data = T.tokenizer(), T.pairs(8)
    with pytest.raises(ValueError, match="prompt_once=True needs attn_implementation='padfree'"):
        T.trainer("once", data, tok, str(tmp_path), attn_implementation="sdpa")
    with pytest.raises(ValueError, match=r"needs RewardConfig\(padding_free=True\)"):
        RewardTrainer(T.model("padded", tok), args=T.config("padded", str(tmp_path)), train_dataset=data,
                      processing_class=tok, prompt_once=True)
    with pytest.raises(ValueError, match="do not pass a data_collator"):
        RewardTrainer(T.model("padfree", tok), args=T.config("padfree", str(tmp_path)), train_dataset=data,
                      processing_class=tok, data_collator=DataCollatorForRewardPairs(pad_token_id=0))


def test_padding_free_false_is_trl_unchanged(tmp_path):
    import trl

    tok, data = T.tokenizer(), T.pairs(8)
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
    tok, data = T.tokenizer(), T.pairs(16)
    runs = {}
    for layout in ("padded", "padfree"):
        trainer = T.trainer(layout, data, tok, str(tmp_path / layout), optim="sgd", peft=peft, max_steps=2)
        trainer.train()
        runs[layout] = trainer
    trained = {k for k, v in runs["padded"].model.named_parameters() if v.requires_grad}
    assert any("lora" in k for k in trained) and any("score" in k for k in trained)
    assert T.max_rel_diff(T.weights(runs["padfree"]), T.weights(runs["padded"])) <= RTOL
    for a, b in zip(T.step_logs(runs["padfree"]), T.step_logs(runs["padded"]), strict=True):
        assert abs(a["loss"] - b["loss"]) <= RTOL * abs(b["loss"])


def test_float64_gradients_on_one_batch(tmp_path, monkeypatch):
    """In float64 every layout gives the same loss and gradients to rounding (1e-12): what prompt-once changes is only
    the order of sums. Llama's RMSNorm computes in float32 even in a float64 model; with it, prompt-once's gradients
    below the last layer differ by ~6.5e-8 (the prefix's gradient summed before the norm's float32 backward)."""
    from transformers.models.llama import modeling_llama

    def rms_norm_in_input_dtype(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", rms_norm_in_input_dtype)
    tok, data = T.tokenizer(), T.pairs(8)
    grads, losses = {}, {}
    for layout in T.LAYOUTS:
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
        assert T.max_rel_diff(grads[layout], grads["padded"]) <= 1e-12, layout


@pytest.mark.slow
def test_two_ddp_ranks_train_the_same_model_in_every_layout(tmp_path):
    """torchrun, 2 CPU ranks (gloo): the three layouts give the same per-step logs, gradients and weights."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    path = os.pathsep.join([str(root), str(root / "tests")])  # this checkout's package, not the installed one
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(root / "tests" / "ddp_reward.py"), str(tmp_path)],
        cwd=root, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert (tmp_path / "rank0.done").exists() and (tmp_path / "rank1.done").exists()  # both ranks ran to the end
    results = json.loads((tmp_path / "results.json").read_text())
    runs = {}
    for layout in T.LAYOUTS:
        assert results[layout]["world_size"] == 2 and results[layout]["ranks"] == 2
        # 3 steps x 2 micro-batches x 2 pairs x 2 ranks = 24 of the 32 pairs
        assert results[layout]["epoch"] == pytest.approx(24 / 32)
        saved = torch.load(tmp_path / f"{layout}.pt")
        runs[layout] = (saved["grads"], saved["weights"])
    padded_logs, padded = results["padded"]["logs"], runs["padded"]
    for layout in ("padfree", "once"):
        logs = results[layout]["logs"]
        assert len(logs) == len(padded_logs) == 3
        for got, want in zip(logs, padded_logs, strict=True):
            scale = max(abs(want["min_reward"]), abs(want["max_reward"]))
            for key in METRICS:
                tol = RTOL * max(abs(want[key]), scale if key in ("margin", "mean_reward") else 0.0, 1e-7)
                assert abs(got[key] - want[key]) <= tol, (layout, key, got[key], want[key])
        assert len(runs[layout][0]) == len(padded[0]) == 3
        for g, w in zip(runs[layout][0], padded[0], strict=True):
            assert T.max_rel_diff(g, w) <= (RTOL if layout == "padfree" else ONCE_GRAD_RTOL)
        assert T.max_rel_diff(runs[layout][1], padded[1]) <= RTOL


def test_evaluation_gives_trls_metrics(tmp_path):
    tok, data = T.tokenizer(), T.pairs(12)
    results = {}
    for layout in T.LAYOUTS:
        trainer = RewardTrainer(T.model(layout, tok), args=T.config(layout, str(tmp_path / layout),
                                                                     per_device_eval_batch_size=4),
                                train_dataset=data, eval_dataset=T.pairs(8, seed=1), processing_class=tok,
                                prompt_once=layout == "once")
        results[layout] = trainer.evaluate()
    want = results["padded"]
    timing = ("eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "eval_model_preparation_time")
    keys = [k for k in want if k.startswith("eval_") and k not in timing]
    assert {"eval_loss", "eval_accuracy", "eval_margin", "eval_mean_reward"} <= set(keys)
    for layout in ("padfree", "once"):
        scale = max(abs(want["eval_min_reward"]), abs(want["eval_max_reward"]))
        for key in keys:
            tol = RTOL * max(abs(want[key]), scale if key in ("eval_margin", "eval_mean_reward") else 0.0, 1e-7)
            assert abs(results[layout][key] - want[key]) <= tol, (layout, key)


@pytest.mark.parametrize("family", ["qwen2", "mistral", "gemma"])
def test_probe_accepts_other_decoder_families(family):
    """The score hook and the probe work for other sequence-classification decoders (and catch their leaks)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.for_model(family, vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_labels=1,
                                  pad_token_id=0, max_position_embeddings=128)
    torch.manual_seed(0)
    for prompt_once in (False, True):
        model = AutoModelForSequenceClassification.from_config(config, attn_implementation="padfree")
        assert check_reward_packing(model, prompt_once=prompt_once).status == "safe", (family, prompt_once)
    AttentionInterface.register("leaky_test", leaky_attention)
    AttentionMaskInterface.register("leaky_test", lambda *a, **k: None)
    leaky = AutoModelForSequenceClassification.from_config(config, attn_implementation="leaky_test")
    assert check_reward_packing(leaky).status == "leaks"
