"""Padding-free batches give the padded loss, gradients and logits on a real (tiny) Llama. (The batch carries
use_cache=False: tests/test_collator.py; without it a cache skips the packed mask: tests/test_families.py.)"""

from __future__ import annotations

import pytest
import torch
from layout_runs import loss_and_grads, max_rel_diff

from trl_padfree import DataCollatorForCompletionOnlyLM
from trl_padfree.testing import tiny_llama

SINGLE = ("### Answer:", None, [
    "### Question: what is the capital city of france?\n### Answer: paris.",
    "### Question: reverse these words: cat mat sit on the blue mat please.\n### Answer: please mat blue the on sit mat cat.",
    "### Question: why?\n### Answer: because.",
])  # fmt: skip
MULTI = ("<|assistant|>", ["<|user|>", "<|system|>", "<|tool|>"], [
    "<|system|>be brief<|user|>hi<|assistant|>hello there<eos><|user|>sum 2 and 3<|assistant|>5<eos>",
    "<|user|>count letters in word cat<|assistant|>3<eos><|tool|>ok<|assistant|>three letters<eos>",
    "<|user|>why<|assistant|>because<eos>",
])  # fmt: skip


def collate(tok, case, padding_free: bool, multiple: int | None = None) -> dict:
    response, instructions, texts = case
    return DataCollatorForCompletionOnlyLM(response, instructions, tokenizer=tok, padding_free=padding_free,
                                           pad_to_multiple_of=multiple)([tok(t) for t in texts])


@pytest.mark.parametrize("case", [SINGLE, MULTI], ids=["single-turn", "multi-turn"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_loss_every_gradient_and_each_examples_logits_equal(tok, attn, case):
    model = tiny_llama(vocab_size=len(tok), attn_implementation=attn).train()
    packed, padded = collate(tok, case, True), collate(tok, case, False)
    assert padded["labels"][padded["attention_mask"].bool()].tolist() == packed["labels"][0].tolist()
    loss_p, grads_p = loss_and_grads(model, packed)
    loss_d, grads_d = loss_and_grads(model, padded)
    assert torch.isfinite(loss_p) and abs(loss_p - loss_d) / abs(loss_d) <= 1e-5, (loss_p.item(), loss_d.item())
    assert max_rel_diff(grads_p, grads_d) <= 1e-4
    cu = packed["cu_seq_lens_q"].tolist()
    with torch.no_grad():
        logits = model(**packed).logits[0]
        for s, e in zip(cu[:-1], cu[1:], strict=True):
            alone = model(input_ids=packed["input_ids"][:, s:e], use_cache=False).logits[0]
            torch.testing.assert_close(logits[s:e], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attn", ["padfree", "sdpa", "eager"])
def test_pad_to_multiple_of_changes_neither_loss_nor_any_gradient(tok, attn):
    """issue 8 #6: ``pad_to_multiple_of``'s padding changes neither the loss nor any gradient."""
    model = tiny_llama(vocab_size=len(tok), attn_implementation=attn).train()
    plain, rounded, padded = collate(tok, SINGLE, True), collate(tok, SINGLE, True, 48), collate(tok, SINGLE, False)
    n, total = plain["input_ids"].shape[1], rounded["input_ids"].shape[1]
    # the padding (39 tokens) is longer than any example here, so it also sets max_length
    assert total % 48 == 0 and rounded["max_length_q"] == total - n > plain["max_length_q"], (n, total)
    loss, grads = loss_and_grads(model, plain)
    for other in (rounded, padded):
        loss_o, grads_o = loss_and_grads(model, other)
        assert abs(loss_o - loss) <= 1e-6 * abs(loss), (loss_o.item(), loss.item())
        assert max_rel_diff(grads_o, grads) <= 1e-5
    with torch.no_grad():  # and every real token's logits are unchanged
        torch.testing.assert_close(model(**rounded).logits[0, :n], model(**plain).logits[0], rtol=1e-5, atol=1e-5)
