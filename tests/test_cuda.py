"""CUDA bf16 checks of "padfree" on whole models (skipped without a GPU; scripts/gpu_check.sh): padding-free bf16 is
about as close to an fp32 reference as padded bf16 is (flash-attn's test rule), loss and every gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import decoder_config
from transformers import AutoModelForCausalLM

import trl_padfree.attention as attention
from trl_padfree.attention_backends import select_backend
from trl_padfree.flattening import packed_batch, padded_batch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

LENGTHS = [37, 120, 5, 260, 64, 190, 1, 300]


def model(kind: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    config = decoder_config(kind, sliding_window=48, vocab_size=512, hidden_size=256, intermediate_size=512,  # Mistral:
                            num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2,  # window < most examples
                            max_position_embeddings=512, pad_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype).cuda().train()


def batches() -> tuple[dict, dict]:
    cu = np.concatenate([[0], np.cumsum(LENGTHS)]).astype(np.int64)
    ids = np.random.default_rng(0).integers(3, 512, size=int(cu[-1]), dtype=np.int64)
    labels = ids.copy()
    labels[cu[:-1]] = -100  # a sequence's first token has no prediction (padded: removed by the shift)
    move = lambda b: {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in b.items()}  # noqa: E731
    return move(packed_batch(ids, labels, cu)), move(padded_batch(ids, labels, cu, pad_id=0, ignore_index=-100))


def loss_and_grads(model, batch) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = model(**batch, use_cache=False).loss
    loss.backward()
    return loss.item(), {n: p.grad.float() for n, p in model.named_parameters()}


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_bf16_padfree_is_as_accurate_as_padded_sdpa(kind, monkeypatch):
    packed, padded = batches()
    reference = model(kind)
    ref_loss, ref_grads = loss_and_grads(reference, padded)
    bf16 = model(kind, torch.bfloat16)
    bf16.load_state_dict(reference.state_dict())
    pad_loss, pad_grads = loss_and_grads(bf16, padded)
    used, run = [], attention.run_varlen_attention
    monkeypatch.setattr(attention, "run_varlen_attention", lambda backend, *a, **k: used.append(backend) or run(backend, *a, **k))
    bf16.set_attn_implementation("padfree")
    pf_loss, pf_grads = loss_and_grads(bf16, packed)
    expected = select_backend("cuda", torch.bfloat16)
    assert expected in ("flash_attn", "torch_varlen"), "an sm80+ GPU should get a varlen kernel"
    assert used and set(used) == {expected}
    assert abs(pf_loss - ref_loss) <= 2 * abs(pad_loss - ref_loss) + 2e-3, (pf_loss, pad_loss, ref_loss)
    for name, ref in ref_grads.items():
        scale = ref.abs().max().clamp_min(1e-6)
        pad_err = ((pad_grads[name] - ref).abs().max() / scale).item()
        pf_err = ((pf_grads[name] - ref).abs().max() / scale).item()
        assert pf_err <= 2 * pad_err + 2e-2, f"{name}: padfree error {pf_err:.2e}, padded error {pad_err:.2e}"


def test_fp32_on_cuda_runs_the_sdpa_loop_exactly():
    assert select_backend("cuda", torch.float32) == "sdpa_loop"
    packed, padded = batches()
    fp32 = model("llama")
    pad_loss, pad_grads = loss_and_grads(fp32, padded)
    fp32.set_attn_implementation("padfree")
    pf_loss, pf_grads = loss_and_grads(fp32, packed)
    assert abs(pf_loss - pad_loss) / abs(pad_loss) <= 1e-5
    for name, grad in pad_grads.items():
        rel = ((pf_grads[name] - grad).abs().max() / grad.abs().max().clamp_min(1e-12)).item()
        assert rel <= 1e-3, f"{name}: relative gradient difference {rel:.2e}"
