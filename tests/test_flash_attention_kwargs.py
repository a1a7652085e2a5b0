"""The collator's padding-free batch against the installed transformers' flash-attention path: its boundary keyword
names have changed before (transformers #45034, #47525), and a renamed one is silently ignored there."""

from __future__ import annotations

import typing

import pytest
import torch
from layout_runs import loss_and_grads, max_rel_diff
from transformers import DataCollatorWithFlattening
from transformers.modeling_flash_attention_utils import FlashAttentionKwargs
from transformers.utils.generic import TransformersKwargs

from trl_padfree import DataCollatorForCompletionOnlyLM
from trl_padfree.testing import tiny_llama

MODEL_KWARGS = typing.get_type_hints(TransformersKwargs, localns={"torch": torch})
FA_KEYS = set(typing.get_type_hints(FlashAttentionKwargs, localns={"torch": torch}))
TEXTS = [
    "### Question: what is the capital city of france?\n### Answer: paris.",
    "### Question: why?\n### Answer: because it is true.",
    "### Question: reverse these words: cat mat sit on the blue mat please.\n### Answer: please mat blue.",
]
LAYOUTS = {"plain": dict(response_template=None), "pad_to_multiple_of": dict(response_template=None, pad_to_multiple_of=48),
           "template": dict(response_template="### Answer:")}  # fmt: skip


@pytest.fixture(scope="module")
def features(tok):
    return [{"input_ids": ids, "labels": [-100] * 4 + ids[4:]} for ids in (tok(t)["input_ids"] for t in TEXTS)]


def batch_of(tok, features, name: str) -> dict:
    return DataCollatorForCompletionOnlyLM(tokenizer=tok, padding_free=True, **LAYOUTS[name])(features)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_boundary_key_is_one_transformers_forwards(tok, features, name):
    """(Their values, dtypes and Python-int maxima: tests/test_collator.py, exactly.)"""
    extra = set(batch_of(tok, features, name)) - {"input_ids", "labels", "use_cache"}
    assert FA_KEYS <= extra <= set(MODEL_KWARGS), extra - set(MODEL_KWARGS)


def test_same_batch_as_transformers_flattening_collator(tok, features):
    """transformers' own producer of this batch gives the same keys, values, dtypes, shapes and Python ints."""
    ours = batch_of(tok, features, "plain")
    theirs = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(features)
    assert set(ours) - {"use_cache"} == set(theirs)
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):
            assert ours[key].dtype == value.dtype and torch.equal(ours[key], value), key
        else:
            assert type(ours[key]) is type(value) and ours[key] == value, key


@pytest.mark.parametrize("name", ["plain", "pad_to_multiple_of"])
def test_flash_attention_2_path_consumes_the_batch(tok, features, flash_attention_2_on_cpu, name):
    calls = flash_attention_2_on_cpu
    batch = batch_of(tok, features, name)
    model = tiny_llama(vocab_size=len(tok), attn_implementation="sdpa").train()
    padded = DataCollatorForCompletionOnlyLM(None, tokenizer=tok, padding_free=False)(features)
    loss_ref, grads_ref = loss_and_grads(model, padded)  # sdpa on the ordinary padded batch
    model.config._attn_implementation = "flash_attention_2"
    loss, grads = loss_and_grads(model, batch)
    assert len(calls) == model.config.num_hidden_layers  # every layer took the varlen path with our kwargs
    for cu_q, cu_k, max_q, max_k in calls:
        assert cu_q is batch["cu_seq_lens_q"] and cu_k is batch["cu_seq_lens_k"]
        assert (max_q, max_k) == (batch["max_length_q"], batch["max_length_k"])
    assert abs(loss - loss_ref) <= 1e-6 * abs(loss_ref), (loss.item(), loss_ref.item())
    assert max_rel_diff(grads, grads_ref) <= 1e-5
