"""trl_padfree.probe: the packing probe, assert_packing_safe and ``trl-padfree check`` (tiny random models)."""

from __future__ import annotations

import json
import math
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers as tf
from layout_runs import register_leaky_attention
from paths import ROOT
from torch import nn

from trl_padfree import cli
from trl_padfree.check import main
from trl_padfree.probe import (
    DEFAULT_LENGTHS,
    LAYOUTS,
    PackingLeakError,
    assert_layout_packing_safe,
    assert_packing_safe,
    check_layout_packing,
    check_packing,
    packed_batch,
)
from trl_padfree.testing import tiny_llama_config


def llama(attn: str = "sdpa", dtype: torch.dtype = torch.float32, **overrides: object) -> tf.LlamaForCausalLM:
    """Tiny random Llama; a fresh config each time (``_from_config`` writes the dtype into the config)."""
    torch.manual_seed(0)
    config = tiny_llama_config(vocab_size=128, max_position_embeddings=128, **overrides)
    return tf.LlamaForCausalLM._from_config(config, attn_implementation=attn, dtype=dtype)


def opt(attn: str = "sdpa", dtype: torch.dtype = torch.float32, **overrides: object) -> tf.OPTForCausalLM:
    """Tiny random OPT: its sdpa/eager mask never sees position_ids, so packed examples leak."""
    torch.manual_seed(0)
    config = tf.OPTConfig(vocab_size=128, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                          word_embed_proj_dim=64, max_position_embeddings=128, **overrides)
    return tf.OPTForCausalLM._from_config(config, attn_implementation=attn, dtype=dtype)


FLATTENING = tf.DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)


def test_packed_batch_is_transformers_flattening_collators_plus_use_cache_false() -> None:
    sequences = [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]
    ours = packed_batch(sequences)
    theirs = FLATTENING([{"input_ids": s} for s in sequences], return_tensors="pt")
    assert set(ours) == set(theirs) | {"use_cache"} and ours["use_cache"] is False
    for key, value in theirs.items():
        assert torch.equal(ours[key], value) if isinstance(value, torch.Tensor) else ours[key] == value, key
    assert ours["cu_seq_lens_q"].tolist() == [0, 3, 8, 10]
    with pytest.raises(ValueError, match="no empty sequence"):
        packed_batch([[1, 2], []])


@pytest.mark.parametrize("attn", ["sdpa", "eager", "padfree"])
def test_llama_is_safe_opt_leaks_except_under_padfree(attn: str) -> None:
    report = check_packing(llama(attn))
    assert (report.ok, report.status, report.model_type, report.attn_implementation) == (True, "safe", "llama", attn)
    assert report.max_abs_diff < 1e-5 and report.noise == 0.0 and report.error is None
    assert (report.dtype, report.device, report.lengths) == ("float32", "cpu", DEFAULT_LENGTHS)
    assert str(report).startswith(f"SAFE: llama (attn_implementation='{attn}', float32 on cpu)")
    assert report.advice == f"padding_free=True is safe for llama with attn_implementation='{attn}'."
    report = check_packing(opt(attn))
    if attn == "padfree":
        assert report.ok
        return
    assert (report.ok, report.status, report.model_type) == (False, "leaks", "opt")
    first, *later = report.example_diffs
    assert first < 1e-5 and min(later) > 0.05  # the first example has nothing before it to attend to
    assert f"opt builds its {attn} attention mask without position_ids" in report.advice
    for fix in ('attn_implementation="padfree"', '"flash_attention_2"', "padding_free=False"):
        assert fix in report.advice
    with pytest.raises(PackingLeakError) as info:
        assert_packing_safe(opt(attn))
    assert isinstance(info.value, ValueError) and str(info.value).startswith(f"LEAKS: opt (attn_implementation='{attn}'")
    assert f"advice: {report.advice}" in str(info.value)


def test_tolerance_follows_dtype_and_arguments_and_a_collate_fn_without_use_cache_false_is_trapped() -> None:
    safe, leak = check_packing(llama("sdpa", torch.bfloat16)), check_packing(opt("sdpa", torch.bfloat16))
    assert safe.ok and safe.dtype == "bfloat16" and 0 < safe.max_abs_diff < safe.tolerance < 0.06
    assert not leak.ok and leak.max_abs_diff > 3 * leak.tolerance
    assert check_packing(llama("sdpa")).tolerance < 1e-4
    report = check_packing(opt(), lengths=[3, 5], rtol=10.0, seed=3)
    assert report.ok and report.lengths == (3, 5)  # the tolerance swallows the leak
    with pytest.raises(ValueError, match=r"at least 2 sequences of length >= 1; got lengths=\[5\]"):
        check_packing(opt(), lengths=[5])
    model = llama("sdpa")
    trapped = check_packing(model, collate_fn=lambda f: FLATTENING(f, return_tensors="pt"))
    assert trapped.status == "leaks" and "cache trap" in trapped.advice
    fixed = check_packing(model, collate_fn=lambda f: {**FLATTENING(f, return_tensors="pt"), "use_cache": False})
    assert fixed.ok and fixed.max_abs_diff == check_packing(model).max_abs_diff


def test_state_space_models_mamba2_is_prepared_safe_and_mamba_leaks_with_specific_advice() -> None:
    """Mamba-2 prepared as the trainers do is safe; Mamba-1 leaks, advice without an attention."""
    torch.manual_seed(0)
    config = tf.Mamba2Config(vocab_size=128, hidden_size=64, num_hidden_layers=1, state_size=16, expand=2,
                             n_groups=1, head_dim=16, num_heads=8, chunk_size=8)
    report = check_packing(tf.Mamba2ForCausalLM(config))
    assert report.status == "safe" and report.layer_kinds == ("mamba",)
    config = tf.MambaConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1, state_size=8, expand=2)
    report = check_packing(tf.MambaForCausalLM(config))
    assert report.status == "leaks" and "mamba layers carry state across packed examples" in report.advice
    assert report.advice.endswith("set padding_free=False.") and "attn_implementation=" not in report.advice


def test_randomness_is_neutralised_then_restored() -> None:
    model = opt("eager", dropout=0.5, attention_dropout=0.5, layerdrop=0.5).eval()
    model.model.decoder.layers[1].train()  # a mixed state must come back exactly as it was
    flags = {name: m.training for name, m in model.named_modules()}
    rng = torch.get_rng_state()
    report = check_packing(model)
    assert report.noise == 0.0 and report.status == "leaks" and report.example_diffs[0] < 1e-5
    assert {name: m.training for name, m in model.named_modules()} == flags and torch.equal(torch.get_rng_state(), rng)
    assert (model.config.dropout, model.config.layerdrop, model.model.decoder.layers[0].self_attn.dropout) == (
        0.5, 0.5, 0.5)
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(llama("sdpa"), peft.LoraConfig(r=4, lora_dropout=0.5, target_modules=["q_proj"]))
    model.train()
    assert check_packing(model).ok and all(m.training for m in model.modules())
    assert {m.p for m in model.modules() if isinstance(m, nn.Dropout)} == {0.5}


class _Wrapper(nn.Module):
    """A causal LM wrapper whose forward either rejects packed kwargs or adds train-mode noise."""

    def __init__(self, inner: nn.Module, mode: str) -> None:
        super().__init__()
        self.inner, self.mode, self.config = inner, mode, inner.config

    def get_input_embeddings(self) -> nn.Module:
        return self.inner.get_input_embeddings()

    def forward(self, input_ids, attention_mask=None, labels=None, use_cache=None, **kwargs):  # noqa: ANN001
        if self.mode == "strict" and kwargs:
            raise TypeError(f"forward() got an unexpected keyword argument {sorted(kwargs)[0]!r}")
        out = self.inner(input_ids=input_ids, attention_mask=attention_mask, use_cache=use_cache, **kwargs)
        if self.mode == "noisy" and self.training:
            out.logits = out.logits + 0.1 * torch.rand_like(out.logits)
        return out


def test_a_rejected_batch_is_an_error_leftover_randomness_inconclusive_a_broken_model_raises() -> None:
    model = _Wrapper(llama("sdpa"), "strict").eval()
    report = check_packing(model)
    assert (report.ok, report.status) == (False, "error") and str(report).startswith("ERROR: llama")
    assert report.error == "TypeError: forward() got an unexpected keyword argument 'cu_seq_lens_k'"
    assert math.isinf(report.max_abs_diff) and report.to_dict()["max_abs_diff"] is None
    json.dumps(report.to_dict())  # JSON-safe
    assert not any(m.training for m in model.modules())  # restored although the forward raised
    report = check_packing(_Wrapper(llama("sdpa"), "noisy"))
    assert report.status == "inconclusive" and report.noise > report.tolerance

    class Broken(nn.Module):  # fails on the ordinary batch too: the probe raises, it is no verdict
        config = tf.LlamaConfig(vocab_size=16)

        def forward(self, **batch):  # noqa: ANN003, ANN202
            raise RuntimeError("broken model")

    with pytest.raises(RuntimeError, match="broken model"):
        check_packing(Broken())


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_each_trainer_layout_is_safe_under_padfree_and_leaks_are_caught(layout: str) -> None:
    """Preference, group and reward layouts (packed, prompt-once) are each sequence alone under "padfree"; a leaking
    attention, and sdpa with prompt-once (blind to shared prompt keys), are caught with the fix in the advice."""
    def model(attn: str) -> nn.Module:
        torch.manual_seed(0)
        config = tiny_llama_config(vocab_size=64, num_labels=1, pad_token_id=0)
        cls = tf.LlamaForSequenceClassification if layout == "reward" else tf.LlamaForCausalLM
        return cls._from_config(config, attn_implementation=attn)

    for prompt_once in (False, True):
        assert check_layout_packing(model("padfree"), layout, prompt_once=prompt_once).status == "safe"
    report = check_layout_packing(model(register_leaky_attention()), layout)
    assert report.status == "leaks" and report.max_abs_diff > 100 * report.tolerance
    assert "attn_implementation='padfree'" in report.advice
    assert check_layout_packing(model("sdpa"), layout).status == "safe"
    report = check_layout_packing(model("sdpa"), layout, prompt_once=True)
    assert report.status == "leaks" and report.advice.startswith("the prompt-once ")
    with pytest.raises(PackingLeakError):
        assert_layout_packing_safe(model("sdpa"), layout, prompt_once=True)


# models whose attention bypasses transformers' AttentionInterface never call "padfree" (MPT crashes on its mask,
# Bloom and XGLM run their own attention): the probe says so instead of crashing or calling it a leak
UNSUPPORTED = {
    "mpt": (tf.MptConfig(n_layers=2, d_model=64, n_heads=4, vocab_size=128, max_seq_len=128), "AttributeError"),
    "bloom": (tf.BloomConfig(n_layer=2, hidden_size=64, n_head=4, vocab_size=128), None),
    "xglm": (tf.XGLMConfig(num_layers=2, d_model=64, attention_heads=4, ffn_dim=128, vocab_size=128), None),
}


@pytest.mark.parametrize("model_type", sorted(UNSUPPORTED))
def test_padfree_on_a_model_that_never_calls_it_is_unsupported(model_type: str) -> None:
    config, error = UNSUPPORTED[model_type]
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="padfree")
    report = check_packing(model)
    assert (report.ok, report.status, report.model_type) == (False, "unsupported", model_type)
    assert (report.error or "").startswith(error or "") and (report.error is None) == (error is None)
    cls = type(model).__name__
    assert report.advice.startswith(f"{cls} computes attention in its own code, not through transformers' ")
    assert "attn_implementation='eager' and set padding_free=False" in report.advice
    assert str(report).startswith(f"UNSUPPORTED: {model_type} (attn_implementation='padfree'")
    with pytest.raises(PackingLeakError, match="never calls this attention implementation"):
        assert_packing_safe(model)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    paths = {"llama": root / "llama", "opt": root / "opt"}
    llama("sdpa").save_pretrained(paths["llama"])
    opt("sdpa").save_pretrained(paths["opt"])
    return paths


CPU32 = ["--dtype", "float32", "--device", "cpu"]


def test_cli_exit_codes_text_and_json(saved: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", str(saved["llama"]), "--attn-implementation", "sdpa", *CPU32]) == 0
    out = capsys.readouterr().out
    assert out.startswith("SAFE: llama (attn_implementation='sdpa', float32 on cpu) keeps packed examples apart.")
    assert "advice: padding_free=True is safe" in out
    assert cli.main(["check", "--model", str(saved["opt"]), "--attn-implementation", "eager", *CPU32]) == 1
    out = capsys.readouterr().out
    assert out.startswith("LEAKS: opt (attn_implementation='eager', float32 on cpu)")
    assert 'attn_implementation="padfree"' in out and "padding_free=False" in out
    # following the advice: padfree makes OPT exit 0
    assert main(["--model", str(saved["opt"]), "--attn-implementation", "padfree", *CPU32]) == 0
    assert capsys.readouterr().out.startswith("SAFE: opt (attn_implementation='padfree', float32 on cpu)")
    assert main(["--model", str(saved["opt"]), "--attn_implementation", "default", "--json", "--lengths", "4,6,3",
                 *CPU32]) == 1
    data = json.loads(capsys.readouterr().out)
    assert (data["ok"], data["status"], data["model_type"], data["lengths"]) == (False, "leaks", "opt", [4, 6, 3])
    assert data["attn_implementation"] == "sdpa"  # the checkpoint's default


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "{llama}", "--lengths", "4,x"], "--lengths must be comma-separated integers"),
    (["--model", "{llama}", "--lengths", "4"], "--lengths needs at least 2 lengths >= 1"),
    (["--model", "{llama}", "--attn-implementation", "sdpaa"], "attn_implementation 'sdpaa' is not one of auto, "
     "default, eager, "),
])
def test_cli_bad_input_exits_2_with_one_line(saved, capsys, args, message) -> None:  # noqa: ANN001
    names = {"llama": str(saved["llama"])}
    assert main([a.format(**names) for a in args] + CPU32) == 2
    err = capsys.readouterr().err
    assert err.startswith("trl-padfree check: " + message.format(**names))
    assert err.count("\n") == 1


def test_cli_missing_path_in_a_real_process_prints_no_traceback(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    proc = subprocess.run([sys.executable, "-m", "trl_padfree.cli", "check", "--model", str(missing)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"trl-padfree check: model path '{missing}' does not exist; pass a model directory (config.json + weights)."
    )
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bf16_inputs_follow_the_model() -> None:
    safe = check_packing(llama("sdpa", torch.bfloat16).to("cuda"))
    leak = check_packing(opt("sdpa", torch.bfloat16).to("cuda"))
    assert safe.ok and safe.device.startswith("cuda") and safe.dtype == "bfloat16"
    assert leak.status == "leaks" and leak.device.startswith("cuda")


def test_probe_families_script_refuses_an_unknown_type(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """(Its table: tests/test_docs.py runs the script as docs/probe.md shows it and compares the rows with the page.)"""
    script = runpy.run_path(str(ROOT / "scripts/probe_families.py"), run_name="probe_families")
    with pytest.raises(SystemExit) as exit_info:
        script["main"](["--types", "lama", "--out", str(tmp_path / "families.md")])
    assert exit_info.value.code == 2
    assert "unknown model type(s) lama; use names like llama" in capsys.readouterr().err


class RunningMean(torch.nn.Module):
    """A remote-code-style recurrent layer: a running mean over the row, which crosses example boundaries."""

    def __init__(self, mlp: torch.nn.Module) -> None:
        super().__init__()
        self.mlp = mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x + 0.5 * x.cumsum(1) / torch.arange(1, x.shape[1] + 1)[None, :, None])


def test_an_unknown_recurrent_layer_is_named_in_the_refusal() -> None:
    """A layer without a varlen path is refused before training; the advice names the first module whose input
    agrees packed vs alone and whose output does not, and what to do."""
    model = llama("padfree")
    model.model.layers[1].mlp = RunningMean(model.model.layers[1].mlp)
    report = check_packing(model)
    assert report.status == "leaks" and report.first_leak == "model.layers.1.mlp (RunningMean)"
    assert report.advice.startswith("the first module that mixes packed examples is model.layers.1.mlp (RunningMean);")
    assert report.advice.endswith("set padding_free=False.") and "\n" not in report.advice
    with pytest.raises(PackingLeakError, match=r"model\.layers\.1\.mlp \(RunningMean\)"):
        assert_packing_safe(model)
    assert check_packing(llama("padfree")).first_leak is None  # a safe model: no leak to locate


def test_a_leaking_model_whose_layers_hold_length_shaped_tensors_is_reported_not_crashed() -> None:
    """DeepSeek-V4 under eager leaks, reported (length-shaped tensors once crashed the search)."""
    from trl_padfree.families import tiny_family_model

    report = check_packing(tiny_family_model("deepseek_v4", "eager", prepare=True), try_alternatives=False)
    assert report.status == "leaks", report.error
