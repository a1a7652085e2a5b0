"""Padding-free batches give the padded loss, gradients and logits on a real (tiny) Llama."""

from __future__ import annotations

import pytest
import torch
from layout_runs import loss_and_grads

from trl_padfree import DataCollatorForCompletionOnlyLM
from trl_padfree.testing import tiny_llama

TEXTS = [
    "### Question: what is the capital city of france?\n### Answer: paris.",
    "### Question: reverse these words: cat mat sit on the blue mat please.\n### Answer: please mat blue the on sit mat cat.",
    "### Question: why?\n### Answer: because.",
    "<|system|>be brief<|user|>hi<|assistant|>hello there<eos><|user|>sum 2 and 3<|assistant|>5<eos>",
    "<|user|>count letters in word cat<|assistant|>3<eos><|tool|>ok<|assistant|>three letters<eos>",
]


def batches(tok, padding_free: bool):
    single = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok, padding_free=padding_free)
    multi = DataCollatorForCompletionOnlyLM(
        "<|assistant|>", ["<|user|>", "<|system|>", "<|tool|>"], tokenizer=tok, padding_free=padding_free
    )
    # one mixed batch: single-turn rows masked by the first collator, multi-turn rows by the second; merge labels
    features = [tok(t) for t in TEXTS]
    a, b = single(features[:3]), multi(features[3:])
    return a, b


def merged(tok, padding_free: bool):
    """All five examples in one batch, labels from the matching collator for each."""
    single, multi = batches(tok, padding_free)
    if padding_free:
        n = single["input_ids"].shape[1]
        out = {k: v for k, v in single.items()}
        for key in ("input_ids", "labels", "position_ids"):
            out[key] = torch.cat([single[key], multi[key]], dim=1)
        out["seq_idx"] = torch.cat([single["seq_idx"], multi["seq_idx"] + single["seq_idx"].max() + 1], dim=1)
        cu = torch.cat([single["cu_seq_lens_q"], multi["cu_seq_lens_q"][1:] + n])
        out["cu_seq_lens_q"], out["cu_seq_lens_k"] = cu, cu.clone()
        out["max_length_q"] = out["max_length_k"] = max(single["max_length_q"], multi["max_length_q"])
        return out
    width = max(single["input_ids"].shape[1], multi["input_ids"].shape[1])

    def pad(t, value):
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

    return {
        "input_ids": torch.cat([pad(single["input_ids"], 0), pad(multi["input_ids"], 0)]),
        "attention_mask": torch.cat([pad(single["attention_mask"], 0), pad(multi["attention_mask"], 0)]),
        "labels": torch.cat([pad(single["labels"], -100), pad(multi["labels"], -100)]),
    }


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_loss_and_every_gradient_equal(tok, attn):
    model = tiny_llama(vocab_size=len(tok), attn_implementation=attn).train()
    packed, padded = merged(tok, True), merged(tok, False)
    assert padded["labels"][padded["attention_mask"].bool()].tolist() == packed["labels"][0].tolist()
    loss_p, grads_p = loss_and_grads(model, packed)
    loss_d, grads_d = loss_and_grads(model, padded)
    assert torch.isfinite(loss_p)
    assert abs(loss_p - loss_d) / abs(loss_d) <= 1e-5, (loss_p.item(), loss_d.item())
    assert grads_p.keys() == grads_d.keys()
    for name in grads_p:
        rel = (grads_p[name] - grads_d[name]).abs().max() / grads_d[name].abs().max().clamp_min(1e-12)
        assert rel <= 1e-4, f"{name}: relative gradient difference {rel:.2e}"


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_each_example_logits_in_packed_row_equal_alone(tok, attn):
    model = tiny_llama(vocab_size=len(tok), attn_implementation=attn).train()
    packed = merged(tok, True)
    cu = packed["cu_seq_lens_q"].tolist()
    with torch.no_grad():
        logits = model(**packed).logits[0]
        for s, e in zip(cu[:-1], cu[1:], strict=True):
            alone = model(input_ids=packed["input_ids"][:, s:e], use_cache=False).logits[0]
            torch.testing.assert_close(logits[s:e], alone, rtol=1e-5, atol=1e-5)


def test_batch_is_safe_in_a_hand_written_loop_because_it_disables_the_cache(tok):
    """``model(**batch)`` with no use_cache would make transformers build a DynamicCache even in train mode, skip
    packed-sequence detection and let examples attend to each other (transformers' masking_utils.create_causal_mask skips it when a cache is passed)."""
    model = tiny_llama(vocab_size=len(tok), attn_implementation="sdpa").train()
    packed = merged(tok, True)
    padded = merged(tok, False)
    with torch.no_grad():
        reference = model(**padded).loss
        ours = model(**packed).loss
        without = model(**{k: v for k, v in packed.items() if k != "use_cache"}).loss
    assert abs(ours - reference) / reference <= 1e-5
    assert abs(without - reference) / reference > 1e-3, "transformers no longer shows the cache trap"


@pytest.mark.parametrize("attn", ["padfree", "sdpa", "eager"])
def test_pad_to_multiple_of_changes_neither_loss_nor_any_gradient(tok, attn):
    """issue 8 #6: the padding that ``pad_to_multiple_of`` adds to the padding-free row is a segment of its own with
    labels -100, so the loss and every gradient are those of the row without padding (and of the padded batch)."""
    model = tiny_llama(vocab_size=len(tok), attn_implementation=attn).train()
    features = [tok(t) for t in TEXTS[:3]]

    def collate(padding_free: bool, multiple: int | None):
        return DataCollatorForCompletionOnlyLM(
            "### Answer:", tokenizer=tok, padding_free=padding_free, pad_to_multiple_of=multiple
        )(features)

    plain, rounded, padded = collate(True, None), collate(True, 48), collate(False, None)
    n, total = plain["input_ids"].shape[1], rounded["input_ids"].shape[1]
    # the padding (39 tokens) is longer than any example here, so it also sets max_length
    assert total % 48 == 0 and rounded["max_length_q"] == total - n > plain["max_length_q"], (n, total)
    loss, grads = loss_and_grads(model, plain)
    for other in (rounded, padded):
        loss_o, grads_o = loss_and_grads(model, other)
        assert torch.isfinite(loss_o)
        assert abs(loss_o - loss) <= 1e-6 * abs(loss), (loss_o.item(), loss.item())
        assert grads_o.keys() == grads.keys()
        for name in grads:
            rel = (grads_o[name] - grads[name]).abs().max() / grads[name].abs().max().clamp_min(1e-12)
            assert rel <= 1e-5, f"{name}: relative gradient difference {rel:.2e}"
    with torch.no_grad():  # and every real token's logits are unchanged
        torch.testing.assert_close(model(**rounded).logits[0, :n], model(**plain).logits[0], rtol=1e-5, atol=1e-5)
