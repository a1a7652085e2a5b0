"""Padding-free and prompt-once DPO train the same model as TRL's padded DPOTrainer (CPU, fp32): per-step metrics,
every gradient and the final weights (tests/layout_runs.py), every TRL loss type on one batch, leaks refused; with KTO
and reward models: the refusals and evaluation."""

from __future__ import annotations

import importlib

import layout_runs
import pytest
import tiny_dpo as T
import torch

from trl_padfree import DataCollatorForPreference, DPOTrainer
from trl_padfree.dpo_loss import LOSS_TYPES
from trl_padfree.probe import PackingLeakError

RTOL = 1e-5


@pytest.mark.parametrize("case", [
    {"loss_type": ["sigmoid"]},
    {"loss_type": ["ipo"], "precompute_ref_log_probs": True},
    {"loss_type": ["sigmoid", "bco_pair", "sft"], "loss_weights": [1.0, 0.5, 0.2], "ld_alpha": 0.5},
    "peft",
], ids=["sigmoid", "ipo-precomputed-ref", "weighted-list-ld_alpha", "peft-reference-adapters-off"])
def test_three_layouts_train_the_same_model(tmp_path, case):
    if case == "peft":
        case = dict(ref=False, peft=layout_runs.lora())
    runs = layout_runs.train_layouts(T, T.pairs(24), T.tokenizer(), tmp_path, **case)
    assert all((trainer.ref_model is None) == ("peft" in case) for trainer, _ in runs.values())
    layout_runs.assert_same_training(runs, T.same_step)


def first_batch(trainer: DPOTrainer, n: int = 6) -> dict:
    rows = [trainer.train_dataset[i] for i in range(min(n, len(trainer.train_dataset)))]
    assert len(rows) >= 2
    return trainer.data_collator(rows)


@pytest.fixture(scope="module")
def one_batch_trainers(tmp_path_factory):
    tok, data = T.tokenizer(), T.pairs(12)
    out = {}
    for layout in layout_runs.LAYOUTS:
        trainer = T.trainer(layout, data, tok, str(tmp_path_factory.mktemp(layout)), label_smoothing=0.1)
        out[layout] = (trainer, first_batch(trainer))
    return out


def same_loss(trainers: dict, **attrs) -> None:
    """Each layout's loss on its first batch with the trainer's ``attrs`` set (then restored): the padded one's."""
    losses = {}
    for layout, (trainer, batch) in trainers.items():
        saved = {k: getattr(trainer, k) for k in attrs}
        for k, v in attrs.items():
            setattr(trainer, k, v)
        with torch.no_grad():
            losses[layout] = trainer.compute_loss(trainer.model, dict(batch)).item()
        for k, v in saved.items():
            setattr(trainer, k, v)
    assert [losses["padfree"], losses["once"]] == pytest.approx([losses["padded"]] * 2, rel=RTOL), losses


@pytest.mark.parametrize("variant", [*({"loss_types": [t]} for t in LOSS_TYPES),
                                     {"f_divergence_type": "alpha_divergence", "f_alpha_divergence_coef": 0.5},
                                     {"f_divergence_type": "js_divergence"}, {"f_divergence_type": "forward_kl"}])
def test_every_trl_loss_type_and_f_divergence_on_one_batch(one_batch_trainers, variant):
    same_loss(one_batch_trainers, **{"loss_types": ["sigmoid"], "loss_weights": [1.0]} | variant)


@pytest.mark.parametrize("overrides", [{"use_weighting": True}, {"max_length": 40, "truncation_mode": "keep_start"},
                                       {"max_length": 40, "truncation_mode": "keep_end"}])
def test_use_weighting_and_truncation_as_trl(tmp_path, overrides):
    trainers = {}
    for layout in layout_runs.LAYOUTS:
        trainer = T.trainer(layout, T.pairs(8), T.tokenizer(), str(tmp_path / layout), **overrides)
        if "max_length" in overrides:
            assert any(len(r["prompt_ids"]) + max(len(r["chosen_ids"]), len(r["rejected_ids"])) > 40
                       for r in trainer.train_dataset)
        trainers[layout] = (trainer, first_batch(trainer))
    same_loss(trainers)


def test_keep_end_cutting_into_the_prompt_gives_separate_segments():
    pair = {"prompt_ids": [1, 2, 3, 4], "chosen_ids": [5, 6], "rejected_ids": [7, 8, 9]}
    once = DataCollatorForPreference(pad_token_id=0, max_length=5, truncation_mode="keep_end", prompt_once=True)
    batch = once([pair])
    # chosen keeps prompt [2, 3, 4], rejected keeps [3, 4]: different prompts, so no shared keys
    assert batch["input_ids"].tolist() == [[2, 3, 4, 5, 6, 3, 4, 7, 8, 9]]
    assert "padfree_kv_index" not in batch and batch["cu_seq_lens_q"].tolist() == [0, 5, 10]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 4]]


@pytest.mark.parametrize("attn", ["sdpa", "eager", "flash_attention_2"])
def test_padding_free_loss_and_every_gradient_are_the_padded_ones(tmp_path, request, attn):
    """Through transformers' own block-diagonal mask from position_ids (sdpa, eager) or its flash_attention_2
    dispatch (reference varlen kernel, tests/flash_attention_cpu.py, which reads the preference row's boundaries):
    loss and every gradient as TRL's padded batch."""
    flash = attn == "flash_attention_2"
    calls = request.getfixturevalue("flash_attention_2_on_cpu") if flash else None
    results = {}
    for layout in ("padded", "padfree"):
        trainer = T.trainer(layout, T.pairs(8), T.tokenizer(), str(tmp_path / layout), check_packing=not flash,
                            model_kwargs={"attn_implementation": "sdpa" if flash else attn})
        if flash and layout == "padfree":
            for m in (trainer.model, trainer.ref_model):
                m.config._attn_implementation = "flash_attention_2"
        trainer.model.zero_grad()
        loss = trainer.compute_loss(trainer.model, first_batch(trainer))
        loss.backward()
        results[layout] = (loss.item(), {n: p.grad.clone() for n, p in trainer.model.named_parameters()})
    assert results["padfree"][0] == pytest.approx(results["padded"][0], rel=RTOL)
    assert layout_runs.max_rel_diff(results["padfree"][1], results["padded"][1]) <= RTOL
    if flash:  # policy and reference: every layer took the varlen path
        assert len(calls) == 2 * trainer.model.config.num_hidden_layers


def test_pair_packed_with_others_has_its_logps_alone(tmp_path):
    tok, data = T.tokenizer(), T.pairs(8)
    for layout in ("padfree", "once"):
        trainer = T.trainer(layout, data, tok, str(tmp_path / layout))
        rows = [trainer.train_dataset[i] for i in range(5)]
        with torch.no_grad():
            together = trainer._reference_logps(trainer.data_collator(rows), trainer.model)
            alone = [trainer._reference_logps(trainer.data_collator([r]), trainer.model) for r in rows]
        chosen, rejected = together.chunk(2)
        for i, a in enumerate(alone):
            assert torch.allclose(chosen[i], a[0], rtol=RTOL) and torch.allclose(rejected[i], a[1], rtol=RTOL)


@pytest.mark.parametrize("name", ["dpo", "kto", "reward"])
def test_a_leaking_attention_and_sdpa_with_prompt_once_are_refused(tmp_path, name):
    """DPO, KTO and reward (tests/tiny_*.py): a leak stops training before the first step; prompt-once needs an
    attention that reads the shared prompt keys, and the config's padding_free."""
    S = importlib.import_module(f"tiny_{name}")
    tok, data = S.tokenizer(), (S.examples if name == "kto" else S.pairs)(8)
    leaky = {"attn_implementation": layout_runs.register_leaky_attention()}
    trainer = S.trainer("padfree", data, tok, str(tmp_path), model_kwargs=leaky)
    with pytest.raises(PackingLeakError, match="LEAKS"):
        trainer.train()
    assert trainer.state.global_step == 0  # refused before the first step
    with pytest.raises(ValueError, match="prompt_once=True needs attn_implementation='padfree'"):
        S.trainer("once", data, tok, str(tmp_path), model_kwargs={"attn_implementation": "sdpa"})
    config = {"dpo": "DPO", "kto": "KTO", "reward": "Reward"}[name]
    with pytest.raises(ValueError, match=rf"^prompt_once=True needs {config}Config\(padding_free=True\)"):
        S.trainer("once", data, tok, str(tmp_path), padding_free=False)


@pytest.mark.parametrize(("name", "shown"), [("kto", {"eval_loss", "eval_kl", "eval_rewards/chosen", "eval_logps/rejected"}),
                                             ("reward", {"eval_loss", "eval_accuracy", "eval_margin", "eval_mean_reward"})])
def test_evaluation_gives_trls_metrics(tmp_path, name, shown):
    """KTO and reward models (tests/tiny_*.py): every layout's evaluation metrics are TRL's padded ones."""
    S = importlib.import_module(f"tiny_{name}")
    data = S.examples if name == "kto" else S.pairs
    results = {layout: S.trainer(layout, data(12), S.tokenizer(), str(tmp_path / layout), eval_dataset=data(8, seed=1),
                                 per_device_eval_batch_size=4).evaluate() for layout in layout_runs.LAYOUTS}
    want = results["padded"]
    keys = [k for k in want if k.startswith("eval_") and not k.endswith(("runtime", "per_second", "preparation_time"))]
    assert shown <= set(keys)
    for layout in layout_runs.LAYOUTS[1:]:
        if name == "kto":
            layout_runs.same_preference_step(layout, results[layout], want, keys, prefix="eval_")
        else:
            S.same_step(layout, results[layout], want, keys, prefix="eval_")


def test_padding_free_false_is_trl_unchanged(tmp_path):
    import trl

    tok, data = T.tokenizer(), T.pairs(8)
    ours = T.trainer("padded", data, tok, str(tmp_path / "ours"))
    assert type(ours.data_collator) is trl.trainer.dpo_trainer.DataCollatorForPreference
    batch = first_batch(ours)
    theirs = trl.DPOTrainer(T.model("padded"), T.model("padded", seed=1), args=T.config("padded", str(tmp_path / "t")),
                            train_dataset=data, processing_class=tok)
    with torch.no_grad():
        a = ours.compute_loss(ours.model, dict(batch)).item()
        b = theirs.compute_loss(theirs.model, dict(batch)).item()
    assert a == b


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dpo", "kto", "reward"])
def test_two_ddp_ranks_train_the_same_model_in_every_layout(tmp_path, name):
    """torchrun, 2 CPU ranks (gloo): the three layouts give the same per-step logs (KTO's KL gathered across ranks),
    gradients and weights."""
    S = importlib.import_module(f"tiny_{name}")
    runs = layout_runs.ddp_runs(name, tmp_path)
    assert name != "kto" or any(e["kl"] > 0 for e in runs["padded"].logs)
    layout_runs.assert_same_training(runs, S.same_step, getattr(S, "grad_rtol", lambda layout: layout_runs.RTOL))


def test_shared_prompt_keys_never_take_torch_varlen(monkeypatch):
    """Prompt-once batches never take torch's varlen_attn (causal alignment unverified there)."""
    import warnings

    import trl_padfree.attention as attention

    monkeypatch.setattr(attention, "decide_backend", lambda *a, **k: ("torch_varlen", None))
    attention._warn_slow_cuda.cache_clear()
    model = T.model("once")
    rows = [{"prompt_ids": [5, 6, 7], "chosen_ids": [8, 9], "rejected_ids": [10]}] * 2
    batch = DataCollatorForPreference(pad_token_id=0, prompt_once=True)(rows)
    inputs = {k: batch[k] for k in ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
                                    "max_length_k", "padfree_kv_index")}
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        model(**inputs, use_cache=False)  # torch_varlen itself cannot run on a CPU
    assert any("shared prompt keys (prompt_once)" in str(w.message) for w in caught)
