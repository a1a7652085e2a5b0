"""trl_padfree.families (tiny configs of today's decoder families, packed_vs_alone) and what the packing probe says
about them: their layer kinds, and advice that never recommends a choice that fails the same way."""

from __future__ import annotations

import re

import pytest
import torch
from tiny_models import tiny_family
from transformers import DataCollatorWithFlattening

from trl_padfree import families as fam
from trl_padfree.probe import _advice, check_packing, layer_kinds, random_sequences
from trl_padfree.recurrent import prepare_packed_layers, recurrent_layer_types

RECURRENT = {
    "qwen3_5_text": "gated delta rule", "qwen3_5_moe_text": "gated delta rule", "qwen3_next": "gated delta rule",
    "qwen4_exp_text": "gated delta rule", "olmo_hybrid": "gated delta rule", "lfm2": "short convolution",
    "lfm3": "short convolution", "kimi_linear": "kimi delta attention", "granitemoehybrid": "mamba",
    "nemotron_h": "mamba", "falcon_h1": "mamba", "bamba": "mamba", "zamba2": "mamba", "jamba": "mamba",
    "mamba2": "mamba",
}  # fmt: skip


def test_the_table_of_35_families_and_its_overrides() -> None:
    grouped = [t for members in fam.FAMILY_GROUPS.values() for t in members]
    assert len(fam.FAMILIES) == 35 and sorted(grouped) == sorted(fam.FAMILIES)
    assert not set(fam.FAMILIES) & set(fam.OLDER_FAMILIES)
    assert fam.tiny_family_config("no_such_family") is None
    config = fam.tiny_family_config("llama4_text", attention_chunk_size=4)
    assert config is None or (config.attention_chunk_size == 4 and config.attn_temperature_tuning)
    assert sorted(fam.EXACTNESS_LENGTHS)[-3] > fam.FAMILIES["gemma3_text"]["sliding_window"]  # windows are crossed
    assert len(set(fam.EXACTNESS_LENGTHS)) == len(fam.EXACTNESS_LENGTHS)
    gemma4 = fam.tiny_family_config("gemma4_text")
    assert gemma4 is None or gemma4.num_kv_shared_layers > 0


@pytest.mark.parametrize("model_type", sorted(fam.FAMILIES))
def test_every_family_is_small_has_its_layer_kinds_and_trains_exactly_packed(model_type: str) -> None:
    """Every layer kind; packed == alone (loss, gradients) once prepared; recurrent ones found."""
    model = tiny_family(model_type)
    config = model.config.get_text_config()
    assert (config.model_type, config.vocab_size, config.hidden_size, config.num_hidden_layers) == (model_type, 128, 64, 4)
    assert sum(p.numel() for p in model.parameters()) < 600_000
    kinds = layer_kinds(model)
    if model_type != "mamba2":  # the one pure state-space family
        assert [k for k in kinds if "attention" in k and k != "kimi delta attention"], kinds
    assert set(kinds) & set(RECURRENT.values()) == ({RECURRENT[model_type]} if model_type in RECURRENT else set())
    prepare_packed_layers(model)
    result = fam.packed_vs_alone(model)
    assert result.exact(), result
    assert bool(recurrent_layer_types(model)) == (model_type in RECURRENT)


def test_the_exactness_check_sees_masks_that_let_examples_mix_and_restores_the_model() -> None:
    result = fam.packed_vs_alone(tiny_family("opt", "sdpa"))  # OPT's sdpa mask never sees position_ids
    assert not result.exact() and result.loss_diff > 1e-3 and result.grad_diff > 1e-2
    assert fam.packed_vs_alone(tiny_family("opt", "padfree")).exact()
    result = fam.packed_vs_alone(tiny_family("gpt_oss", "eager"))  # GPT-OSS's eager attends across examples
    assert not result.exact() and result.loss_diff > 1e-3
    # the cache trap: without use_cache=False a KV cache skips the packed mask
    model = tiny_family("llama", "sdpa")
    flattened = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(
        [{"input_ids": s} for s in random_sequences(fam.EXACTNESS_LENGTHS, 128, 0, seed=0)], return_tensors="pt")
    assert not fam.packed_vs_alone(model, batch=flattened).exact()
    assert fam.packed_vs_alone(model, batch={**flattened, "use_cache": False}).exact() and fam.packed_vs_alone(model).exact()
    # every gradient measured, the model as it was
    model = tiny_family("qwen3_moe")
    model.eval()
    result = fam.packed_vs_alone(model)
    assert result.worst_param in dict(model.named_parameters())
    assert not model.training and all(p.grad is None for p in model.parameters())
    with pytest.raises(ValueError, match=r"at least 2 examples of length >= 2; got lengths=\[5\]"):
        fam.packed_vs_alone(model, lengths=[5])


def recommended(advice: str) -> set[str]:
    """The attention implementations an advice line recommends."""
    names = set(re.findall(r'attn_implementation="([\w/|-]+)"', advice))
    return names | ({"flash_attention_2"} if '"flash_attention_2"' in advice else set())


REPRESENTATIVE = [
    ("llama", "sdpa"), ("qwen3_5_text", "padfree"), ("qwen3_5_text", "sdpa"), ("lfm2", "padfree"),
    ("granitemoehybrid", "padfree"), ("gemma2", "padfree"), ("gpt_oss", "eager"), ("gpt_oss", "padfree"),
    ("llama4_text", "padfree"), ("jamba", "padfree"), ("mamba2", "padfree"), ("gemma4_text", "padfree"),
]  # fmt: skip


@pytest.mark.parametrize(("model_type", "attn"), REPRESENTATIVE, ids=[f"{t}-{a}" for t, a in REPRESENTATIVE])
def test_probe_verdict_names_the_layers_and_recommends_only_what_it_found_safe(model_type: str, attn: str) -> None:
    model = tiny_family(model_type, attn)
    report = check_packing(model)  # never raises for these: a failure is a verdict
    assert report.status in ("safe", "leaks", "error", "unsupported")
    assert report.model_type == model_type and report.attn_implementation == attn
    if model_type in RECURRENT:  # given the probe batch's boundaries: apart, or an error; never a silent leak
        assert RECURRENT[model_type] in report.layer_kinds and report.status in ("safe", "error")
    assert f"layers: {', '.join(report.layer_kinds)}" in str(report)
    if model_type == "mamba2":  # no attention layer to call "padfree": judged by its logits, not "unsupported"
        assert report.status in ("safe", "leaks")
    if report.ok:
        assert report.alternatives == {} and report.advice.startswith("padding_free=True is safe")
        return
    assert attn not in recommended(report.advice)  # never the choice that just failed
    for other in recommended(report.advice) - {"flash_attention_2"}:
        assert report.alternatives[other] == "safe", report
        model.set_attn_implementation(other)  # and it really is safe
        assert check_packing(model, try_alternatives=False).ok
        model.set_attn_implementation(attn)
    if "flash_attention_2" in recommended(report.advice):  # only beside a checked "padfree" or for soft-capping
        assert report.alternatives.get("padfree") == "safe" or "logit soft-capping" in report.layer_kinds
        assert "attention sinks" not in report.layer_kinds
    assert report.model_type + " " not in report.advice or "padding_free=False" in report.advice
    if not recommended(report.advice):
        assert "padding_free=False" in report.advice
    assert model.config._attn_implementation == attn  # restored after the alternatives


SINKS = "PadfreeAttentionError: attn_implementation='padfree' does not support attention sinks (s_aux, GPT-OSS style)"
CONV = (
    "ValueError: `causal_conv1d_fn` can't keep packed sequences apart without `causal_conv1d`. Install "
    "`causal_conv1d` to train on packed sequences."
)
SOFTCAP = "PadfreeAttentionError: ... attention logit soft-capping (softcap=50.0) ..."
GPT_OSS, DELTA = ("full attention", "attention sinks"), ("full attention", "gated delta rule")
OFF, LAST = "padding_free=False", "set padding_free=False."  # LAST: the advice's end
SAFE_THERE = "the probe ran it on this model: safe"
# _advice(status, model_type, attn, kinds, error, alternative) -> what it recommends, text it has, text it lacks
ADVICE = [
    # refused sinks: never "padfree" nor flash-attention (no FA2 sinks), unless "padfree" was checked safe
    (("error", "gpt_oss", "padfree", GPT_OSS, SINKS, None), set(), [LAST], ["flash_attention_2"]),
    (("leaks", "gpt_oss", "eager", GPT_OSS, None, None), set(), [LAST], ["padfree"]),
    (("leaks", "gpt_oss", "eager", GPT_OSS, None, "padfree"), {"padfree"}, [SAFE_THERE], []),
    # a recurrent layer: its kernels, not another attention
    *[(("error", "qwen3_5_text", attn, DELTA, CONV, None), set(), ["causal-conv1d and flash-linear-attention", OFF],
       ["try"]) for attn in ("sdpa", "padfree")],
    (("error", "qwen3_5_text", "eager", ("gated delta rule",), CONV, "padfree"), {"padfree"}, [SAFE_THERE], []),
    (("error", "lfm2", "padfree", ("full attention", "short convolution"), CONV, None), set(),
     ["CUDA kernels of causal-conv1d ("], []),
    (("leaks", "jamba", "padfree", ("full attention", "mamba"), None, None), set(), [LAST], []),
    # soft-capping: flash-attn, which computes it
    (("error", "gemma2", "padfree", ("full attention", "logit soft-capping"), SOFTCAP, None), {"flash_attention_2"},
     ["pip install flash-attn"], []),
    # a leak: an alternative only when checked
    (("leaks", "opt", "sdpa", ("full attention",), None, None), set(), [LAST], []),
    (("leaks", "opt", "sdpa", ("full attention",), None, "padfree"), {"padfree", "flash_attention_2"}, [], []),
    (("error", "gemma4_text", "padfree", (), "IndexError: too many indices", "sdpa"), {"sdpa"}, [], []),
]


@pytest.mark.parametrize(("call", "recommends", "has", "lacks"), ADVICE,
                         ids=[f"{c[1]}-{c[2]}-{c[5] or 'unchecked'}" for c, *_ in ADVICE])
def test_advice_recommends_only_what_fits_the_failure(call, recommends, has, lacks) -> None:
    status, model_type, attn, kinds, error, alternative = call
    advice = _advice(status, model_type, attn, 0.0, kinds=kinds, error=error, alternative=alternative)
    assert recommended(advice) == recommends, advice
    assert all(text in advice for text in has) and not any(text in advice for text in lacks), advice
    assert advice.endswith(LAST) or LAST not in has


def test_layout_advice_never_recommends_padfree_after_padfree_leaked() -> None:
    """The preference / group / reward probes share layout_report: a leak under "padfree" gets the layout off."""
    import time

    from trl_padfree.probe import layout_report

    def report(attn: str, error: str | None = None):  # noqa: ANN202
        return layout_report(
            tiny_family("llama", attn), expected=[torch.zeros(3)], got=None if error else [torch.ones(3)], error=error,
            setting=(torch.device("cpu"), torch.float32, 1e-4), lengths=[3], start=time.perf_counter(),
            batch="preference batch", values="logits", prompt_once=True, fix="prompt_once=False",
        )  # fmt: skip

    leak = report("padfree")
    assert leak.status == "leaks" and "even with attn_implementation='padfree'" in leak.advice
    assert "Load it with" not in leak.advice and leak.advice.endswith("set prompt_once=False.")
    assert "Load it with attn_implementation='padfree'" in report("sdpa").advice
    failed = report("sdpa", error="ValueError: boom")
    assert failed.status == "error" and failed.advice.endswith("(ValueError: boom); set prompt_once=False.")
