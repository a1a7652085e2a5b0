"""Tests for trl_padfree.bench (`trl-padfree bench`): a tiny smoke run of the real benchmark, its outputs, its
target checks and its error messages. No timing assertions: only structure and exact (seeded) training results.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from trl_padfree import cli
from trl_padfree.bench import (
    DATASETS,
    MODEL_PRESETS,
    TEMPLATE_IDS,
    BenchConfig,
    evaluate_targets,
    main,
    make_examples,
    run_benchmark,
)

TINY = [
    "--layers", "1", "--hidden", "32", "--heads", "4", "--kv-heads", "2", "--intermediate", "64",
    "--vocab-size", "128", "--batch-size", "4", "--steps", "2", "--warmup", "1", "--eval-batches", "1",
    "--length-scale", "0.1", "--max-length", "160",
]  # fmt: skip
VARIANTS = ["padded-sdpa", "packed-sdpa", "packed-padfree"]
RESULT_FIELDS = {
    "dataset", "variant", "attn_implementation", "padding_free", "optimizer_steps", "timed_steps", "warmup_steps",
    "train_loss", "eval_loss", "eval_target_tokens", "step_seconds", "cpu_seconds", "collate_seconds",
    "real_tokens", "input_tokens", "target_tokens", "timed_seconds", "tokens_per_second", "tokens_per_cpu_second",
    "tokens_per_cpu_second_runs",
    "memory_kind", "peak_memory_mb", "memory_above_start_mb", "tokens_per_second_runs",
}  # fmt: skip


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One in-process run: both datasets, padded sdpa + packed sdpa + packed padfree (+ fa2, skipped on CPU)."""
    out = tmp_path_factory.mktemp("bench")
    argv = [*TINY, "--in-process", "--variants", ",".join([*VARIANTS, "packed-fa2"]), "--output-dir", str(out)]
    assert main(argv) == 0
    return out, json.loads((out / "cpu.json").read_text())


def test_smoke_run_writes_json_markdown_and_png(smoke, capsys):
    out, report = smoke
    assert sorted(p.name for p in out.iterdir()) == ["cpu.json", "cpu.md", "cpu.png"]
    assert (out / "cpu.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(report) >= {"benchmark", "created", "config", "machine", "datasets", "targets", "paper"}
    assert {"cpu", "torch", "transformers", "trl_padfree", "gpu"} <= set(report["machine"])
    assert report["machine"]["gpu"] is None
    assert report["config"]["loss_rtol"] == 1e-5
    markdown = (out / "cpu.md").read_text()
    for dataset in DATASETS:
        assert report["datasets"][dataset]["label"] in markdown
    assert markdown.count("| packed-padfree | ") == 2
    assert "skipped: flash_attention_2 needs a CUDA device (got --device cpu)" in markdown
    assert "## Targets" in markdown


def test_every_variant_has_every_field_and_counts_its_steps(smoke):
    _, report = smoke
    assert list(report["datasets"]) == ["flan", "orcamath"]
    for entry in report["datasets"].values():
        assert list(entry["variants"]) == [*VARIANTS, "packed-fa2"]
        assert entry["variants"]["packed-fa2"]["skipped"].startswith("flash_attention_2 needs a CUDA device")
        for name in VARIANTS:
            res = entry["variants"][name]
            assert set(res) == RESULT_FIELDS, set(res) ^ RESULT_FIELDS
            assert res["optimizer_steps"] == 3 and res["timed_steps"] == 2 and res["warmup_steps"] == 1
            assert len(res["train_loss"]) == len(res["step_seconds"]) == len(res["real_tokens"]) == 3
            assert res["tokens_per_second"] == pytest.approx(sum(res["real_tokens"][1:]) / sum(res["step_seconds"][1:]))
            assert res["peak_memory_mb"] > 50
            assert all(math.isfinite(v) for v in res["train_loss"])
        padded, packed = entry["variants"]["padded-sdpa"], entry["variants"]["packed-padfree"]
        # Same examples in the same batches: same real tokens and loss targets, padding only in the padded layout.
        assert padded["real_tokens"] == packed["real_tokens"] == packed["input_tokens"]
        assert padded["target_tokens"] == packed["target_tokens"]
        assert all(p > r for p, r in zip(padded["input_tokens"], padded["real_tokens"], strict=True))
        assert set(entry["comparison"]) == set(VARIANTS)
        assert entry["comparison"]["padded-sdpa"]["throughput_ratio"] == 1.0


def test_loss_curves_of_padding_free_variants_equal_padded(smoke):
    _, report = smoke
    for entry in report["datasets"].values():
        reference = entry["variants"]["padded-sdpa"]
        assert reference["train_loss"][0] > reference["train_loss"][-1] - 1.0  # a real, finite curve
        for name in ("packed-sdpa", "packed-padfree"):
            res = entry["variants"][name]
            np.testing.assert_allclose(res["train_loss"], reference["train_loss"], rtol=1e-5, atol=0)
            assert res["eval_loss"] == pytest.approx(reference["eval_loss"], rel=1e-5, abs=0)
    losses = [t for t in report["targets"] if "losses equal" in t["target"]]
    assert len(losses) == 4 and all(t["holds"] is True for t in losses)
    throughput = [t for t in report["targets"] if "real tokens/s" in t["target"]]
    assert [isinstance(t["value"], float) for t in throughput] == [True, True, True]
    assert [t["holds"] for t in throughput] == [None, None, None]  # measured; no verdict for this smaller model


def test_interleaved_worker_processes_reproduce_the_in_process_run(smoke):
    """The default path: each variant in a fresh worker, trained in lockstep; same seed, same losses."""
    _, report = smoke
    config = BenchConfig(
        datasets=["orcamath"], variants=["padded-sdpa", "packed-padfree"], layers=1, hidden=32, heads=4,
        kv_heads=2, intermediate=64, vocab_size=128, batch_size=4, steps=2, warmup=1, eval_batches=1,
        length_scale=0.1, max_length=160,
    )  # fmt: skip
    assert (config.subprocess, config.schedule) == (True, "interleaved")
    logged: list[str] = []
    sub = run_benchmark(config, log=logged.append)
    assert "interleaved]" in logged[-1]
    entry = sub["datasets"]["orcamath"]
    for name in config.variants:
        res = entry["variants"][name]
        assert res["memory_kind"] == "peak RSS of a fresh worker process"
        assert res["peak_memory_mb"] > 100  # python + torch + transformers, at least
        expected = report["datasets"]["orcamath"]["variants"][name]
        np.testing.assert_allclose(res["train_loss"], expected["train_loss"], rtol=1e-6, atol=0)
        assert res["optimizer_steps"] == 3 and res["real_tokens"] == expected["real_tokens"]
    assert entry["comparison"]["packed-padfree"]["median_step_speedup"] > 0


def test_synthetic_datasets_follow_the_papers_length_statistics():
    rng = np.random.default_rng(1)
    flan = DATASETS["flan"].sample(rng, 50_000, min_length=16, max_length=4096)
    assert 320 <= np.median(flan) <= 360 and 430 <= flan.mean() <= 490
    examples = make_examples("orcamath", 50, vocab_size=128, seed=3)
    for ids in examples:
        starts = [i for i in range(len(ids)) if tuple(ids[i : i + 3]) == TEMPLATE_IDS]
        assert len(starts) == 1 and 0.6 < starts[0] / len(ids) < 0.8
    assert make_examples("orcamath", 50, vocab_size=128, seed=3) == examples
    assert make_examples("orcamath", 50, vocab_size=128, seed=4) != examples


def _report(ratio_flan: float, ratio_vs_sdpa: float, loss_diff: float, padfree_mb: float) -> dict:
    def res(tps: float, mb: float) -> dict:
        return {"tokens_per_second": tps, "peak_memory_mb": mb}

    flan = {
        "variants": {
            "padded-sdpa": res(100.0, 1000.0),
            "packed-sdpa": res(100.0 * ratio_flan / ratio_vs_sdpa, 900.0),
            "packed-padfree": res(100.0 * ratio_flan, padfree_mb),
        },
        "comparison": {
            "packed-padfree": {"train_loss_max_rel_diff": loss_diff, "eval_loss_rel_diff": 0.0, "same_steps": True}
        },
    }
    config = {"loss_rtol": 1e-5, "device": "cpu", "dtype": "float32", "batch_size": 8, **MODEL_PRESETS["tiny"]}
    return {"config": config, "datasets": {"flan": flan}}


def test_targets_are_computed_from_the_measurements():
    targets = evaluate_targets(_report(4.5, 3.2, 2e-6, 800.0))
    by_name = {t["target"]: t for t in targets}
    assert by_name["flan: packed-padfree >= 4x padded-sdpa real tokens/s"]["holds"] is True
    assert by_name["flan: packed-padfree >= 3x packed-sdpa real tokens/s"]["shown"] == "3.20x"
    assert by_name["orcamath: packed-padfree >= 1.8x padded-sdpa real tokens/s"]["holds"] is None
    assert by_name["flan: packed-padfree peak memory below padded-sdpa"]["holds"] is True
    failing = {t["target"]: t["holds"] for t in evaluate_targets(_report(3.9, 2.9, 2e-5, 1000.0))}
    assert failing == {
        "flan: packed-padfree >= 4x padded-sdpa real tokens/s": False,
        "flan: packed-padfree >= 3x packed-sdpa real tokens/s": False,
        "orcamath: packed-padfree >= 1.8x padded-sdpa real tokens/s": None,
        "flan: packed-padfree train/eval losses equal padded-sdpa (rel. tol. 1e-05)": False,
        "flan: packed-padfree peak memory below padded-sdpa": False,
    }


def test_throughput_targets_get_no_verdict_outside_their_setup():
    report = _report(2.65, 2.59, 2e-6, 800.0)
    report["config"].update(device="cuda", dtype="bfloat16", **MODEL_PRESETS["0.5b"])
    by_name = {t["target"]: t for t in evaluate_targets(report)}
    speed = by_name["flan: packed-padfree >= 4x padded-sdpa real tokens/s"]
    assert speed["holds"] is None and speed["value"] == pytest.approx(2.65)
    assert speed["shown"].startswith("2.65x (set for the CPU, float32, tiny Llama")
    assert by_name["flan: packed-padfree peak memory below padded-sdpa"]["holds"] is True  # still checked


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--datasets", "flan,c4"], "unknown dataset 'c4' in --datasets; choose from flan, orcamath"),
        (["--variants", "packed-flex"], "unknown variant 'packed-flex' in --variants"),
        (["--hidden", "100"], "--hidden (100) must be divisible by --heads (8)"),
        (["--min-length", "5"], "need 7 <= --min-length <= --max-length"),
        (["--steps", "0"], "--steps must be >= 1, got 0"),
        (["--device", "tpu"], "--device must be 'cpu', 'cuda' or 'cuda:N', got 'tpu'"),
    ],
)
def test_bad_options_say_what_is_wrong(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_dispatches_bench(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "usage: trl-padfree bench" in out and "--model-size {tiny,0.5b}" in out


def test_bfloat16_runs_the_same_device_agnostic_path(tmp_path):
    """The GPU mode's dtype path (bf16 weights and AdamW), exercised on CPU with a tiny model."""
    config = BenchConfig(
        datasets=["flan"], variants=["padded-sdpa", "packed-padfree"], layers=1, hidden=32, heads=4, kv_heads=2,
        intermediate=64, vocab_size=128, batch_size=4, steps=2, warmup=1, eval_batches=1, length_scale=0.1,
        max_length=160, dtype="bfloat16", subprocess=False,
    )  # fmt: skip
    report = run_benchmark(config, log=lambda _: None)
    assert report["config"]["loss_rtol"] == 1e-2
    entry = report["datasets"]["flan"]
    padded, packed = entry["variants"]["padded-sdpa"], entry["variants"]["packed-padfree"]
    assert padded["optimizer_steps"] == packed["optimizer_steps"] == 3
    np.testing.assert_allclose(packed["train_loss"], padded["train_loss"], rtol=1e-2)
    assert entry["comparison"]["packed-padfree"]["train_loss_max_rel_diff"] < 1e-2


def test_model_size_preset_and_overrides():
    from trl_padfree.bench import build_parser, config_from_args

    big = config_from_args(build_parser().parse_args(["--model-size", "0.5b", "--device", "cuda", "--dtype", "bfloat16"]))
    assert (big.layers, big.hidden, big.heads, big.kv_heads, big.vocab_size) == (24, 1280, 10, 2, 32000)
    assert 0.45e9 < big.parameter_count() < 0.55e9
    small = config_from_args(build_parser().parse_args(["--model-size", "0.5b", "--layers", "2"]))
    assert (small.layers, small.hidden) == (2, 1280)
    default = config_from_args(build_parser().parse_args([]))
    assert (default.layers, default.hidden, default.heads, default.kv_heads, default.batch_size) == (4, 256, 8, 4, 8)
    assert (default.dtype, default.device, default.subprocess) == ("float32", "cpu", True)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message shown without CUDA")
def test_cuda_without_a_gpu_is_a_clear_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--device", "cuda", "--dtype", "bfloat16", "--model-size", "0.5b"])
    assert exc.value.code == 2
    assert "--device cuda but torch.cuda.is_available() is False; use --device cpu" in capsys.readouterr().err


def test_replot_rewrites_markdown_and_png_from_the_json(smoke, tmp_path):
    out, _ = smoke
    copy = tmp_path / "again.json"
    copy.write_text((out / "cpu.json").read_text())
    assert main(["--replot", str(copy)]) == 0
    assert (tmp_path / "again.md").read_text() == (out / "cpu.md").read_text()
    assert (tmp_path / "again.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(SystemExit):
        main(["--replot", str(tmp_path / "missing.json")])
