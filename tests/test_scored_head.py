"""The scored-positions LM head (:mod:`trl_padfree.scored_head`) against TRL 1.16's fused head: the kernel, a model
call, SFT and DPO through the trainers (relative 1e-5), and the fallback for softcapped logits."""

from __future__ import annotations

import pytest
import tiny_dpo as T
import torch
from layout_runs import (
    GradRecorder,
    assert_same_metrics,
    assert_same_training,
    finished,
    max_rel_diff,
    weights,
)
from tiny_models import tiny_family
from tiny_rl import rel
from tiny_sft import make_trainer, tokenized_dataset

from trl_padfree import DataCollatorForCompletionOnlyLM
from trl_padfree import scored_head as sh
from trl_padfree.dpo import flat_forward
from trl_padfree.testing import tiny_llama

RTOL = 1e-5
ALL = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


def assert_outputs_equal(got, want: dict) -> None:
    """Every output field of ``got`` equal to ``want``'s: top-1 exactly, the others within RTOL."""
    for name, w in want.items():
        g = getattr(got, name)
        assert torch.equal(g, w) if name == "is_top1" else rel(g, w) <= RTOL, name


def same_logs(*keys: str):
    """A ``same_step`` for ``layout_runs.assert_same_training``: ``keys`` within RTOL, an accuracy that compares more
    than zeros."""
    def same_step(layout: str, got: dict, want: dict) -> None:
        assert 0 < got["mean_token_accuracy"] < 1
        assert_same_metrics(layout, got, want, keys)
    return same_step


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_score_tokens_equals_trls_kernel_and_its_gradients(temperature):
    from trl.kernels import ChunkedLogProbFunction

    torch.manual_seed(0)
    n, h, v = 37, 16, 50
    hidden, weight, bias = (torch.randn(*s, requires_grad=True) for s in ((n, h), (v, h), (v,)))
    targets = torch.randint(0, v, (n,))
    want = ChunkedLogProbFunction.apply(hidden, weight, bias, targets, temperature, 32768, None, 1.0, ALL)
    got = sh.score_tokens(hidden, weight, targets, bias, temperature=temperature, outputs=ALL, chunk_tokens=5)
    assert_outputs_equal(got, dict(zip(ALL, want, strict=True)))
    g_lp, g_h = torch.randn(n), torch.randn(n)
    for use_entropy in (False, True):
        a = torch.autograd.grad((want[0] * g_lp).sum() + use_entropy * (want[1] * g_h).sum(), (hidden, weight, bias),
                                retain_graph=True)
        b = torch.autograd.grad((got.log_probs * g_lp).sum() + use_entropy * (got.entropy * g_h).sum(),
                                (hidden, weight, bias), retain_graph=True)
        for x, y in zip(b, a, strict=True):
            assert rel(x, y) <= RTOL


def test_score_tokens_keeps_no_logits_of_the_whole_set_for_backward():
    """What autograd saves for backward: the scored hidden states and [N] vectors, no [N, V] logits."""
    torch.manual_seed(0)
    n, h, v = 300, 8, 1000
    hidden, weight = torch.randn(n, h, requires_grad=True), torch.randn(v, h, requires_grad=True)
    saved: list[tuple[int, ...]] = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = sh.score_tokens(hidden, weight, torch.randint(0, v, (n,)), outputs=("entropy",), chunk_tokens=64)
    assert (n, h) in saved and (v, h) in saved
    assert max(torch.Size(s).numel() for s in saved) == v * h  # the weight; nothing [N, V]
    out.log_probs.sum().backward()
    assert hidden.grad.shape == (n, h) and weight.grad.abs().sum() > 0


def test_score_tokens_refuses_bad_input():
    h, w = torch.zeros(2, 4), torch.zeros(8, 4)
    with pytest.raises(ValueError, match=r"targets must be token ids in \[0, 8\).*got ids from -100 to 3; gather only"):
        sh.score_tokens(h, w, torch.tensor([-100, 3]))
    with pytest.raises(ValueError, match=r"hidden must be \[N, H\] and weight \[V, H\] with the same H"):
        sh.score_tokens(torch.zeros(2, 5), w, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"unknown output\(s\) \['logits'\]"):
        sh.score_tokens(h, w, torch.tensor([0, 1]), outputs=("logits",))
    with pytest.raises(ValueError, match="chunk_tokens must be a positive integer"):
        sh.score_tokens(h, w, torch.tensor([0, 1]), chunk_tokens=0)


def test_a_row_with_nothing_scored_gives_a_differentiable_zero():
    hidden = torch.randn(1, 5, 4, requires_grad=True)
    weight = torch.randn(8, 4, requires_grad=True)
    out, mask = sh.score_row(hidden, torch.full((1, 5), -100), weight, outputs=("entropy", "is_top1"))
    assert not mask.any() and out.log_probs.abs().sum() == 0 and not out.is_top1.any()
    out.log_probs.sum().backward()
    assert hidden.grad.abs().sum() == 0 and weight.grad.abs().sum() == 0


def _packed_batch(tok, n: int = 6, seed: int = 3):
    data = tokenized_dataset(tok, n, seed=seed)
    collate = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok, padding_free=True)
    return collate([dict(r) for r in data])


def _favour_the_commonest_target(model, batch) -> None:
    """Raise the head's row of the batch's commonest target along the mean hidden state, so that top-1 is right at
    some positions and wrong at others (a random model is right nowhere: accuracy would compare 0 with 0)."""
    from trl_padfree.preference import MODEL_KEYS

    with torch.no_grad():
        inputs = {k: batch[k] for k in MODEL_KEYS if k in batch}
        hidden = model.model(**inputs).last_hidden_state[0]
        if "shift_labels" in batch:
            targets = batch["shift_labels"][0]
        else:
            hidden, targets = hidden[:-1], batch["labels"][0, 1:]
        keep = targets != -100
        u = hidden[keep].mean(0)
        model.lm_head.weight[targets[keep].mode().values] += 3 * u / u.norm() ** 2


@pytest.mark.parametrize("shifted", [False, True])
def test_model_call_equals_trls_fused_head(tok, shifted):
    """``model(..., fused_lm_head=True)``: every output field, the loss and every gradient equal to TRL's head."""
    from trl.trainer.utils import add_fused_lm_head

    batch = _packed_batch(tok)
    labels = batch.pop("labels")
    call = dict(shift_labels=torch.cat([labels[:, 1:], torch.full((1, 1), -100)], 1)) if shifted else dict(labels=labels)
    results = []
    for scored in (False, True):
        model = tiny_llama(vocab_size=len(tok), attn_implementation="padfree")
        _favour_the_commonest_target(model, {**batch, "labels": labels})
        add_fused_lm_head(model, outputs=ALL)
        if scored:
            assert sh.add_scored_head(model, outputs=ALL) is None and sh.scored_head_state(model) == "scored"
        out = model(**batch, **call, fused_lm_head=True, num_items_in_batch=torch.tensor(40))
        out.loss.backward()
        results.append((out, {k: p.grad.clone() for k, p in model.named_parameters()}))
    (want, want_grads), (got, got_grads) = results
    assert rel(got.loss, want.loss) <= RTOL
    assert torch.equal(got.label_mask, want.label_mask) and got.label_mask.sum() < got.label_mask.numel() / 2
    assert_outputs_equal(got, {name: getattr(want, name) for name in ALL})
    assert 0 < int(got.is_top1.sum()) < int(got.label_mask.sum())  # right at some positions, wrong at others
    assert max_rel_diff(got_grads, want_grads) <= RTOL
    # without fused_lm_head the model's own forward (logits of every position)
    assert model(**batch).logits.shape[1] == batch["input_ids"].shape[1]


def _sft_run(tok, tmp_path, scored: bool):
    data = tokenized_dataset(tok, 24)
    trainer = make_trainer(True, data, tok, str(tmp_path / str(scored)), gradient_accumulation_steps=2,
                           max_steps=3, optim="sgd", scored_lm_head=scored)
    _favour_the_commonest_target(trainer.model, _packed_batch(tok, 24, seed=0))
    recorder = GradRecorder()
    trainer.add_callback(recorder)
    recorder.initial = weights(trainer)
    trainer.train()
    return trainer, recorder


def test_sft_trainer_equals_trls_head(tok, tmp_path):
    """SFT (accumulation 2, 3 steps): logs, every gradient and the weights equal TRL's head; the head removed."""
    runs = {"padded": _sft_run(tok, tmp_path, False), "padfree": _sft_run(tok, tmp_path, True)}  # TRL's head, the scored one
    (trl_head, _), (scored, _) = runs["padded"], runs["padfree"]
    assert trl_head.lm_head_state == "trl: scored_lm_head=False" and scored.lm_head_state == "scored"
    assert sh.scored_head_state(scored.model) == "scored" and sh.scored_head_state(trl_head.model) is None
    assert_same_training(runs, same_logs("loss", "entropy", "mean_token_accuracy", "num_tokens"))
    assert sh.remove_scored_head(scored.model) and sh.scored_head_state(scored.model) is None
    assert not sh.remove_scored_head(scored.model)  # (the switch's bad values: tests/test_rl_scored_head.py)


@pytest.mark.parametrize("once", [False, True], ids=["padfree", "prompt-once"])
def test_dpo_equals_trls_head(tmp_path, once):
    """Padding-free DPO (and prompt-once): per-sequence log-probs, every logged metric and every gradient equal."""
    tok, data = T.tokenizer(), T.pairs(16)
    layout = "once" if once else "padfree"
    runs = {}
    for scored in (False, True):
        trainer = T.trainer(layout, data, tok, str(tmp_path / str(scored)), optim="sgd", check_packing=False,
                            scored_lm_head=scored)
        recorder = GradRecorder()
        trainer.add_callback(recorder)
        batch = next(iter(trainer.get_train_dataloader()))
        _favour_the_commonest_target(trainer.model, batch)
        with torch.no_grad():
            logps = trainer._sequence_logps(flat_forward(trainer.model, batch).log_probs, batch)
            ref = trainer._reference_logps(batch)
        trainer.train()
        runs[scored] = trainer, recorder, logps, ref
    (want, _, want_logps, want_ref), (got, _, got_logps, got_ref) = runs[False], runs[True]
    assert (want.lm_head_state, want.ref_lm_head_state) == ("trl: scored_lm_head=False",) * 2
    assert (got.lm_head_state, got.ref_lm_head_state) == ("scored", "scored")
    assert rel(got_logps, want_logps) <= RTOL and rel(got_ref, want_ref) <= RTOL
    assert_same_training(finished({"padded": runs[False][:2], "padfree": runs[True][:2]}), same_logs(
        "loss", "logps/chosen", "logps/rejected", "entropy", "logits/chosen", "logits/rejected", "mean_token_accuracy"))


def _tiny_gemma2(vocab_size: int):
    return tiny_family("gemma2", vocab_size=vocab_size, final_logit_softcapping=30.0, attn_logit_softcapping=None)


def test_softcapped_logits_fall_back_to_trls_head(tok, tmp_path, capsys):
    """gemma2 softcaps its logits: the scored head names why and leaves the call to TRL's head (same outputs)."""
    from trl.trainer.utils import add_fused_lm_head

    model = _tiny_gemma2(len(tok))
    why = "final_logit_softcapping=30.0 (gemma2): logits softcapped before the loss"
    assert sh.head_fallback_reason(model) == why
    batch = _packed_batch(tok)
    add_fused_lm_head(model, outputs=ALL)
    want = model(**batch, fused_lm_head=True)
    assert sh.add_scored_head(model, outputs=ALL) == why and sh.scored_head_state(model) == f"trl: {why}"
    got = model(**batch, fused_lm_head=True)
    assert torch.equal(got.log_probs, want.log_probs) and torch.equal(got.entropy, want.entropy)
    # through the trainer: the state and one printed line
    trainer = make_trainer(True, tokenized_dataset(tok, 4), tok, str(tmp_path), model=_tiny_gemma2(len(tok)))
    assert trainer.use_scored_lm_head() == f"trl: {why}"
    assert f"LM head: TRL's fused head, not the scored-positions head ({why})" in capsys.readouterr().out
