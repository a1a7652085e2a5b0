"""trl_padfree.GRPOTrainer and RLOOTrainer: padding-free and prompt-once equal TRL's padded trainers (tiny fp32 Llama,
TRL's seeded generation, 3 SGD steps, accumulation 2, ``num_iterations=2``, a reference model): every log-prob and
entropy TRL's loss gets, every logged metric, every gradient before each optimizer step. SGD, not Adam: Adam's
``lr * sign(g)`` first step would turn rounding-level gradient differences into ``lr``-sized weight differences."""

from __future__ import annotations

import pytest
import torch
import trl
from layout_runs import LAYOUTS, lora, register_leaky_attention, step_logs
from tiny_rl import assert_exact, grpo_loss_types, trainer
from trl.trainer.utils import add_fused_lm_head

import trl_padfree
from trl_padfree import PackingLeakError
from trl_padfree.rl_packing import pack_completion_rows, scatter_scores
from trl_padfree.testing import tiny_llama

CASES = {**{f"grpo-{t}": ("grpo", dict(loss_type=t)) for t in grpo_loss_types()},
         "grpo-sequence-importance-sampling": ("grpo", dict(loss_type="grpo", importance_sampling_level="sequence")),
         "grpo-peft": ("grpo", "peft"), "rloo": ("rloo", {}), "rloo-peft": ("rloo", "peft")}


@pytest.mark.parametrize("case", list(CASES))
def test_every_loss_type_peft_and_rloo_match_trl(tmp_path, case):
    """PEFT: the reference is the base model with the adapters off; RLOO has beta=0.05 by default."""
    kind, overrides = CASES[case]
    runs = {}
    for layout in LAYOUTS:
        kwargs = dict(peft=lora(), learning_rate=0.5) if overrides == "peft" else overrides  # a LoraConfig each
        t = trainer(kind, layout, str(tmp_path / layout), **kwargs)
        assert isinstance(t, trl.GRPOTrainer if kind == "grpo" else trl.RLOOTrainer)
        assert (layout == "padded") != isinstance(t, trl_padfree.GRPOTrainer | trl_padfree.RLOOTrainer)
        assert (t.ref_model is None) == (overrides == "peft")
        t.train()
        runs[layout] = t
    assert any(r[0].abs().sum() > 0 for r in runs["padded"].recorded)
    if overrides == "peft" or kind == "rloo":
        assert any(e.get("kl", 0) > 0 for e in step_logs(runs["padded"]))  # the reference forward mattered
    # the batches really are padded, and prompt_once really shares prompt tokens
    totals = runs["padfree"].pack_totals
    assert totals["train"]["real_tokens"] < totals["train"]["padded_tokens"]
    assert totals["train"]["shared_tokens"] == 0
    assert runs["once"].pack_totals["train"]["shared_tokens"] > 0
    assert runs["once"].pack_totals["no_grad"]["shared_tokens"] > 0
    for layout in ("padfree", "once"):
        assert_exact(runs[layout], runs["padded"])


def test_padding_free_false_is_trls_trainer(tmp_path):
    """padding_free=False: TRL's forwards, bit for bit (same losses, gradients, log-probs)."""
    trl_run = trainer("grpo", "padded", str(tmp_path / "a"))
    trl_run.train()  # (each trainer seeds torch when it is built: build, then train, one after the other)
    ours = trainer("grpo", "trl_padfree(padding_free=False)", str(tmp_path / "b"))
    assert isinstance(ours, trl_padfree.GRPOTrainer) and not ours.padfree
    ours.train()
    assert [e["loss"] for e in step_logs(ours)] == [e["loss"] for e in step_logs(trl_run)]
    for g, w in zip(ours.recorder.steps, trl_run.recorder.steps, strict=True):
        assert all(torch.equal(g[k], w[k]) for k in w)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(ours.recorded, trl_run.recorded, strict=True))
    assert sum(ours.pack_totals["train"].values()) == sum(ours.pack_totals["no_grad"].values()) == 0


def test_packed_groups_give_each_sequence_alone():
    """Three groups, interleaved as TRL's shuffle leaves them, one with a completion TRL masked out (empty)."""
    torch.manual_seed(0)
    model = tiny_llama(attn_implementation="padfree").eval()
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    prompts = [torch.randint(3, 400, (n,)).tolist() for n in (5, 2, 7)]
    rows = [(0, 4), (1, 6), (2, 1), (0, 2), (1, 0), (0, 6), (2, 3)]
    rows = [(prompts[g], torch.randint(3, 400, (c,)).tolist()) for g, c in rows]
    pw, cw = max(len(p) for p, _ in rows), max(len(c) for _, c in rows)
    ids = torch.zeros(len(rows), pw + cw, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, c) in enumerate(rows):
        ids[i, pw - len(p) : pw + len(c)] = torch.tensor(p + c)
        mask[i, pw - len(p) : pw + len(c)] = 1
    with torch.no_grad():
        for prompt_once in (False, True):
            packed = pack_completion_rows(ids, mask, cw, prompt_once=prompt_once)
            keys = ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
                    "padfree_kv_index")
            out = model(**{k: packed[k] for k in keys if k in packed}, shift_labels=packed["shift_labels"],
                        fused_lm_head=True)
            for i, (p, c) in enumerate(rows):
                seq = torch.tensor([p + c])
                alone = model(input_ids=seq, labels=seq, fused_lm_head=True)
                for name in ("log_probs", "entropy"):
                    want = torch.zeros(cw)
                    want[: len(c)] = getattr(alone, name)[0, len(p) - 1 :]
                    got = scatter_scores(getattr(out, name), packed, cw)[i]
                    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            stats = packed["stats"]
            real = sum(len(p) + len(c) for p, c in rows)
            assert stats.real_tokens == real
            # group 0 has 3 rows (prompt 5), group 1 two (one empty completion: prompt 2 not repeated), group 2 two
            assert stats.shared_tokens == ((2 * 4 + 2 + 6) if prompt_once else 0)
            assert stats.forwarded_tokens == real - stats.shared_tokens == packed["input_ids"].shape[1]


def test_a_leaking_attention_and_bad_settings_are_refused(tok, tmp_path):
    t = trainer("grpo", "padfree", str(tmp_path), model_init_kwargs={"attn_implementation": register_leaky_attention()})
    with pytest.raises(PackingLeakError, match="padding-free GRPO/RLOO batch changes this model's logits"):
        t.train()
    assert t.state.global_step == 0  # refused before the first step
    with pytest.raises(ValueError, match="needs attn_implementation='padfree'.*uses 'sdpa'"):
        trainer("grpo", "once", str(tmp_path), model_init_kwargs={"attn_implementation": "sdpa"})
    config = trl.GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    with pytest.raises(ValueError, match=r"prompt_once=True needs GRPOConfig\(padding_free=True\)"):
        trl_padfree.GRPOTrainer("x", reward_funcs=[], args=config, processing_class=tok, prompt_once=True)
    config.padding_free = True
    with pytest.raises(ValueError, match="padding_free=False contradicts the config's padding_free=True"):
        trl_padfree.GRPOTrainer("x", reward_funcs=[], args=config, processing_class=tok, padding_free=False)
    with pytest.raises(TypeError, match="padding_free must be True, False or None"):
        trl_padfree.GRPOTrainer("x", reward_funcs=[], args=config, processing_class=tok, padding_free="yes")
    with pytest.raises(ValueError, match="rows \\[0\\] have a hole in their attention_mask"):
        pack_completion_rows(torch.ones(1, 4, dtype=torch.long), torch.tensor([[1, 0, 1, 1]]), 2)


@pytest.mark.slow
def test_two_ddp_ranks_match_trl(tmp_path):
    """GRPO (bnpo) and RLOO on 2 CPU DDP ranks (gloo, torchrun): as above, with all-reduced gradients."""
    from types import SimpleNamespace

    from two_ranks import run_on_two_ranks

    run_on_two_ranks("ddp_layouts.py", tmp_path, "rl", timeout=900)
    assert (tmp_path / "rank0.done").exists() and (tmp_path / "rank1.done").exists()
    for kind in ("grpo", "rloo"):
        runs = {}
        for layout in LAYOUTS:
            saved = torch.load(tmp_path / f"{kind}-{layout}.pt", weights_only=False)
            assert saved["world_size"] == 2
            runs[layout] = SimpleNamespace(
                recorded=saved["recorded"], recorder=SimpleNamespace(steps=saved["grads"]),
                args=SimpleNamespace(max_steps=3), state=SimpleNamespace(log_history=saved["logs"]))
        assert saved["pack_totals"]["train"]["shared_tokens"] > 0
        for layout in ("padfree", "once"):
            assert_exact(runs[layout], runs["padded"])


def test_flash_attention_2_path_matches_trl(tmp_path, flash_attention_2_on_cpu):
    """Through transformers' flash_attention_2 dispatch (reference kernel, tests/flash_attention_cpu.py): TRL's padded
    run matched, every attention call got the row's cu_seq_lens. Generation stays on "padfree"; no activation
    checkpointing (its recomputation would run outside the switch to flash_attention_2)."""
    calls = flash_attention_2_on_cpu
    padded = trainer("grpo", "padded", str(tmp_path / "padded"), loss_type="bnpo", activation_checkpointing=False)
    padded.train()
    fa2 = trainer("grpo", "padfree", str(tmp_path / "fa2"), loss_type="bnpo", activation_checkpointing=False)
    packed_scores = fa2.packed_scores
    seen = []

    def through_flash_attention_2(model, packed, compute_aux_loss=False):
        configs = [m.config for m in (fa2.model, fa2.ref_model)]
        before = [c._attn_implementation for c in configs]
        for c in configs:
            c._attn_implementation = "flash_attention_2"
        start = len(calls)
        try:
            return packed_scores(model, packed, compute_aux_loss)
        finally:
            for c, attn in zip(configs, before, strict=True):
                c._attn_implementation = attn
            seen.append((packed["cu_seq_lens_q"].tolist(), [c[0].tolist() for c in calls[start:]]))

    fa2.packed_scores = through_flash_attention_2
    fa2.train()
    assert seen and calls
    for cu, got in seen:
        assert got == [cu] * fa2.model.config.num_hidden_layers
    assert_exact(fa2, padded)


def test_library_trainer_logs_real_tokens_and_generation_time(tmp_path):
    """The library trainer logs real tokens/s, generation time and share per interval, and the run's totals."""
    t = trainer("grpo", "once", str(tmp_path), max_steps=2, logging_steps=1)
    t.train()
    train = [e for e in t.state.log_history if "loss" in e]
    assert len(train) == 2 and all(e["real_tokens_per_second"] > 0 for e in train), train
    # num_iterations=2: the first step generates, the second reuses its completions
    assert train[0]["generation_seconds"] > 0 and 0 < train[0]["generation_share"] < 1, train
    assert train[1]["generation_seconds"] == 0 and train[1]["generation_share"] == 0, train
    end = next(e for e in t.state.log_history if "train_runtime" in e)
    # TRL counts a generation's tokens once (num_tokens); both steps forward and train on them
    assert end["train_real_tokens"] == 2 * train[0]["num_tokens"] > 0
    assert 0 < end["train_generation_share"] < 1
