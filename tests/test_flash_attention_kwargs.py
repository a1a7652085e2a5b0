"""The collator's padding-free batch against what the installed transformers' flash-attention path consumes.

The sequence-boundary keyword names of transformers' flash-attention path have changed between releases before
(transformers #45034, #47525). A batch whose names no longer match is not an error there: the kwargs are ignored
and attention silently falls back to inferring boundaries from ``position_ids`` (a device sync per layer) or, with
a cache, to attending across examples. These tests read the names, types and parameters from the installed
transformers itself, so a rename fails CI here instead.
"""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

import pytest
import torch
from flash_attention_cpu import reference_varlen
from layout_runs import loss_and_grads
from transformers import DataCollatorWithFlattening
from transformers.modeling_flash_attention_utils import FlashAttentionKwargs, _flash_attention_forward
from transformers.utils.generic import TransformersKwargs

import trl_padfree.attention as padfree_attention
from trl_padfree import DataCollatorForCompletionOnlyLM
from trl_padfree.testing import tiny_llama

IGNORE = -100


def _hints(obj) -> dict:
    """Resolved annotations (transformers writes them as strings naming ``torch`` in modules that may not import it)."""
    return typing.get_type_hints(obj, localns={"torch": torch})


FA_HINTS = _hints(FlashAttentionKwargs)
MODEL_KWARGS = _hints(TransformersKwargs)
FA_KEYS = set(FA_HINTS)
TEXTS = [
    "### Question: what is the capital city of france?\n### Answer: paris.",
    "### Question: why?\n### Answer: because it is true.",
    "### Question: reverse these words: cat mat sit on the blue mat please.\n### Answer: please mat blue.",
]


def _kind(annotation) -> type:
    """``int`` or ``torch.Tensor`` from an annotation such as ``int | None`` or ``torch.LongTensor | None``."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    assert len(args) == 1, annotation
    if args[0] is int:
        return int
    assert args[0] is torch.Tensor or args[0] in (torch.LongTensor, torch.IntTensor), annotation
    return torch.Tensor


@pytest.fixture(scope="module")
def features(tok):
    out = []
    for t in TEXTS:
        ids = tok(t)["input_ids"]
        out.append({"input_ids": ids, "labels": [IGNORE] * 4 + ids[4:]})
    return out


def batches(tok, features) -> dict[str, dict]:
    make = DataCollatorForCompletionOnlyLM
    return {
        "plain": make(None, tokenizer=tok, padding_free=True)(features),
        "pad_to_multiple_of": make(None, tokenizer=tok, padding_free=True, pad_to_multiple_of=48)(features),
        "template": make("### Answer:", tokenizer=tok, padding_free=True)(features),
    }


def test_flash_attention_kwargs_are_the_four_boundary_names():
    """If this fails, transformers renamed or added flash-attention kwargs: update the collator (flattening.py),
    the "padfree" attention (attention.py) and the expectations here together."""
    assert FA_KEYS == {"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"}
    assert {k: _kind(v) for k, v in FA_HINTS.items()} == {
        "cu_seq_lens_q": torch.Tensor,
        "cu_seq_lens_k": torch.Tensor,
        "max_length_q": int,
        "max_length_k": int,
    }


def test_flash_attention_forward_takes_every_key_by_name():
    params = inspect.signature(_flash_attention_forward).parameters
    for key in FA_KEYS:
        assert key in params, f"_flash_attention_forward no longer has a parameter {key!r}"
        assert params[key].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        assert params[key].default is None  # optional: a missing key is silently a different code path
        assert _kind(_hints(_flash_attention_forward)[key]) is _kind(FA_HINTS[key])


def test_model_forward_kwargs_carry_every_extra_batch_key(tok, features):
    """Everything in the batch besides the model's own arguments is a kwarg transformers declares it forwards."""
    assert FA_KEYS <= set(MODEL_KWARGS)
    for name, batch in batches(tok, features).items():
        extra = set(batch) - {"input_ids", "labels", "use_cache"}
        assert extra <= set(MODEL_KWARGS), (name, extra - set(MODEL_KWARGS))
        assert FA_KEYS <= set(batch), name


@pytest.mark.parametrize("name", ["plain", "pad_to_multiple_of", "template"])
def test_batch_types_dtypes_and_maxima(tok, features, name):
    batch = batches(tok, features)[name]
    total = batch["input_ids"].shape[1]
    for key, annotation in FA_HINTS.items():
        value = batch[key]
        if _kind(annotation) is int:
            assert type(value) is int, f"{key} must be a Python int (no device sync), got {type(value)}"
        else:
            assert isinstance(value, torch.Tensor) and value.dtype == torch.int32 and value.dim() == 1, key
            assert value[0].item() == 0 and value[-1].item() == total
            assert (value[1:] > value[:-1]).all(), f"{key}: every segment has at least one token"
    cu = batch["cu_seq_lens_q"]
    assert batch["max_length_q"] == batch["max_length_k"] == int((cu[1:] - cu[:-1]).max())
    expected_segments = len(TEXTS) + (name == "pad_to_multiple_of")
    assert cu.numel() == expected_segments + 1
    # seq_idx as TransformersKwargs declares it (an IntTensor), one per token
    assert _kind(MODEL_KWARGS["seq_idx"]) is torch.Tensor
    assert batch["seq_idx"].dtype == torch.int32 and batch["seq_idx"].shape == (1, total)
    assert batch["position_ids"].dtype == torch.int64 and batch["position_ids"].shape == (1, total)


def test_same_batch_as_transformers_flattening_collator(tok, features):
    """transformers' own producer of this batch gives the same keys, values, dtypes, shapes and Python ints."""
    ours = batches(tok, features)["plain"]
    theirs = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(features)
    assert set(ours) - {"use_cache"} == set(theirs)
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):
            assert ours[key].dtype == value.dtype and ours[key].shape == value.shape, key
            assert torch.equal(ours[key], value), key
        else:
            assert type(ours[key]) is type(value) and ours[key] == value, key


# --------------------------------------------------- through transformers' flash-attention path, end to end
@pytest.mark.parametrize("name", ["plain", "pad_to_multiple_of"])
def test_flash_attention_2_path_consumes_the_batch(tok, features, flash_attention_2_on_cpu, name):
    calls = flash_attention_2_on_cpu
    batch = batches(tok, features)[name]
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
    for key in grads_ref:
        rel = (grads[key] - grads_ref[key]).abs().max() / grads_ref[key].abs().max().clamp_min(1e-12)
        assert rel <= 1e-5, f"{key}: relative gradient difference {rel:.2e}"


def test_a_renamed_key_is_not_consumed(tok, features, flash_attention_2_on_cpu):
    """Guard for the test above: with a key renamed (as a transformers release could do), transformers no longer
    takes the varlen path with the collator's boundaries; here it fails loudly instead of silently differing."""
    batch = dict(batches(tok, features)["plain"])
    batch["cu_seqlens_q"] = batch.pop("cu_seq_lens_q")
    model = tiny_llama(vocab_size=len(tok), attn_implementation="sdpa").train()
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(AssertionError, match="other than varlen"):
        model(**batch)


# ------------------------------------------------------------------- the "padfree" attention reads the same
def _names_read_from_kwargs(source: str) -> set[str]:
    """String keys of every ``kwargs.get("...")`` and ``kwargs["..."]`` in a module's source."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            target, args = node.func.value, node.args
        elif isinstance(node, ast.Subscript):
            target, args = node.value, [node.slice]
        else:
            continue
        if isinstance(target, ast.Name) and target.id == "kwargs" and args and isinstance(args[0], ast.Constant):
            names.add(args[0].value)
    return names


def test_padfree_attention_reads_the_names_transformers_forwards():
    read = _names_read_from_kwargs(Path(padfree_attention.__file__).read_text())
    assert FA_KEYS <= read, f"attention.py does not read {FA_KEYS - read}"
    assert read <= set(MODEL_KWARGS), f"attention.py reads kwargs transformers does not forward: {read - set(MODEL_KWARGS)}"


def test_padfree_attention_uses_the_batch_kwargs(tok, features):
    """Behaviour, not only names: given only the batch's FlashAttentionKwargs (no mask, no position_ids), "padfree"
    attends per segment; without them it attends across the whole row."""
    batch = batches(tok, features)["pad_to_multiple_of"]
    total = batch["input_ids"].shape[1]
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, total, 8), torch.randn(1, 2, total, 8), torch.randn(1, 2, total, 8)
    module = torch.nn.Module()
    module.is_causal, module.num_key_value_groups = True, 2
    kwargs = {key: batch[key] for key in FA_KEYS}
    out, _ = padfree_attention.padfree_attention_forward(module, q, k, v, None, **kwargs)
    reference_varlen.calls = []
    expected = reference_varlen(
        q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), batch["cu_seq_lens_q"],
        batch["cu_seq_lens_k"], batch["max_length_q"], batch["max_length_k"], softmax_scale=8**-0.5, causal=True,
    )
    torch.testing.assert_close(out[0], expected, rtol=1e-5, atol=1e-5)
    whole_row, _ = padfree_attention.padfree_attention_forward(module, q, k, v, None)
    assert (whole_row[0] - expected).abs().max() > 1e-3
