"""trl_padfree.GRPOTrainer: padding-free and prompt-once GRPO equal TRL's padded GRPOTrainer.

Every test runs the real trainers on a tiny fp32 Llama with TRL's own seeded generation (transformers ``generate``
on the CPU), 3 optimizer steps, gradient accumulation 2, ``num_iterations=2`` (old log-probs), ``beta=0.1`` (a
reference model), and compares with TRL's padded trainer: every log-prob / entropy tensor TRL's loss code receives,
every logged metric, every parameter's gradient before each optimizer step. Plain SGD: Adam's first update is
``lr * sign(g)`` where a gradient is ~0, which turns rounding-level gradient differences into ``lr``-sized weight
differences and would hide (or fake) a real difference from the second step on.
"""

from __future__ import annotations

import pytest
import torch
import trl

from trl_padfree._compat import rl_padding_free_unavailable

if rl_padding_free_unavailable():
    pytest.skip(rl_padding_free_unavailable(), allow_module_level=True)

from layout_runs import LAYOUTS, register_leaky_attention, step_logs
from tiny_rl import METRIC_RTOL, RTOL, compare, grpo_loss_types, tokenizer, trainer

import trl_padfree
from trl_padfree import PackingLeakError
from trl_padfree.rl_packing import pack_completion_rows, scatter_scores
from trl_padfree.testing import tiny_llama


def _assert_exact(diffs: dict) -> None:
    assert diffs["logps"] <= RTOL and diffs["entropy"] <= RTOL and diffs["grads"] <= RTOL, diffs
    assert diffs["metrics"] <= METRIC_RTOL, diffs


def _run_all(tmp_path, kind: str = "grpo", **overrides) -> dict:
    runs = {}
    for layout in LAYOUTS:
        t = trainer(kind, layout, str(tmp_path / layout), **overrides)
        t.train()
        runs[layout] = t
    return runs


GRPO_DEFAULT = trl.GRPOConfig.__dataclass_fields__["loss_type"].default


@pytest.mark.parametrize("loss_type", grpo_loss_types())
def test_every_loss_type_matches_trl(tmp_path, loss_type):
    runs = _run_all(tmp_path, loss_type=loss_type)
    padded = runs["padded"]
    assert any(r[0].abs().sum() > 0 for r in padded.recorded)
    # the batches really are padded, and prompt_once really shares prompt tokens
    totals = runs["padfree"].pack_totals
    assert totals["train"]["real_tokens"] < totals["train"]["padded_tokens"]
    assert totals["train"]["shared_tokens"] == 0
    assert runs["once"].pack_totals["train"]["shared_tokens"] > 0
    assert runs["once"].pack_totals["no_grad"]["shared_tokens"] > 0
    for layout in ("padfree", "once"):
        _assert_exact(compare(runs[layout], padded))


def test_sequence_importance_sampling_matches_trl(tmp_path):
    runs = _run_all(tmp_path, loss_type="grpo", importance_sampling_level="sequence")
    for layout in ("padfree", "once"):
        _assert_exact(compare(runs[layout], runs["padded"]))


def test_peft_with_adapters_off_reference_matches_trl(tmp_path):
    from peft import LoraConfig

    def lora():
        return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0)

    runs = {}
    for layout in LAYOUTS:
        t = trainer("grpo", layout, str(tmp_path / layout), peft=lora(), learning_rate=0.5)
        assert t.ref_model is None  # the reference is the base model, adapters off
        t.train()
        runs[layout] = t
    assert any(e.get("kl", 0) > 0 for e in step_logs(runs["padded"]))  # the reference forward mattered
    for layout in ("padfree", "once"):
        _assert_exact(compare(runs[layout], runs["padded"]))


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


def _fused(model):
    from trl.trainer.utils import add_fused_lm_head

    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    return model


def test_packed_groups_give_each_sequence_alone():
    """Three groups, interleaved as TRL's shuffle leaves them, one with a completion TRL masked out (empty)."""
    torch.manual_seed(0)
    model = _fused(tiny_llama(attn_implementation="padfree")).eval()
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
            logps = scatter_scores(out.log_probs, packed, cw)
            entropy = scatter_scores(out.entropy, packed, cw)
            for i, (p, c) in enumerate(rows):
                seq = torch.tensor([p + c])
                alone = model(input_ids=seq, labels=seq, fused_lm_head=True)
                want = torch.zeros(cw)
                want[: len(c)] = alone.log_probs[0, len(p) - 1 :]
                torch.testing.assert_close(logps[i], want, rtol=1e-5, atol=1e-5)
                want_e = torch.zeros(cw)
                want_e[: len(c)] = alone.entropy[0, len(p) - 1 :]
                torch.testing.assert_close(entropy[i], want_e, rtol=1e-5, atol=1e-5)
            stats = packed["stats"]
            real = sum(len(p) + len(c) for p, c in rows)
            assert stats.real_tokens == real
            # group 0 has 3 rows (prompt 5), group 1 two (one empty completion: prompt 2 not repeated), group 2 two
            assert stats.shared_tokens == ((2 * 4 + 2 + 6) if prompt_once else 0)
            assert stats.forwarded_tokens == real - stats.shared_tokens == packed["input_ids"].shape[1]


def test_probe_refuses_a_leaking_attention(tmp_path):
    t = trainer("grpo", "padfree", str(tmp_path), model_init_kwargs={"attn_implementation": register_leaky_attention()})
    with pytest.raises(PackingLeakError, match="padding-free GRPO/RLOO batch changes this model's logits"):
        t.train()
    assert t.state.global_step == 0


def test_prompt_once_needs_the_padfree_attention(tmp_path):
    with pytest.raises(ValueError, match="needs attn_implementation='padfree'.*uses 'sdpa'"):
        trainer("grpo", "once", str(tmp_path), model_init_kwargs={"attn_implementation": "sdpa"})


def test_bad_settings_are_refused(tmp_path):
    tok = tokenizer()
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
    """GRPO (bnpo) and RLOO on 2 CPU DDP ranks (gloo, torchrun): padding-free and prompt-once equal TRL's padded run
    on every logged metric, every all-reduced gradient and rank 0's log-probs and entropies."""
    from types import SimpleNamespace

    from two_ranks import run_on_two_ranks

    run_on_two_ranks("ddp_rl.py", tmp_path, timeout=900)
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
            _assert_exact(compare(runs[layout], runs["padded"]))


def test_flash_attention_2_path_matches_trl(tmp_path, flash_attention_2_on_cpu):
    """The packed forwards through transformers' real flash_attention_2 dispatch (flash-attn's varlen kernel replaced
    by tests/flash_attention_cpu.py's reference, which records every call): TRL's padded run on sdpa is matched, and
    every attention call got the packed row's cu_seq_lens (no inference from position_ids, no padded path).
    Generation stays on "padfree" (flash-attn's padded path is not available on a CPU); no activation checkpointing
    (its recomputation in the backward would run outside the switch to flash_attention_2)."""
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
    _assert_exact(compare(fa2, padded))


def test_library_trainer_logs_real_tokens_and_generation_time(tmp_path):
    """trl_padfree.GRPOTrainer used directly (not through the launch) logs real tokens/s and the time and share of
    each logging interval spent generating, and the run's totals."""
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
