"""``attn_implementation="padfree"`` on the attention features beyond plain causal/sliding attention: attention
sinks (GPT-OSS, DeepSeek-V4, Granite-SWA), logit soft-capping (Gemma-2), Llama-4's chunked attention and
attention-temperature scale, Gemma-4's KV sharing.

Each family: a tiny random model (4 layers), several examples packed into one row under ``"padfree"`` against each
example alone under ``"eager"`` (the modeling file's own definition): the loss within 1e-5 and every parameter's
gradient within 1e-4 relative. The losses are sums over the batch's label tokens divided by their count
(``num_items_in_batch``), so the packed loss is the sum of the examples' losses and its gradients the sum of theirs.
Plus the torch kernel (:func:`trl_padfree.attention_backends.scores_attention`) against a plain reference and the
CUDA kernel choice for these features.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

import trl_padfree  # noqa: F401  (registers "padfree")
from trl_padfree.attention_backends import decide_backend, run_varlen_attention, scores_attention
from trl_padfree.flattening import packed_batch

LOSS_TOL = 1e-5
GRAD_RTOL = 1e-4
VOCAB = 96
LENGTHS = (7, 13, 5, 20)  # some longer than the windows (6) and the Llama-4 chunk (8)


def family(model_type: str) -> None:
    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"transformers has no {model_type!r} model here")


def examples(lengths=LENGTHS, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB, size=n, dtype=np.int64) for n in lengths]


def labels_of(ids: np.ndarray) -> np.ndarray:
    labels = ids.copy()
    labels[0] = -100  # nothing predicts an example's first token
    return labels


def packed(seqs: list[np.ndarray]) -> dict:
    cu = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    return packed_batch(np.concatenate(seqs), np.concatenate([labels_of(s) for s in seqs]), cu)


def alone(ids: np.ndarray) -> dict:
    return {"input_ids": torch.tensor(ids)[None], "labels": torch.tensor(labels_of(ids))[None]}


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_packed_equals_alone(config, seqs: list[np.ndarray] | None = None, init=None) -> tuple[float, dict]:
    """Packed under "padfree" vs each example alone under "eager": loss and every gradient (``init(model)``
    first, when given)."""
    seqs = examples() if seqs is None else seqs
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    if init is not None:
        init(model)
    count = sum(len(s) - 1 for s in seqs)
    model.zero_grad(set_to_none=True)
    want_loss = 0.0
    for ids in seqs:
        loss = model(**alone(ids), use_cache=False, num_items_in_batch=count).loss
        loss.backward()
        want_loss += loss.item()
    want = grads(model)

    # What a user does: the model built with "padfree" and called with the collator's packed row.
    padfree = AutoModelForCausalLM.from_config(config, attn_implementation="padfree").eval()
    padfree.load_state_dict(model.state_dict())
    loss = padfree(**packed(seqs), use_cache=False, num_items_in_batch=count).loss
    loss.backward()
    got = grads(padfree)
    assert math.isfinite(want_loss) and abs(loss.item() - want_loss) <= LOSS_TOL, (loss.item(), want_loss)
    assert got.keys() == want.keys() and len(want) > 10
    for name, w in want.items():
        assert w.abs().max() > 1e-8, f"{name}: no gradient to compare (a degenerate tiny model)"
        rel = ((got[name] - w).abs().max() / w.abs().max()).item()
        assert rel <= GRAD_RTOL, f"{name}: relative gradient difference {rel:.2e}"
    return want_loss, want


SIZES = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=256, pad_token_id=0)


# ---------------------------------------------------------------------------------------------- model families


def test_gpt_oss_sinks_with_alternating_sliding_windows_and_gqa():
    family("gpt_oss")
    config = AutoConfig.for_model("gpt_oss", **SIZES, num_local_experts=4, num_experts_per_tok=2, sliding_window=6)
    assert config.layer_types == ["sliding_attention", "full_attention"] * 2
    assert_packed_equals_alone(config)


def test_gpt_oss_padded_batch_under_padfree_equals_eager():
    """Without sequence boundaries (a padded batch's dense mask) the sinks run through the scores path too."""
    family("gpt_oss")
    config = AutoConfig.for_model("gpt_oss", **SIZES, num_local_experts=4, num_experts_per_tok=2, sliding_window=6)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    seqs = examples((9, 4))
    ids = torch.zeros(2, 9, dtype=torch.long)
    mask = torch.zeros(2, 9, dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)], mask[row, : len(seq)] = torch.tensor(seq), 1
    want = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    model.set_attn_implementation("padfree")
    got = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], rtol=1e-5, atol=1e-5)


def test_gemma2_logit_softcapping_with_sliding_windows():
    family("gemma2")
    # a cap of 0.5 on logits scaled by 16**-0.5: tanh is far from linear here, so skipping it would show
    config = AutoConfig.for_model("gemma2", **SIZES, sliding_window=6, attn_logit_softcapping=0.5,
                                  query_pre_attn_scalar=16)
    assert_packed_equals_alone(config)


def test_granite_swa_sinks():
    family("granite_swa")
    config = AutoConfig.for_model("granite_swa", **SIZES, sliding_window=6)
    assert "sliding_attention" in config.layer_types
    assert_packed_equals_alone(config)


def deepseek_v4_config():
    family("deepseek_v4")
    return AutoConfig.for_model(
        "deepseek_v4", vocab_size=VOCAB, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, q_lora_rank=32, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, hc_mult=2, hc_sinkhorn_iters=3, sliding_window=6, o_groups=2,
        o_lora_rank=16, index_n_heads=2, index_head_dim=16, index_topk=4, num_nextn_predict_layers=0,
        layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                     "compressed_sparse_attention"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    )


def test_deepseek_v4_sinks_and_compressed_attention():
    """CSA and HCA layers compress windows of 4 and 8 tokens and pick top-k windows: per example, not per row."""
    config = deepseek_v4_config()

    def distinct_hash_experts(model):
        # the token -> experts table starts all zeros: both picks expert 0 at a fixed weight 1/2, no gate gradient
        for name, buffer in model.named_buffers():
            if name.endswith("tid2eid"):
                buffer.copy_(torch.stack([torch.randperm(4)[:2] for _ in range(buffer.shape[0])]))

    assert_packed_equals_alone(config, init=distinct_hash_experts)


def test_deepseek_v4_two_packed_rows():
    """Two rows, each packing two examples (equal row lengths, so no padding): every example as if alone."""
    config = deepseek_v4_config()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    rows = [examples((9, 11), seed=1), examples((16, 4), seed=2)]
    want = torch.stack([torch.cat([model(**alone(s), use_cache=False).logits[0] for s in row]) for row in rows])
    model.set_attn_implementation("padfree")
    ids = torch.stack([torch.tensor(np.concatenate(row)) for row in rows])
    positions = torch.stack([torch.cat([torch.arange(len(s)) for s in row]) for row in rows])
    got = model(input_ids=ids, position_ids=positions, use_cache=False).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_deepseek_v4_one_sequence_is_causal_over_compressed_windows():
    """One unpacked sequence crossing the CSA (4) and HCA (8) windows: under "padfree" the compressed keys get the
    compressor's block bias as under eager (query t sees window w only once t + 1 >= (w + 1) * rate), so appending
    tokens leaves the earlier logits unchanged and the logits equal eager's."""
    config = deepseek_v4_config()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    ids = torch.tensor(examples((17,), seed=3)[0])[None]
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits
        model.set_attn_implementation("padfree")
        full = model(input_ids=ids, use_cache=False).logits
        for n in (4, 9, 12):  # a prefix ending right after a CSA window, in an HCA window, at a window's end
            prefix = model(input_ids=ids[:, :n], use_cache=False).logits
            diff = (prefix - full[:, :n]).abs().max().item()
            assert diff <= 1e-5, f"appending tokens after the first {n} changed their logits by {diff:.2e}"
    torch.testing.assert_close(full, want, rtol=1e-5, atol=1e-5)


def test_deepseek_v4_padded_batch_under_padfree_equals_eager():
    """A padded batch (right and left padding): "padfree" hands the module sdpa's boolean mask, which the module
    would extend with its additive block bias cast to bool (inverted); the patch makes it additive first."""
    config = deepseek_v4_config()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    ids = torch.tensor(np.stack(examples((13, 13), seed=4)))
    for mask in (torch.tensor([[1] * 13, [1] * 9 + [0] * 4]), torch.tensor([[1] * 13, [0] * 5 + [1] * 8])):
        model.set_attn_implementation("eager")
        with torch.no_grad():
            want = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
            model.set_attn_implementation("padfree")
            got = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        torch.testing.assert_close(got[mask.bool()], want[mask.bool()], rtol=1e-5, atol=1e-5)


def test_deepseek_v4_packed_vs_alone_under_padfree_with_small_compress_rates():
    """The probe's measurement (trl_padfree.families): packed and alone both under "padfree", with the families
    config's compression rates (4 and 8), which its examples (11, 5, 14, 9 tokens) cross."""
    family("deepseek_v4")
    from trl_padfree.families import FAMILIES, packed_vs_alone, tiny_family_model

    assert FAMILIES["deepseek_v4"]["compress_rates"] == {"compressed_sparse_attention": 4,
                                                         "heavily_compressed_attention": 8}
    result = packed_vs_alone(tiny_family_model("deepseek_v4", "padfree"))
    assert result.exact(), result


def llama4_config():
    family("llama4_text")
    config = AutoConfig.for_model(
        "llama4_text", **SIZES, attention_chunk_size=8, attn_temperature_tuning=True, floor_scale=4,
        num_local_experts=4, intermediate_size_mlp=64, no_rope_layer_interval=2,
    )
    # chunked RoPE layers and full NoPE layers with the temperature scale (which changes every 4 positions)
    assert config.layer_types == ["chunked_attention", "full_attention"] * 2
    assert config.no_rope_layers == [1, 0, 1, 0]
    return config


def test_llama4_chunked_attention_and_temperature_per_example():
    assert_packed_equals_alone(llama4_config())


def test_llama4_one_sequence_longer_than_a_chunk():
    assert_packed_equals_alone(llama4_config(), examples((21,)))


def test_llama4_without_the_collators_boundaries():
    """Only input_ids, labels and position_ids (boundaries from the mask builder): still per example."""
    config = llama4_config()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    seqs = examples()
    want = torch.cat([model(**alone(s), use_cache=False).logits[0] for s in seqs])
    model.set_attn_implementation("padfree")
    batch = packed(seqs)
    batch = {k: batch[k] for k in ("input_ids", "position_ids")}
    got = model(**batch, use_cache=False).logits[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_gemma4_kv_sharing():
    family("gemma4_text")
    config = AutoConfig.for_model(
        "gemma4_text", **SIZES, sliding_window=6, num_kv_shared_layers=2, global_head_dim=16,
        layer_types=["sliding_attention", "full_attention"] * 2, hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=VOCAB,
    )
    assert_packed_equals_alone(config)


# ------------------------------------------------------------------------------------------------ the kernel


def reference_attention(q, k, v, allowed, scale, softcap=None, sinks=None):
    """Textbook attention in float64, one head at a time: (H, Lq, D) x (H_kv, Lk, D), boolean ``allowed``."""
    q, k, v = q.double(), k.double(), v.double()
    groups = q.shape[0] // k.shape[0]
    out = []
    for h in range(q.shape[0]):
        logits = q[h] @ k[h // groups].T * scale
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        logits = logits.masked_fill(~allowed, float("-inf"))
        weights = logits.exp()
        denominator = weights.sum(-1, keepdim=True)
        if sinks is not None:
            denominator = denominator + sinks[h].exp()
        out.append((weights / denominator) @ v[h // groups])
    return torch.stack(out)


def test_scores_attention_exact_values():
    # all logits 0: each of the 3 keys and the sink (logit log 2) get weights 1:1:1:2, the sink's dropped
    q, k = torch.zeros(1, 1, 1, 4), torch.randn(1, 1, 3, 4)
    v = torch.tensor([1.0, 2.0, 6.0]).reshape(1, 1, 3, 1).expand(1, 1, 3, 4)
    out = scores_attention(q, k, v, None, sinks=torch.tensor([math.log(2.0)]))
    torch.testing.assert_close(out, torch.full((1, 1, 1, 4), 9.0 / 5.0))
    # soft-capping at 1: logits 100 and 0 become tanh(100) = 1 and 0, so the weights are e : 1
    q = torch.tensor([[[[10.0]]]])
    k = torch.tensor([[[[10.0], [0.0]]]])
    v = torch.tensor([[[[1.0], [0.0]]]])
    out = scores_attention(q, k, v, None, scale=1.0, softcap=1.0)
    torch.testing.assert_close(out, torch.tensor([[[[math.e / (math.e + 1)]]]]))
    # a masked key gets no weight, whatever its logit
    out = scores_attention(q, k, v, torch.tensor([[False, True]]), scale=1.0)
    assert out.item() == 0.0


@pytest.mark.parametrize("softcap", [None, 0.7])
@pytest.mark.parametrize("window", [None, 3])
def test_varlen_scores_loop_matches_a_plain_reference_per_sequence(softcap, window):
    lengths = [5, 1, 8, 4]
    torch.manual_seed(0)
    q = torch.randn(sum(lengths), 4, 8)
    k, v = torch.randn(sum(lengths), 2, 8), torch.randn(sum(lengths), 2, 8)  # GQA: 2 query heads per key head
    sinks = torch.randn(4, requires_grad=True)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    out = run_varlen_attention("sdpa_loop", q, k, v, cu, cu, 8, 8, scale=0.4, sliding_window=window,
                               softcap=softcap, sinks=sinks)
    out.sum().backward()
    got_grad = sinks.grad.clone()
    expected, want_grad = [], torch.zeros(4, dtype=torch.float64)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        n = b - a
        distance = torch.arange(n)[:, None] - torch.arange(n)[None, :]
        allowed = (distance >= 0) & (distance < (window or n))
        s = sinks.detach().double().requires_grad_()
        ref = reference_attention(q[a:b].transpose(0, 1), k[a:b].transpose(0, 1), v[a:b].transpose(0, 1), allowed,
                                  0.4, softcap, s)
        ref.sum().backward()
        want_grad += s.grad
        expected.append(ref.transpose(0, 1))
    torch.testing.assert_close(out.double(), torch.cat(expected), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_grad.double(), want_grad, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------ CUDA kernel choice


def test_cuda_kernel_choice_for_softcap_and_sinks():
    cuda = dict(flash_attn_installed=True, torch_varlen_installed=True, cuda_capability=(9, 0))
    assert decide_backend("cuda", torch.bfloat16, softcap=True, flash_attn_features=frozenset({"softcap"}),
                          **cuda) == ("flash_attn", None)
    backend, reason = decide_backend("cuda", torch.bfloat16, sinks=True, flash_attn_features=frozenset({"softcap"}),
                                     **cuda)
    assert backend == "sdpa_loop" and "attention sinks" in reason and "s_aux" in reason
    assert decide_backend("cuda", torch.bfloat16, sinks=True, softcap=True,
                          flash_attn_features=frozenset({"softcap", "sinks"}), **cuda) == ("flash_attn", None)
    backend, reason = decide_backend("cuda", torch.bfloat16, softcap=True, **(cuda | {"flash_attn_installed": False}))
    assert backend == "sdpa_loop" and reason.startswith("attention logit soft-capping: torch's varlen_attn has none")
    # without these features torch's kernel still serves, and CPUs always take the loop
    assert decide_backend("cuda", torch.bfloat16, **(cuda | {"flash_attn_installed": False})) == ("torch_varlen", None)
    assert decide_backend("cpu", torch.float32, softcap=True, sinks=True) == ("sdpa_loop", None)


def test_torch_varlen_refuses_softcap_and_sinks():
    q = torch.randn(3, 1, 4)
    cu = torch.tensor([0, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match="torch_varlen backend has no softcap or sinks"):
        run_varlen_attention("torch_varlen", q, q, q, cu, cu, 3, 3, softcap=1.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("feature", ["softcap", "sinks"])
def test_cuda_bf16_kernel_with_softcap_or_sinks_matches_the_fp32_loop(feature):
    """Whichever kernel decide_backend picks on this GPU (flash-attn or the loop) gives the fp32 loop's answer."""
    lengths = [5, 17, 40, 1, 9]
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device="cuda")
    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(sum(lengths), h, 64, device="cuda", dtype=torch.bfloat16, generator=generator)
               for h in (8, 2, 2))
    extra = {"softcap": 2.0} if feature == "softcap" else {"sinks": torch.randn(8, device="cuda")}
    expected = run_varlen_attention("sdpa_loop", q.float(), k.float(), v.float(), cu, cu, 40, 40,
                                    sliding_window=6, **extra)
    backend, _ = decide_backend("cuda", torch.bfloat16, softcap="softcap" in extra, sinks="sinks" in extra)
    assert backend != "torch_varlen"
    got = run_varlen_attention(backend, q, k, v, cu, cu, 40, 40, sliding_window=6, **extra)
    torch.testing.assert_close(got.float(), expected, rtol=2e-2, atol=2e-2, msg=backend)
