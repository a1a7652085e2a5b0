"""``attn_implementation="padfree"`` on sinks (GPT-OSS, DeepSeek-V4, Granite-SWA), soft-capping (Gemma-2), Llama-4's
chunks and temperature, Gemma-4's KV sharing: packed under "padfree" vs each example alone under "eager", loss
within 1e-5, every gradient within 1e-4 relative."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tiny_models import family
from transformers import AutoModelForCausalLM

from trl_padfree import families as fam
from trl_padfree.probe import alone_batch, packed_batch, random_sequences

LOSS_TOL = 1e-5
GRAD_RTOL = 1e-4
VOCAB = 128  # trl_padfree.families' tiny configs
LENGTHS = (7, 13, 5, 20)  # some longer than the windows and Llama-4's chunks (8)


def examples(lengths=LENGTHS, seed: int = 0) -> list[list[int]]:
    return random_sequences(lengths, VOCAB, 0, seed)


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


# trl_padfree.families' tiny configs (windows and Llama-4's chunks of 8); Gemma-2 with a cap of 0.5 on logits scaled
# by 16**-0.5: tanh is far from linear there, so skipping it would show
OVERRIDES = {"gemma2": dict(attn_logit_softcapping=0.5, query_pre_attn_scalar=16)}


def config_of(model_type: str):
    return fam.tiny_family_config(family(model_type), **OVERRIDES.get(model_type, {}))


def distinct_hash_experts(model):
    """Distinct random experts in DeepSeek-V4's token -> experts table (all zeros: no gate gradient)."""
    for name, buffer in model.named_buffers():
        if name.endswith("tid2eid"):
            buffer.copy_(torch.stack([torch.randperm(4)[:2] for _ in range(buffer.shape[0])]))


@pytest.mark.parametrize(("model_type", "seqs", "init"), [
    ("gpt_oss", None, None),  # sinks, alternating sliding windows, GQA
    ("gemma2", None, None),  # logit soft-capping with sliding windows
    ("granite_swa", None, None),  # sinks
    ("deepseek_v4", None, distinct_hash_experts),  # sinks, CSA and HCA layers compressing windows of 4 and 8
    ("llama4_text", None, None),  # chunked attention and the temperature scale, per example
    ("llama4_text", (21,), None),  # one sequence longer than a chunk
    ("gemma4_text", None, None),  # KV sharing
], ids=["gpt_oss", "gemma2", "granite_swa", "deepseek_v4", "llama4", "llama4-one-sequence", "gemma4"])  # fmt: skip
def test_packed_under_padfree_equals_each_example_alone_under_eager(model_type, seqs, init):
    # DeepSeek-V4's hyper-connection head sums every token of 4 layers in float32: with 2 torch threads its
    # gradient differs by 1.1e-4 of its largest (1 thread: within 1e-4), the summing order, not a leak
    grad_rtol = 3e-4 if model_type == "deepseek_v4" else GRAD_RTOL
    config, seqs = config_of(model_type), examples() if seqs is None else examples(seqs)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    if init is not None:
        init(model)
    count = sum(len(s) - 1 for s in seqs)
    model.zero_grad(set_to_none=True)
    want_loss = 0.0
    for ids in seqs:  # each example alone under "eager"
        loss = model(**alone_batch(ids), num_items_in_batch=count).loss
        loss.backward()
        want_loss += loss.item()
    want = grads(model)
    # What a user does: the model built with "padfree" and called with the collator's packed row.
    padfree = AutoModelForCausalLM.from_config(config, attn_implementation="padfree").eval()
    padfree.load_state_dict(model.state_dict())
    loss = padfree(**packed_batch(seqs), num_items_in_batch=count).loss
    loss.backward()
    got = grads(padfree)
    assert math.isfinite(want_loss) and abs(loss.item() - want_loss) <= LOSS_TOL, (loss.item(), want_loss)
    assert got.keys() == want.keys() and len(want) > 10
    for name, w in want.items():
        assert w.abs().max() > 1e-8, f"{name}: no gradient to compare (a degenerate tiny model)"
        rel = ((got[name] - w).abs().max() / w.abs().max()).item()
        assert rel <= grad_rtol, f"{name}: relative gradient difference {rel:.2e}"


def _eager_then_padfree(config, **inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The same weights' logits under "eager", then under "padfree"."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        want = model(**inputs, use_cache=False).logits
        model.set_attn_implementation("padfree")
        return want, model(**inputs, use_cache=False).logits


@pytest.mark.parametrize("model_type", ["gpt_oss", "deepseek_v4"])
def test_padded_batch_under_padfree_equals_eager(model_type):
    """Right and left padding: sinks through the scores path too; DeepSeek-V4's block bias added to sdpa's mask
    after it is made additive (cast to bool, it would be inverted)."""
    ids = torch.tensor(np.stack(examples((13, 13), seed=4)))
    for mask in (torch.tensor([[1] * 13, [1] * 9 + [0] * 4]), torch.tensor([[1] * 13, [0] * 5 + [1] * 8])):
        want, got = _eager_then_padfree(config_of(model_type), input_ids=ids, attention_mask=mask)
        torch.testing.assert_close(got[mask.bool()], want[mask.bool()], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("model_type", "rows"), [
    ("deepseek_v4", [(9, 11), (16, 4)]),  # two rows of two examples each (equal row lengths: no padding)
    ("llama4_text", [LENGTHS]),  # one row of four
], ids=["deepseek_v4", "llama4"])  # fmt: skip
def test_rows_with_only_position_ids_are_per_example(model_type, rows):
    """Only input_ids and position_ids (boundaries from the mask builder): each example as alone under eager."""
    config = config_of(model_type)
    rows = [examples(row, seed=i + 1) for i, row in enumerate(rows)]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        want = torch.stack([torch.cat([model(**alone_batch(s)).logits[0] for s in row]) for row in rows])
        model.set_attn_implementation("padfree")
        got = model(input_ids=torch.stack([torch.tensor(np.concatenate(row)) for row in rows]), use_cache=False,
                    position_ids=torch.stack([torch.cat([torch.arange(len(s)) for s in row]) for row in rows])).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_deepseek_v4_one_sequence_is_causal_over_compressed_windows():
    """One sequence across the CSA (4) and HCA (8) windows: the compressed keys' block bias as under eager (query t
    sees window w once t + 1 >= (w + 1) * rate): eager's logits, unchanged by appended tokens."""
    config = config_of("deepseek_v4")
    ids = torch.tensor(examples((17,), seed=3)[0])[None]
    want, full = _eager_then_padfree(config, input_ids=ids)
    torch.testing.assert_close(full, want, rtol=1e-5, atol=1e-5)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="padfree").eval()
    with torch.no_grad():
        for n in (4, 9, 12):  # a prefix ending right after a CSA window, in an HCA window, at a window's end
            diff = (model(input_ids=ids[:, :n], use_cache=False).logits - full[:, :n]).abs().max().item()
            assert diff <= 1e-5, f"appending tokens after the first {n} changed their logits by {diff:.2e}"
