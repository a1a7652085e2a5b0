"""``attn_implementation="padfree"`` on sinks (GPT-OSS, DeepSeek-V4, Granite-SWA), soft-capping (Gemma-2), Llama-4's
chunks and temperature, Gemma-4's KV sharing: packed under "padfree" vs each example alone under "eager", loss
within 1e-5, every gradient within 1e-4 relative."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

import trl_padfree  # noqa: F401  (registers "padfree")
from trl_padfree.probe import alone_batch, packed_batch, random_sequences

LOSS_TOL = 1e-5
GRAD_RTOL = 1e-4
VOCAB = 96
LENGTHS = (7, 13, 5, 20)  # some longer than the windows (6) and the Llama-4 chunk (8)


def family(model_type: str) -> None:
    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"transformers has no {model_type!r} model here")


def examples(lengths=LENGTHS, seed: int = 0) -> list[list[int]]:
    return random_sequences(lengths, VOCAB, 0, seed)


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_packed_equals_alone(config, seqs: list[list[int]] | None = None, init=None,
                               grad_rtol: float = GRAD_RTOL) -> tuple[float, dict]:
    """Packed under "padfree" vs each example alone under "eager" (after ``init(model)``): loss, every gradient."""
    seqs = examples() if seqs is None else seqs
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    if init is not None:
        init(model)
    count = sum(len(s) - 1 for s in seqs)
    model.zero_grad(set_to_none=True)
    want_loss = 0.0
    for ids in seqs:
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
    return want_loss, want


SIZES = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=256, pad_token_id=0)


def gpt_oss_config():
    family("gpt_oss")
    config = AutoConfig.for_model("gpt_oss", **SIZES, num_local_experts=4, num_experts_per_tok=2, sliding_window=6)
    assert config.layer_types == ["sliding_attention", "full_attention"] * 2
    return config


def deepseek_v4_config():
    family("deepseek_v4")
    return AutoConfig.for_model(
        "deepseek_v4", vocab_size=VOCAB, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, q_lora_rank=32, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, hc_mult=2, hc_sinkhorn_iters=3, sliding_window=6, o_groups=2,
        o_lora_rank=16, index_n_heads=2, index_head_dim=16, index_topk=4, num_nextn_predict_layers=0,
        layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                     "compressed_sparse_attention"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8})


def llama4_config():
    family("llama4_text")
    config = AutoConfig.for_model("llama4_text", **SIZES, attention_chunk_size=8, attn_temperature_tuning=True,
                                  floor_scale=4, num_local_experts=4, intermediate_size_mlp=64, no_rope_layer_interval=2)
    # chunked RoPE layers and full NoPE layers with the temperature scale (which changes every 4 positions)
    assert config.layer_types == ["chunked_attention", "full_attention"] * 2 and config.no_rope_layers == [1, 0, 1, 0]
    return config


def gemma2_config():
    family("gemma2")
    # a cap of 0.5 on logits scaled by 16**-0.5: tanh is far from linear here, so skipping it would show
    return AutoConfig.for_model("gemma2", **SIZES, sliding_window=6, attn_logit_softcapping=0.5,
                                query_pre_attn_scalar=16)


def granite_swa_config():
    family("granite_swa")
    config = AutoConfig.for_model("granite_swa", **SIZES, sliding_window=6)
    assert "sliding_attention" in config.layer_types
    return config


def gemma4_config():
    family("gemma4_text")
    return AutoConfig.for_model("gemma4_text", **SIZES, sliding_window=6, num_kv_shared_layers=2, global_head_dim=16,
                                layer_types=["sliding_attention", "full_attention"] * 2, hidden_size_per_layer_input=16,
                                vocab_size_per_layer_input=VOCAB)


def distinct_hash_experts(model):
    """Distinct random experts in DeepSeek-V4's token -> experts table (all zeros: no gate gradient)."""
    for name, buffer in model.named_buffers():
        if name.endswith("tid2eid"):
            buffer.copy_(torch.stack([torch.randperm(4)[:2] for _ in range(buffer.shape[0])]))


@pytest.mark.parametrize(("config", "seqs", "init"), [
    (gpt_oss_config, None, None),  # sinks, alternating sliding windows, GQA
    (gemma2_config, None, None),  # logit soft-capping with sliding windows
    (granite_swa_config, None, None),  # sinks
    (deepseek_v4_config, None, distinct_hash_experts),  # sinks, CSA and HCA layers compressing windows of 4 and 8
    (llama4_config, None, None),  # chunked attention and the temperature scale, per example
    (llama4_config, (21,), None),  # one sequence longer than a chunk
    (gemma4_config, None, None),  # KV sharing
], ids=["gpt_oss", "gemma2", "granite_swa", "deepseek_v4", "llama4", "llama4-one-sequence", "gemma4"])  # fmt: skip
def test_packed_under_padfree_equals_each_example_alone_under_eager(config, seqs, init):
    # DeepSeek-V4's hyper-connection head sums every token of 4 layers in float32: with 2 torch threads its
    # gradient differs by 1.1e-4 of its largest (1 thread: within 1e-4), the summing order, not a leak
    rtol = 3e-4 if config is deepseek_v4_config else GRAD_RTOL
    assert_packed_equals_alone(config(), None if seqs is None else examples(seqs), init, grad_rtol=rtol)


def _eager_then_padfree(config, **inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The same weights' logits under "eager", then under "padfree"."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        want = model(**inputs, use_cache=False).logits
        model.set_attn_implementation("padfree")
        return want, model(**inputs, use_cache=False).logits


@pytest.mark.parametrize("config", [gpt_oss_config, deepseek_v4_config], ids=["gpt_oss", "deepseek_v4"])
def test_padded_batch_under_padfree_equals_eager(config):
    """Right and left padding: sinks through the scores path too; DeepSeek-V4's block bias added to sdpa's mask
    after it is made additive (cast to bool, it would be inverted)."""
    ids = torch.tensor(np.stack(examples((13, 13), seed=4)))
    for mask in (torch.tensor([[1] * 13, [1] * 9 + [0] * 4]), torch.tensor([[1] * 13, [0] * 5 + [1] * 8])):
        want, got = _eager_then_padfree(config(), input_ids=ids, attention_mask=mask)
        torch.testing.assert_close(got[mask.bool()], want[mask.bool()], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("config", "rows"), [
    (deepseek_v4_config, [(9, 11), (16, 4)]),  # two rows of two examples each (equal row lengths: no padding)
    (llama4_config, [LENGTHS]),  # one row of four
], ids=["deepseek_v4", "llama4"])  # fmt: skip
def test_rows_with_only_position_ids_are_per_example(config, rows):
    """Only input_ids and position_ids (boundaries from the mask builder): each example as alone under eager."""
    config = config()
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
    config = deepseek_v4_config()
    ids = torch.tensor(examples((17,), seed=3)[0])[None]
    want, full = _eager_then_padfree(config, input_ids=ids)
    torch.testing.assert_close(full, want, rtol=1e-5, atol=1e-5)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="padfree").eval()
    with torch.no_grad():
        for n in (4, 9, 12):  # a prefix ending right after a CSA window, in an HCA window, at a window's end
            diff = (model(input_ids=ids[:, :n], use_cache=False).logits - full[:, :n]).abs().max().item()
            assert diff <= 1e-5, f"appending tokens after the first {n} changed their logits by {diff:.2e}"
