"""Padding-free KTO (and its prompt-once reference row) trains TRL's padded KTOTrainer's model (CPU, fp32): every
metric (KL term included), gradient and final weight over 3 SGD steps (tests/layout_runs.py)."""

from __future__ import annotations

from itertools import pairwise

import layout_runs
import pytest
import tiny_kto as T
import torch

from trl_padfree import KTOTrainer
from trl_padfree.kto import DataCollatorForUnpairedFlat

RTOL = 1e-5


@pytest.mark.parametrize("case", [{}, {"precompute_ref_log_probs": True}, {"loss_type": "apo_zero_unpaired"}, "peft"],
                         ids=["kto-kl", "kto-precomputed-ref", "apo_zero_unpaired", "peft-reference-adapters-off"])
def test_padded_and_padding_free_train_the_same_model(tmp_path, case):
    if case == "peft":
        case = dict(ref=False, peft=layout_runs.lora())
    runs = layout_runs.train_layouts(T, T.examples(24), T.tokenizer(), tmp_path, **case)
    assert all((trainer.ref_model is None) == ("peft" in case) for trainer, _ in runs.values())
    metrics = T.METRICS
    if case.get("loss_type") == "apo_zero_unpaired":
        metrics = tuple(m for m in T.METRICS if m != "kl")
        assert all(e["kl"] == 0.0 for e in layout_runs.step_logs(runs["padfree"][0]))
    else:
        kl = [e["kl"] for e in layout_runs.step_logs(runs["padded"][0])]
        assert any(k > 0 for k in kl), kl  # the KL term is in the comparison (not clamped to 0 everywhere)
    layout_runs.assert_same_training(runs, lambda *step: T.same_step(*step, metrics=metrics))


def test_weights_enter_the_loss(tmp_path):
    """Desirable and undesirable weights scale their losses (so the comparison above can fail on them)."""
    tok, data = T.tokenizer(), T.examples(8)
    losses = {}
    for name, (d, u) in {"even": (1.0, 1.0), "desirable": (2.0, 1.0), "undesirable": (1.0, 2.0)}.items():
        trainer = T.trainer("padfree", data, tok, str(tmp_path / name), desirable_weight=d, undesirable_weight=u)
        batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
        assert 0 < int(batch["label"].sum()) < 4
        with torch.no_grad():
            losses[name] = trainer.compute_loss(trainer.model, batch).item()
    assert losses["desirable"] > losses["even"] and losses["undesirable"] > losses["even"]


def test_collator_rows_are_trls_sequences(tmp_path):
    """Each row segment is exactly a sequence of TRL's padded batch (tokens, truncation, KL rotation)."""
    tok, data = T.tokenizer(), T.examples(8)
    for max_length in (None, 60):
        padded = T.trainer("padded", data, tok, str(tmp_path / "p"), max_length=max_length)
        rows = [padded.train_dataset[i] for i in range(4)]  # (TRL drops prompts of max_length tokens or more)
        want = padded.data_collator(rows)
        flat = DataCollatorForUnpairedFlat(pad_token_id=tok.pad_token_id, max_length=max_length)(rows)
        for prefix in ("", "KL_"):
            ids, cu = flat[prefix + "input_ids"][0], flat[prefix + "cu_seq_lens_q"].tolist()
            mask = want[prefix + "attention_mask"].bool()
            assert len(cu) == 5 and flat[prefix + "num_tokens"] == int(mask.sum())
            for i in range(4):
                assert ids[cu[i] : cu[i + 1]].tolist() == want[prefix + "input_ids"][i][mask[i]].tolist()
            if max_length:
                assert max(b - a for a, b in pairwise(cu)) == max_length


def test_padding_free_false_is_trl_unchanged_and_bad_settings_are_refused(tmp_path):
    import trl

    tok, data = T.tokenizer(), T.examples(8)
    ours = T.trainer("padded", data, tok, str(tmp_path / "ours"))
    assert type(ours.data_collator) is trl.trainer.kto_trainer.DataCollatorForUnpairedPreference
    with pytest.raises(ValueError, match="do not pass a data_collator"):
        KTOTrainer(T.model("padfree"), T.model("padfree", seed=1), args=T.config("padfree", str(tmp_path)),
                   train_dataset=data, processing_class=tok, data_collator=ours.data_collator)


def test_return_outputs_recomputes_the_rows_logits(tmp_path):
    tok, data = T.tokenizer(), T.examples(8)
    trainer = T.trainer("padfree", data, tok, str(tmp_path))
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, batch)
        with pytest.warns(FutureWarning, match="return_outputs=True"):
            again, outputs = trainer.compute_loss(trainer.model, batch, return_outputs=True)
    assert again.item() == loss.item()
    assert outputs.logits.shape == (1, batch["input_ids"].shape[1], trainer.model.config.vocab_size)


def test_reference_row_computes_each_prompt_once(tmp_path):
    tok, data = T.tokenizer(), T.examples(8)
    trainer = T.trainer("once", data, tok, str(tmp_path))
    rows = [trainer.train_dataset[i] for i in range(4)]
    batch = trainer.data_collator(rows)
    prompts = sum(len(r["prompt_ids"]) for r in rows)
    # one row of prompt + completion + last prompt token + KL completion per example
    assert batch["pair_input_ids"].shape[1] == batch["num_tokens"] + batch["KL_num_tokens"] - prompts + 4
    with torch.no_grad():
        once = trainer._reference_logps(batch)
        two_rows = trainer._reference_logps({k: v for k, v in batch.items() if not k.startswith("pair_")})
    for a, b in zip(once, two_rows, strict=True):
        assert torch.allclose(a, b, rtol=RTOL, atol=0)
