"""trl_padfree.recurrent: short convolutions and gated-delta-rule / KDA layers restart at every boundary of a packed
row (kernels vs each sequence alone; tiny hybrids; prompt_once refused; a trainer)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch
from tiny_models import tiny_family

from trl_padfree.probe import packed_batch
from trl_padfree.recurrent import PackedRowError, hub_function, prepare_packed_layers, torch_fallback_name
from trl_padfree.recurrent.conv import causal_conv1d_packed, varlen_causal_conv1d_fn
from trl_padfree.recurrent.delta_rule import varlen_delta_rule
from trl_padfree.testing import tiny_llama

BOUNDS = [0, 5, 11, 14]  # three sequences in one row of 14 tokens


def _modeling(name: str) -> types.ModuleType:
    return pytest.importorskip(f"transformers.models.{name}.modeling_{name}")


def _torch_fallback(fn):
    """transformers' own torch function behind a global (replaced or not; under a `kernels` layer or not)."""
    return hub_function(getattr(fn, "__trl_padfree_original__", fn))


def _seq_idx(bounds: list[int] = BOUNDS) -> torch.Tensor:
    lens = np.diff(bounds).tolist()
    return torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))[None]


def _grads(tensors, out) -> list[torch.Tensor]:
    weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
    return list(torch.autograd.grad((out * weights).sum(), tensors))


@pytest.mark.parametrize("activation", [None, "silu"])
def test_conv_packed_equals_each_sequence_alone(activation):
    reference = _torch_fallback(_modeling("qwen3_5").causal_conv1d_fn)
    torch.manual_seed(0)
    x = torch.randn(1, 6, BOUNDS[-1], requires_grad=True)
    weight = torch.randn(6, 4, requires_grad=True)
    bias = torch.randn(6, requires_grad=True)
    packed = causal_conv1d_packed(x, weight, bias, activation, seq_idx=_seq_idx())
    alone = torch.cat([reference(x[..., a:b], weight, bias, activation=activation)
                       for a, b in zip(BOUNDS, BOUNDS[1:], strict=False)], dim=-1)
    torch.testing.assert_close(packed, alone, rtol=0, atol=1e-6)
    for g_packed, g_alone in zip(_grads([x, weight, bias], packed), _grads([x, weight, bias], alone), strict=True):
        torch.testing.assert_close(g_packed, g_alone, rtol=1e-6, atol=1e-6)
    # the whole-row reference runs one sequence into the next: what the test would catch
    whole = reference(x, weight, bias, activation=activation)
    assert (whole[..., BOUNDS[1]] - alone[..., BOUNDS[1]]).abs().max() > 1e-3


def test_conv_replacement_reads_seq_idx_cu_seqlens_and_falls_through_and_two_rows():
    original = _torch_fallback(_modeling("lfm2").causal_conv1d_fn)
    replaced = varlen_causal_conv1d_fn(original)
    torch.manual_seed(1)
    x, weight = torch.randn(1, 3, BOUNDS[-1]), torch.randn(3, 3)
    cu = torch.tensor(BOUNDS, dtype=torch.int32)
    by_seq_idx = replaced(x, weight, None, seq_idx=_seq_idx().int())
    by_cu = replaced(x, weight, None, cu_seq_lens_q=cu, max_length_q=6)  # what transformers forwards as **kwargs
    torch.testing.assert_close(by_cu, by_seq_idx, rtol=0, atol=0)
    # no boundaries: exactly transformers' torch reference
    assert torch.equal(replaced(x, weight, None, position_ids=torch.arange(14)[None]), original(x, weight, None))
    with pytest.raises(PackedRowError, match="cover the layer's 1 x 14 tokens"):
        replaced(x, weight, None, cu_seq_lens_q=torch.tensor([0, 5, 13], dtype=torch.int32))
    # two rows by seq_idx: the first of two sequences, the second one
    x, weight = torch.randn(2, 3, 6), torch.randn(3, 4)
    out = causal_conv1d_packed(x, weight, seq_idx=torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0]]))
    torch.testing.assert_close(out[1:], original(x[1:], weight), rtol=0, atol=1e-6)
    torch.testing.assert_close(out[:1, :, 3:], original(x[:1, :, 3:], weight), rtol=0, atol=1e-6)


DELTA_RULES = [
    ("qwen3_5", "torch_chunk_gated_delta_rule", False, BOUNDS),
    ("qwen3_5", "torch_recurrent_gated_delta_rule", False, BOUNDS),
    ("kimi_linear", "chunk_kimi_delta_attention", True, BOUNDS),
    ("kimi_linear", "recurrent_kimi_delta_attention", True, BOUNDS),
    ("qwen3_next", "torch_chunk_gated_delta_rule", False, [0, 3, 70, 75]),  # chunks (64) never span two sequences
]


@pytest.mark.parametrize(("family", "name", "per_key_gate", "bounds"), DELTA_RULES)
def test_delta_rule_packed_equals_each_sequence_alone(family, name, per_key_gate, bounds):
    original = _torch_fallback(getattr(_modeling(family), name))
    replaced = varlen_delta_rule(original)
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, bounds[-1], 2, 4, requires_grad=True) for _ in range(3))  # 2 heads of dimension 4
    g = (-torch.rand((1, bounds[-1], 2, 4) if per_key_gate else (1, bounds[-1], 2)) - 0.05).requires_grad_()
    beta = torch.rand(1, bounds[-1], 2).requires_grad_()
    inputs = q, k, v, g, beta
    state = torch.randn(len(bounds) - 1, 2, 4, 4)
    common = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    packed, packed_state = replaced(q, k, v, g=g, beta=beta, initial_state=state, **common,
                                    cu_seqlens=torch.tensor(bounds, dtype=torch.int32))
    outs, states = [], []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        out, final = original(q[:, a:b], k[:, a:b], v[:, a:b], g=g[:, a:b], beta=beta[:, a:b],
                              initial_state=state[i : i + 1], **common)
        outs.append(out)
        states.append(final)
    alone = torch.cat(outs, dim=1)
    torch.testing.assert_close(packed, alone, rtol=0, atol=1e-6)
    torch.testing.assert_close(packed_state, torch.cat(states), rtol=0, atol=1e-6)
    for g_packed, g_alone in zip(_grads(inputs, packed), _grads(inputs, alone), strict=True):
        torch.testing.assert_close(g_packed, g_alone, rtol=1e-5, atol=1e-6)
    # seq_idx alone (Kimi-Linear passes the batch's kwargs through) gives the same
    by_seq_idx, _ = replaced(q, k, v, g=g, beta=beta, initial_state=state, **common, seq_idx=_seq_idx(bounds))
    torch.testing.assert_close(by_seq_idx, packed, rtol=0, atol=0)
    # the whole-row reference carries the state across the boundary; without boundaries it is what runs
    whole, whole_state = original(q, k, v, g=g, beta=beta, initial_state=state[:1], **common)
    assert (whole[:, bounds[1]:] - alone[:, bounds[1]:]).abs().max() > 1e-3
    out, out_state = replaced(q, k, v, g=g, beta=beta, initial_state=state[:1], **common, cu_seqlens=None)
    assert torch.equal(out, whole) and torch.equal(out_state, whole_state)


def test_prepare_replaces_only_torch_fallbacks_and_is_idempotent():
    from transformers.integrations.hub_kernels import use_kernel_func_from_hub_with_fallback

    module = types.ModuleType("trl_padfree_test_fake_modeling")

    def torch_delta_rule(query, key, value, g, beta, **kwargs):
        return value, None

    def causal_conv1d_fn(hidden_states, weight, bias=None, activation=None, **kwargs):
        return hidden_states  # the module's own undecorated torch code (transformers 5.23's LFM3 has one)

    def fused_recurrent_kda(*args, **kwargs):  # a function of that name from another package
        return None

    causal_conv1d_fn.__module__ = module.__name__
    module.causal_conv1d_fn = causal_conv1d_fn
    module.torch_chunk_gated_delta_rule = use_kernel_func_from_hub_with_fallback("chunk_gated_delta_rule", "fla")(
        torch_delta_rule)
    # an installed package's function (math stands in for flash-linear-attention: the same transformers wrapper)
    module.chunk_kda = use_kernel_func_from_hub_with_fallback("sqrt", "math")(lambda x: x)
    module.fused_recurrent_kda = fused_recurrent_kda
    layer_class = type("FakeLayer", (torch.nn.Module,), {"__module__": module.__name__})
    sys.modules[module.__name__] = module
    try:
        kept = module.chunk_kda
        assert torch_fallback_name(module.torch_chunk_gated_delta_rule) == "chunk_gated_delta_rule"
        assert torch_fallback_name(kept) is None and torch_fallback_name(causal_conv1d_fn) is None
        names = prepare_packed_layers(layer_class())
        assert names == ["trl_padfree_test_fake_modeling.causal_conv1d_fn",
                         "trl_padfree_test_fake_modeling.torch_chunk_gated_delta_rule"]
        assert module.chunk_kda is kept and module.fused_recurrent_kda is fused_recurrent_kda
        replaced = module.torch_chunk_gated_delta_rule, module.causal_conv1d_fn
        assert prepare_packed_layers(layer_class()) == names
        assert (module.torch_chunk_gated_delta_rule, module.causal_conv1d_fn) == replaced
    finally:
        del sys.modules[module.__name__]


def _sequences() -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.integers(3, 64, n) for n in (5, 9, 3)]


def _logits_alone(model, sequences) -> torch.Tensor:
    return torch.cat([model(input_ids=torch.from_numpy(s)[None], use_cache=False).logits[0] for s in sequences])


def test_qwen4_exp_with_a_cache_is_refused():
    """Qwen4-Exp's indexer with a cache (mask not split by position_ids): refused."""
    model = tiny_family("qwen4_exp_text").eval()
    batch = {k: v for k, v in packed_batch(_sequences()).items() if k != "use_cache"}
    with torch.no_grad(), pytest.raises(PackedRowError, match="spans all its 3 sequences.*use_cache=False"):
        model(**batch)


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "lfm2"])
def test_without_seq_idx_exact_or_refused(model_type):
    model = tiny_family(model_type).eval()
    batch = packed_batch(_sequences())
    with torch.no_grad():
        alone = _logits_alone(model, _sequences())
        for keys in (("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"), ("seq_idx",)):
            got = model(**{k: batch[k] for k in ("input_ids", "position_ids", "use_cache", *keys)}).logits[0]
            torch.testing.assert_close(got, alone, rtol=0, atol=1e-5)
        with pytest.raises(PackedRowError, match="came without seq_idx or cu_seq_lens_q"):
            model(**{k: batch[k] for k in ("input_ids", "position_ids", "use_cache")})


def test_padfree_prepares_a_model_called_by_hand_and_check_packing_passes():
    """from_config(..., attn_implementation="padfree") then the collator's batch: nothing else to call."""
    from trl_padfree import check_packing

    modeling = _modeling("lfm3")
    modeling.causal_conv1d_fn = _torch_fallback(modeling.causal_conv1d_fn)  # as transformers left it
    model = tiny_family("lfm3").eval()
    with torch.no_grad():
        packed = model(**packed_batch(_sequences())).logits[0]
        torch.testing.assert_close(packed, _logits_alone(model, _sequences()), rtol=0, atol=1e-5)
    assert hasattr(modeling.causal_conv1d_fn, "__trl_padfree_original__")
    report = check_packing(tiny_family("lfm2"))
    assert report.max_abs_diff <= report.tolerance


def test_launch_turns_an_unset_prompt_once_off_for_recurrent_layers():
    """``trl-padfree grpo``/``rloo`` leave prompt_once unset (on where it can run): after loading a hybrid model it
    is off, so the run trains instead of stopping at the refusal above; one set to true is refused in one line."""
    import dataclasses
    from types import SimpleNamespace

    from trl_padfree.launch.model import _shared_prompt_default

    @dataclasses.dataclass
    class Config:
        training: SimpleNamespace
        explicit: frozenset = frozenset()
        task: str = "grpo"

    off = _shared_prompt_default(Config(SimpleNamespace(prompt_once=False)), tiny_family("qwen3_5_text"))
    assert off.training.prompt_once is False and "prompt_once" in off.explicit
    from trl_padfree.launch.config import ConfigError

    with pytest.raises(ConfigError, match=r"^prompt_once: true cannot share a prompt with Lfm2ShortConv layers .*"
                                          r"set prompt_once=False\.$"):
        _shared_prompt_default(Config(SimpleNamespace(prompt_once=True), frozenset({"prompt_once"})), tiny_family("lfm2"))
    llama = tiny_llama(vocab_size=64, attn_implementation="padfree")
    unset = Config(SimpleNamespace(prompt_once=False))
    assert _shared_prompt_default(unset, llama) is unset and not unset.explicit  # attention only: the recipe decides


def test_sft_trainer_prepares_recurrent_layers_under_sdpa(tok, tmp_path):
    """Recurrent layers prepared under sdpa too: padding-free's first loss is padded's."""
    from tiny_sft import losses, make_trainer, tokenized_dataset

    modeling = _modeling("lfm2")
    modeling.causal_conv1d_fn = _torch_fallback(modeling.causal_conv1d_fn)  # as transformers left it
    first_losses = []
    for padding_free in (True, False):
        trainer = make_trainer(padding_free, tokenized_dataset(tok, 8), tok, str(tmp_path / str(padding_free)),
                               model=tiny_family("lfm2", attn="sdpa", vocab_size=len(tok)), check_packing=padding_free,
                               max_steps=1)
        trainer.train()
        first_losses.append(losses(trainer)[0])
    assert hasattr(modeling.causal_conv1d_fn, "__trl_padfree_original__")
    assert first_losses[0] == pytest.approx(first_losses[1], rel=1e-5)
