"""Tests for benchmarks (`trl-padfree bench`): a tiny smoke run of the real benchmark, its outputs, its
target checks and its error messages. No timing assertions: only structure and exact (seeded) training results.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks import (
    DATASETS,
    MODEL_PRESETS,
    TEMPLATE_IDS,
    BenchConfig,
    compare,
    evaluate_targets,
    main,
    make_examples,
    run_benchmark,
    to_markdown,
)
from benchmarks.data import dataset_title, fixed_batches
from benchmarks.flops import Workload, forward_flops
from trl_padfree import cli
from trl_padfree.scored_head import scored_head_unavailable

SCORED = scored_head_unavailable() is None  # trl >= 1.16: sft-padfree's head projects only the trained positions
TINY = [
    "--layers", "1", "--hidden", "32", "--heads", "4", "--kv-heads", "2", "--intermediate", "64",
    "--vocab-size", "128", "--batch-size", "4", "--steps", "2", "--warmup", "1", "--eval-batches", "1",
    "--length-scale", "0.1", "--max-length", "160",
]  # fmt: skip
VARIANTS = ["padded-sdpa", "packed-sdpa", "packed-padfree"]
TRAINER_VARIANTS = ["trl-native", "sft-padfree"]
ALL_RUN = [*VARIANTS, *TRAINER_VARIANTS, "token-budget"]
RESULT_FIELDS = {
    "dataset", "variant", "runner", "attn_implementation", "padding_free", "batching", "max_tokens",
    "optimizer_steps", "timed_steps", "warmup_steps", "train_loss", "eval_loss", "eval_target_tokens",
    "step_seconds", "cpu_seconds", "compute_seconds", "overhead_seconds", "median_step_seconds",
    "median_overhead_seconds", "real_tokens", "input_tokens", "target_tokens", "batch_fingerprints", "workloads",
    "timed_seconds", "tokens_per_second", "tokens_per_cpu_second", "tokens_per_cpu_second_runs",
    "memory_kind", "peak_memory_mb", "memory_above_start_mb", "tokens_per_second_runs",
}  # fmt: skip
TRAINER_FIELDS = RESULT_FIELDS | {
    "attn_requested", "sft_config_padding_free", "collator", "probe", "trainer_warnings", "lm_head",
}  # fmt: skip


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One in-process run: both datasets, every variant (fa2 is skipped on CPU)."""
    out = tmp_path_factory.mktemp("bench")
    argv = [*TINY, "--in-process", "--variants", ",".join([*VARIANTS, "packed-fa2", *TRAINER_VARIANTS, "token-budget"]),
            "--output-dir", str(out)]
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
    for dataset, entry in report["datasets"].items():
        assert dataset_title(dataset, entry, 0.1) in markdown
    assert markdown.count("| packed-padfree | ") == 2 and markdown.count("| trl-native | ") == 2
    assert "skipped: flash_attention_2 needs a CUDA device (got --device cpu)" in markdown
    assert "## Targets" in markdown


def test_every_variant_has_every_field_and_counts_its_steps(smoke):
    _, report = smoke
    assert list(report["datasets"]) == ["flan", "orcamath"]
    for entry in report["datasets"].values():
        assert list(entry["variants"]) == [*VARIANTS, "packed-fa2", *TRAINER_VARIANTS, "token-budget"]
        assert entry["variants"]["packed-fa2"]["skipped"].startswith("flash_attention_2 needs a CUDA device")
        for name in [*VARIANTS, *TRAINER_VARIANTS]:
            res = entry["variants"][name]
            fields = TRAINER_FIELDS if name in TRAINER_VARIANTS else RESULT_FIELDS
            assert set(res) == fields, set(res) ^ fields
            assert res["optimizer_steps"] == 3 and res["timed_steps"] == 2 and res["warmup_steps"] == 1
            assert len(res["train_loss"]) == len(res["step_seconds"]) == len(res["real_tokens"]) == 3
            assert len(res["compute_seconds"]) == len(res["batch_fingerprints"]) == 3
            assert all(0 < c <= s for c, s in zip(res["compute_seconds"], res["step_seconds"], strict=True))
            assert res["tokens_per_second"] == pytest.approx(sum(res["real_tokens"][1:]) / sum(res["step_seconds"][1:]))
            assert res["peak_memory_mb"] > 50
            assert all(math.isfinite(v) for v in res["train_loss"])
        padded, packed = entry["variants"]["padded-sdpa"], entry["variants"]["packed-padfree"]
        # Same examples in the same batches: same real tokens and loss targets, padding only in the padded layout.
        assert padded["real_tokens"] == packed["real_tokens"] == packed["input_tokens"]
        assert padded["target_tokens"] == packed["target_tokens"]
        assert all(p > r for p, r in zip(padded["input_tokens"], padded["real_tokens"], strict=True))
        assert set(entry["comparison"]) == set(ALL_RUN)
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
    assert len(losses) == 6 and all(t["holds"] is True for t in losses)  # packed-sdpa, packed-padfree, sft-padfree
    assert not any("trl-native" in t["target"] or "token-budget" in t["target"] for t in losses)
    throughput = [t for t in report["targets"] if "real tokens/s" in t["target"]]
    assert [isinstance(t["value"], float) for t in throughput] == [True, True, True]
    assert [t["holds"] for t in throughput] == [None, None, None]  # measured; no verdict for this smaller model
    memory = [t for t in report["targets"] if "peak memory" in t["target"]]
    assert [t["holds"] for t in memory] == [None, None]  # in-process at --length-scale 0.1: not judged
    assert all("judged only on CUDA, or CPU with each variant in its own worker" in t["shown"] for t in memory)


def test_interleaved_worker_processes_reproduce_the_in_process_run(smoke):
    """The default path: each variant in a fresh worker, trained in lockstep; same seed, same losses. trl-native
    runs its SFTTrainer in the worker; token-budget has another step count than the others."""
    _, report = smoke
    config = BenchConfig(
        datasets=["orcamath"], variants=["padded-sdpa", "trl-native", "token-budget"], layers=1, hidden=32, heads=4,
        kv_heads=2, intermediate=64, vocab_size=128, batch_size=4, steps=2, warmup=1, eval_batches=1,
        length_scale=0.1, max_length=160,
    )  # fmt: skip
    assert (config.subprocess, config.schedule) == (True, "interleaved")
    logged: list[str] = []
    sub = run_benchmark(config, log=logged.append)
    assert "interleaved]" in logged[-3]
    assert logged[-2].startswith("  trl-native      ") and logged[-1].startswith("  token-budget    ")
    assert all("x padded real tok/s, FLOP ratio " in line for line in logged[-2:])
    entry = sub["datasets"]["orcamath"]
    for name in config.variants:
        res = entry["variants"][name]
        assert res["memory_kind"] == "peak RSS of a fresh worker process"
        assert res["peak_memory_mb"] > 100  # python + torch + transformers, at least
        expected = report["datasets"]["orcamath"]["variants"][name]
        np.testing.assert_allclose(res["train_loss"], expected["train_loss"], rtol=1e-6, atol=0)
        assert res["real_tokens"] == expected["real_tokens"]
        assert res["batch_fingerprints"] == expected["batch_fingerprints"]
        assert res["workloads"] == expected["workloads"]
    assert entry["variants"]["token-budget"]["optimizer_steps"] > entry["variants"]["padded-sdpa"]["optimizer_steps"]
    assert entry["comparison"]["trl-native"]["median_step_speedup"] > 0


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


# One timed step of 1,000 real tokens (8 examples of 125) in each layout, as sft_workload counts it.
WORK = {
    "padded-sdpa": Workload(slots=8 * 400, head_slots=8 * 400, attention_qk=8 * 400**2),  # one long example
    "packed-sdpa": Workload(slots=1000, head_slots=1000, attention_qk=1000**2),  # a dense block mask
    "packed-padfree": Workload(slots=1000, head_slots=1000, attention_qk=8 * 125**2),  # varlen
}
TINY_MODEL = {k: MODEL_PRESETS["tiny"][k] for k in ("layers", "hidden", "intermediate", "heads", "kv_heads",
                                                     "vocab_size")}
FLOPS = {name: forward_flops(TINY_MODEL, work)["total"] for name, work in WORK.items()}
FLAN_FLOP_RATIO = FLOPS["padded-sdpa"] / FLOPS["packed-padfree"]  # ~3.7x
SDPA_FLOP_RATIO = FLOPS["packed-sdpa"] / FLOPS["packed-padfree"]  # ~1.8x


def _report(share_flan: float, share_vs_sdpa: float, loss_diff: float, padfree_mb: float,
            workloads: bool = True) -> dict:
    """A FLAN-only report whose packed-padfree reached ``share_*`` of its FLOP ratios over padded / packed sdpa."""
    def res(name: str, tps: float, mb: float) -> dict:
        counts = {"workloads": [vars(WORK[name])]} if workloads else {}
        return {"tokens_per_second": tps, "peak_memory_mb": mb, "warmup_steps": 0, "real_tokens": [1000], **counts}

    padfree = 100.0 * share_flan * FLAN_FLOP_RATIO
    flan = {
        "variants": {
            "padded-sdpa": res("padded-sdpa", 100.0, 1000.0),
            "packed-sdpa": res("packed-sdpa", padfree / (share_vs_sdpa * SDPA_FLOP_RATIO), 900.0),
            "packed-padfree": res("packed-padfree", padfree, padfree_mb),
        },
        "comparison": {
            "packed-padfree": {"train_loss_max_rel_diff": loss_diff, "eval_loss_rel_diff": 0.0, "same_steps": True}
        },
    }
    config = {"loss_rtol": 1e-5, "device": "cpu", "dtype": "float32", "batch_size": 8, "length_scale": 1.0,
              "steps": 10, "subprocess": True, **MODEL_PRESETS["tiny"]}
    return {"config": config, "datasets": {"flan": flan}}


SPEED = {
    "flan": "flan: packed-padfree real tokens/s over padded-sdpa >= 90% of the workload's FLOP ratio",
    "sdpa": "flan: packed-padfree real tokens/s over packed-sdpa >= 90% of the workload's FLOP ratio",
    "orcamath": "orcamath: packed-padfree real tokens/s over padded-sdpa >= 90% of the workload's FLOP ratio",
}


def test_throughput_targets_are_a_share_of_the_flop_ratio_of_the_batches_run():
    targets = evaluate_targets(_report(0.95, 1.2, 2e-6, 800.0))
    by_name = {t["target"]: t for t in targets}
    flan = by_name[SPEED["flan"]]
    assert 3.6 < FLAN_FLOP_RATIO < 3.8 and flan["flop_ratio"] == pytest.approx(FLAN_FLOP_RATIO)
    assert flan["holds"] is True and flan["value"] == pytest.approx(0.95)
    assert flan["throughput_ratio"] == pytest.approx(0.95 * FLAN_FLOP_RATIO)
    assert flan["shown"] == (f"{0.95 * FLAN_FLOP_RATIO:.2f}x measured vs FLOP ratio {FLAN_FLOP_RATIO:.2f}x: 95% of "
                             f"it (needs >= {0.9 * FLAN_FLOP_RATIO:.2f}x)")
    assert by_name[SPEED["sdpa"]]["holds"] is True and by_name[SPEED["sdpa"]]["value"] == pytest.approx(1.2)
    assert (by_name[SPEED["orcamath"]]["holds"], by_name[SPEED["orcamath"]]["shown"]) == (None, "not measured")
    assert by_name["flan: packed-padfree peak memory below padded-sdpa"]["holds"] is True
    # a regression: the same FLOP ratio, 85% of it reached (e.g. 3.1x where 3.3x is the least a correct run gives)
    failing = {t["target"]: t["holds"] for t in evaluate_targets(_report(0.85, 0.899, 2e-5, 1000.0))}
    assert failing == {
        SPEED["flan"]: False,
        SPEED["sdpa"]: False,
        SPEED["orcamath"]: None,
        "flan: packed-padfree train/eval losses equal padded-sdpa (rel. tol. 1e-05)": False,
        "flan: packed-padfree peak memory below padded-sdpa": False,
    }
    sdpa = next(t for t in evaluate_targets(_report(0.85, 0.899, 2e-5, 1000.0)) if t["target"] == SPEED["sdpa"])
    assert ": 89.90% of it" in sdpa["shown"]  # not "90%" next to a FAIL


def test_throughput_targets_get_no_verdict_outside_their_setup_or_without_flop_counts():
    report = _report(0.7, 0.7, 2e-6, 800.0)
    report["config"].update(device="cuda", dtype="bfloat16", **MODEL_PRESETS["0.5b"])
    by_name = {t["target"]: t for t in evaluate_targets(report)}
    speed = by_name[SPEED["flan"]]
    assert speed["holds"] is None and speed["value"] == pytest.approx(0.7, rel=0.2)  # other model: other FLOPs
    assert speed["shown"].endswith("(judged on the CPU, float32, tiny Llama (4 x 256, 8 / 4 heads, MLP 688, vocab "
                                   "2048), batch 8, the datasets' real lengths (--length-scale 1), >= 5 timed "
                                   "steps; not this run's setup)")
    assert by_name["flan: packed-padfree peak memory below padded-sdpa"]["holds"] is True  # still checked
    old = {t["target"]: t for t in evaluate_targets(_report(0.5, 0.5, 2e-6, 800.0, workloads=False))}
    assert old[SPEED["flan"]]["holds"] is None and old[SPEED["flan"]]["value"] is None
    assert old[SPEED["flan"]]["shown"] == (f"{0.5 * FLAN_FLOP_RATIO:.2f}x; no FLOP counts in this report (written "
                                           "before they were recorded)")


def test_each_step_records_what_its_batch_computed_and_the_flop_ratio_follows(smoke):
    """Workloads counted from the batches each variant really trained: token slots, and query-key pairs per
    padded row (width^2), per packed example under "padfree" (length^2), per packed row under sdpa (total^2)."""
    _, report = smoke
    c = report["config"]
    config = BenchConfig.from_dict({k: v for k, v in c.items() if k not in ("loss_rtol", "parameters")})
    for dataset, entry in report["datasets"].items():
        lengths = [[len(e) for e in b] for b in fixed_batches(config.examples(dataset), config.batch_size)]
        runs = entry["variants"]
        expected = {
            "padded-sdpa": [(len(n) * max(n), len(n) * max(n) ** 2) for n in lengths],
            "packed-sdpa": [(sum(n), sum(n) ** 2) for n in lengths],
            "packed-padfree": [(sum(n), sum(x * x for x in n)) for n in lengths],
            "trl-native": [(sum(n), sum(n) ** 2) for n in lengths],  # TRL's flat row under sdpa's block mask
            "sft-padfree": [(sum(n), sum(x * x for x in n)) for n in lengths],
        }
        for name, counts in expected.items():
            work = runs[name]["workloads"]
            assert [(w["slots"], w["attention_qk"]) for w in work] == counts, (dataset, name)
            if name == "sft-padfree" and SCORED:  # the scored-positions LM head projects only the trained positions
                assert [w["head_slots"] for w in work] == runs[name]["target_tokens"]
                assert all(w["head_slots"] < w["slots"] for w in work)
            else:
                assert all(w["head_slots"] == w["slots"] for w in work)
        assert [w["slots"] for w in runs["padded-sdpa"]["workloads"]] == runs["padded-sdpa"]["input_tokens"]
        cmp = entry["comparison"]
        timed = [Workload(*counts) for counts in [(s, s, a) for s, a in expected["padded-sdpa"][1:]]]
        padded = sum(forward_flops(config.__dict__, w)["total"] for w in timed)
        timed = [Workload(s, s, a) for s, a in expected["packed-padfree"][1:]]
        packed = sum(forward_flops(config.__dict__, w)["total"] for w in timed)
        assert cmp["packed-padfree"]["flop_ratio"] == pytest.approx(padded / packed)
        assert cmp["packed-padfree"]["flop_ratio"] > max(1.0, cmp["packed-sdpa"]["flop_ratio"])  # (sdpa's dense
        # block mask over a whole packed row can cost more than padding: the ratio may be below 1)
        if SCORED:  # fewer positions through the head
            assert cmp["sft-padfree"]["flop_ratio"] > cmp["packed-padfree"]["flop_ratio"]
        assert cmp["padded-sdpa"]["flop_ratio"] == 1.0
        share = cmp["packed-padfree"]["share_of_flop_ratio"]
        assert share == pytest.approx(cmp["packed-padfree"]["throughput_ratio"] / cmp["packed-padfree"]["flop_ratio"])
        assert cmp["token-budget"]["flop_ratio"] > 1.0  # per real token, over other batches


def test_the_flop_ratio_is_printed_next_to_each_throughput_ratio(smoke):
    out, report = smoke
    markdown = (out / "cpu.md").read_text()
    assert "| variant | real tokens/s | vs padded | FLOP ratio | share of it | median step speed-up |" in markdown
    cmp = report["datasets"]["flan"]["comparison"]["packed-padfree"]
    assert (f"| {cmp['throughput_ratio']:.2f}x | {cmp['flop_ratio']:.2f}x | {cmp['share_of_flop_ratio']:.0%} |"
            in markdown)
    assert "- sft-padfree vs trl-native: " in markdown and "x real tokens/s (FLOP ratio " in markdown
    assert "x the real tokens/s (FLOP ratio " in markdown  # token-budget vs fixed batches


@pytest.mark.parametrize("path", sorted((Path(__file__).parent.parent / "docs" / "bench").glob("*.json")),
                         ids=lambda p: p.name)
def test_shipped_reports_still_render(path, tmp_path):
    """Every shipped report re-judged and rendered; those written before FLOP counts were recorded get no verdict
    on throughput, those with counts get the one they were written with (none outside the judged setup, e.g. the
    real model's shape)."""
    report = json.loads(path.read_text())
    if "datasets" not in report:
        pytest.skip("not a bench report")
    if report.get("title") == "trl-padfree bench --task hybrid":
        from benchmarks.hybrid import evaluate_targets as hybrid_targets

        assert hybrid_targets(report) == report["targets"]  # re-judged alike; printed, no tables to render
        return
    written = report["targets"]
    report["targets"] = evaluate_targets(report)
    markdown = to_markdown(report)
    assert markdown.count("| packed-padfree | ") == len(report["datasets"])
    speed = [t for t in report["targets"] if "FLOP ratio" in t["target"]]
    counted = any("workloads" in r for e in report["datasets"].values() for r in e["variants"].values())
    assert speed and (counted or all(t["holds"] is None for t in speed))
    if counted:
        assert report["targets"] == written


def test_cli_dispatches_bench(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "usage: trl-padfree bench" in out and "--model-size {tiny,0.5b,smollm2-135m}" in out


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
    from benchmarks import build_parser, config_from_args

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


# --- trl-native and sft-padfree: the same batches through trl.SFTTrainer ---------------------------------------


def test_sft_trainer_variants_train_the_same_batches_and_losses_as_padded(smoke):
    """TRL's own padding-free path and this project's, through trl.SFTTrainer: same batches (fingerprinted as the
    model received them), same losses in fp32; what attention really ran and what the probe says are recorded."""
    _, report = smoke
    for entry in report["datasets"].values():
        padded = entry["variants"]["padded-sdpa"]
        for name, attn, collator, sft_padding_free, head in (
            ("trl-native", "sdpa", "trl.trainer.sft_trainer.DataCollatorForLanguageModeling", True,
             "trl: trl.SFTTrainer"),
            ("sft-padfree", "padfree", "trl_padfree.collator.DataCollatorForCompletionOnlyLM", False,
             "scored" if SCORED else f"trl: {scored_head_unavailable()}"),
        ):
            res, cmp = entry["variants"][name], entry["comparison"][name]
            assert res["runner"] == "sft-trainer" and res["attn_implementation"] == attn and res["lm_head"] == head
            assert (res["collator"], res["sft_config_padding_free"]) == (collator, sft_padding_free)
            assert res["batch_fingerprints"] == padded["batch_fingerprints"] and cmp["same_batches"] is True
            assert res["real_tokens"] == res["input_tokens"] == padded["real_tokens"]  # no padding at all
            assert res["target_tokens"] == padded["target_tokens"]
            np.testing.assert_allclose(res["train_loss"], padded["train_loss"], rtol=1e-5, atol=0)
            assert res["eval_loss"] == pytest.approx(padded["eval_loss"], rel=1e-5, abs=0)
            assert res["probe"]["status"] == "safe"
            assert res["median_overhead_seconds"] > 0  # the trainer's own per-step work is measured
    markdown = (smoke[0] / "cpu.md").read_text()
    assert "- trl-native: `SFTConfig(padding_free=True)`, collator `trl.trainer.sft_trainer.Data" in markdown
    assert "ran `sdpa`; packing probe with this collator: safe" in markdown


def test_different_batches_are_caught_not_assumed(smoke):
    """A variant whose batches differ from padded is flagged, and its loss-equality target fails."""
    _, report = smoke
    entry = json.loads(json.dumps(report["datasets"]["flan"]))
    entry["variants"]["sft-padfree"]["batch_fingerprints"][1] = "4x1:00000000"
    cmp = compare(entry["variants"])
    assert cmp["sft-padfree"]["same_batches"] is False and cmp["sft-padfree"]["train_loss_max_rel_diff"] is None
    assert cmp["trl-native"]["same_batches"] is True
    targets = evaluate_targets({"config": report["config"], "datasets": {"flan": {**entry, "comparison": cmp}}})
    bad = next(t for t in targets if t["target"].startswith("flan: sft-padfree train/eval losses"))
    assert bad["holds"] is False and bad["shown"] == "the mini-batches differ from the padded run's (a benchmark bug)"


def test_prepared_dataset_must_be_the_benchmark_examples():
    from benchmarks.sft_run import _check_prepared, completion_labels

    examples = [[1, 7, 3, 4, 5, 9, 2], [1, 8, 8, 3, 4, 5, 6, 2]]
    good = {"input_ids": examples, "labels": [completion_labels(e) for e in examples]}
    _check_prepared(good, examples, "train")
    with pytest.raises(RuntimeError, match="other token ids than the benchmark's examples"):
        _check_prepared({**good, "input_ids": [examples[0], examples[1][:-1]]}, examples, "train")
    with pytest.raises(RuntimeError, match="labels are not the completion-only labels"):
        _check_prepared({**good, "labels": [examples[0], good["labels"][1]]}, examples, "train")


def test_token_budget_covers_the_same_examples_within_its_budget(smoke):
    _, report = smoke
    for entry in report["datasets"].values():
        res, fixed = entry["variants"]["token-budget"], entry["variants"]["packed-padfree"]
        budget = entry["length_stats"]["token_budget"]
        assert res["max_tokens"] == budget == round(sum(fixed["real_tokens"]) / len(fixed["real_tokens"]))
        assert sum(res["real_tokens"]) == sum(fixed["real_tokens"])  # every example once, in one epoch
        assert max(res["real_tokens"]) <= budget and res["optimizer_steps"] == len(res["train_loss"]) >= 3
        assert res["real_tokens"] == res["input_tokens"]
        cmp = entry["comparison"]["token-budget"]
        assert cmp["same_batches"] is False and cmp["median_step_speedup"] is None
        assert cmp["train_loss_max_rel_diff"] is None and cmp["memory_ratio"] > 0
    assert "optimizer steps over the same examples vs 3 fixed" in (smoke[0] / "cpu.md").read_text()


# --- help, labels, few-step runs, exit codes (issue 10, item 9) -----------------------------------------------


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for shown in ("examples per optimizer step (default: 8)", "timed optimizer steps (default: 10)",
                  "(default: flan,orcamath)", "AdamW learning rate (constant) (default: 0.0005)",
                  "torch threads per worker (0: torch's default) (default: 0)", "(default: bench-results)"):
        assert shown in out, shown


def test_one_step_run_judges_only_what_applies_and_plots_a_readable_loss(tmp_path):
    """1 step at --length-scale 0.1: labels from the run's data, no throughput/memory verdict, a visible loss."""
    from benchmarks.plot import make_figure

    argv = [*TINY, "--steps", "1", "--warmup", "0", "--datasets", "flan", "--variants", "padded-sdpa,packed-padfree",
            "--in-process", "--output-dir", str(tmp_path)]
    assert main(argv) == 0
    report = json.loads((tmp_path / "cpu.json").read_text())
    assert [t["holds"] for t in report["targets"] if "losses" not in t["target"]] == [None] * 4
    entry = report["datasets"]["flan"]
    median = entry["length_stats"]["median"]
    assert median < 100
    title = f"FLAN-like: median {median:.0f}, mean {entry['length_stats']['mean']:.0f}, max"
    assert f"## {title}" in (tmp_path / "cpu.md").read_text() and "median 340" not in (tmp_path / "cpu.md").read_text()
    fig = make_figure(report)
    ax_tps, _, _, ax_loss = fig.axes[:4]
    assert ax_tps.get_title().startswith(title)
    assert ax_loss.get_xlim() == (0.5, 1.5) and list(ax_loss.get_xticks()) == [1.0]
    lines = [ln for ln in ax_loss.get_lines() if len(ln.get_xdata()) == 1]
    assert len(lines) == 2 and all(ln.get_marker() not in (None, "None", "") for ln in lines)


def test_a_failed_judged_target_makes_the_exit_code_1(smoke, tmp_path, capsys):
    _, report = smoke
    bad = json.loads(json.dumps(report))
    bad["datasets"]["flan"]["comparison"]["packed-padfree"]["train_loss_max_rel_diff"] = 1e-3
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    assert main(["--replot", str(path)]) == 1
    err = capsys.readouterr().err
    assert err == ("trl-padfree bench: target failed: flan: packed-padfree train/eval losses equal padded-sdpa "
                   "(rel. tol. 1e-05): max rel. diff 1.0e-03\n")
    assert "- FAIL: flan: packed-padfree train/eval losses" in (tmp_path / "bad.md").read_text()


# --- bad input: exit 2, one line, before any work (issue 12) ---------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--datasets", "flan,c4"], "unknown dataset 'c4' in --datasets; choose from flan, orcamath"),
        (["--variants", "packed-flex"], "unknown variant 'packed-flex' in --variants"),
        (["--hidden", "100"], "--hidden (100) must be divisible by --heads (8)"),
        (["--min-length", "5"], "need 7 <= --min-length <= --max-length"),
        (["--steps", "0"], "--steps must be >= 1, got 0"),
        (["--device", "tpu"], "--device must be 'cpu', 'cuda' or 'cuda:N', got 'tpu'"),
        (["--threads", "-1"], "--threads must be >= 0 (0: torch's default), got -1"),
        (["--lr", "-0.001"], "--lr must be a finite number > 0, got -0.001"),
        (["--lr", "nan"], "--lr must be a finite number > 0, got nan"),
        (["--max-tokens", "0"], "--max-tokens must be >= 1"),
        (["--steps", "x"], "argument --steps: invalid int value: 'x'"),
    ],
)
def test_bad_values_exit_2_with_one_line(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--output-dir", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert exc.value.code == 2 and captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("trl-padfree bench: error: ")
    assert message in captured.err
    assert not (tmp_path / "out").exists()


def test_output_dir_that_is_a_file_is_refused_before_any_work(tmp_path, capsys):
    blocker = tmp_path / "results"
    blocker.write_text("not a directory")
    for output_dir, reason in ((blocker, "it is a file, not a directory"),
                               (blocker / "sub", f"{blocker} is a file, not a directory")):
        with pytest.raises(SystemExit) as exc:
            main([*TINY, "--in-process", "--output-dir", str(output_dir)])
        captured = capsys.readouterr()
        assert exc.value.code == 2 and captured.out == ""  # the run's banner was never printed
        assert captured.err == (f"trl-padfree bench: error: --output-dir {output_dir}: {reason}; pass a directory "
                                "that can be written\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"{not json", "not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
        (b"\xff\xfe", "not JSON ('utf-8' codec can't decode byte 0xff in position 0: invalid start byte)"),
        (b'{"config": {}}', "not a trl-padfree bench report (no 'machine', 'datasets')"),
        (b"[1, 2]", "not a trl-padfree bench report (no 'config', 'machine', 'datasets')"),
        (None, "no such file"),
    ],
)
def test_replot_of_a_bad_file_exits_2_with_one_line(content, reason, tmp_path, capsys):
    path = tmp_path / "report.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SystemExit) as exc:
        main(["--replot", str(path)])
    captured = capsys.readouterr()
    assert exc.value.code == 2
    assert captured.err == (f"trl-padfree bench: error: --replot {path}: {reason}; pass a JSON report written by "
                            "trl-padfree bench\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if content is None else ["report.json"])


def test_commands_on_the_benchmark_page_are_valid_bench_commands():
    """Every `trl-padfree bench` / `python scripts/bench.py` command shown in docs/benchmark.md parses and
    validates (they are not run here: the page's runs take minutes)."""
    import re
    import shlex

    from benchmarks import build_parser, config_from_args
    from benchmarks.cli import TASKS, task_of

    page = (Path(__file__).resolve().parent.parent / "docs" / "benchmark.md").read_text()
    blocks = re.findall(r"```(?:bash|console|sh)?\n(.*?)```", page, flags=re.S)
    commands = [ln.split("#")[0].strip() for block in blocks for ln in block.splitlines()]
    commands = [c for c in commands if c.startswith(("trl-padfree bench", "python scripts/bench.py"))]
    commands = [c.removeprefix("OMP_NUM_THREADS=1 ") for c in commands + [
        ln.split("#")[0].strip() for block in blocks for ln in block.splitlines()
        if ln.startswith("OMP_NUM_THREADS=1 trl-padfree bench")]]
    assert len(commands) >= 3
    others = set()
    for command in commands:
        argv = shlex.split(command)[2:]
        if task_of(argv) != "sft":  # another task: its own module's parser
            others.add(task_of(argv))
            build_parser(task_of(argv)).parse_args(argv)
            continue
        args = build_parser().parse_args(argv)
        if args.replot is None:
            config_from_args(args).validate()
    assert others == set(TASKS) - {"sft"}  # the page shows every other task once at least


def test_trainer_note_judges_losses_with_the_runs_tolerance():
    """A bf16 run (loss_rtol 1e-2) whose SFTTrainer losses differ by bf16 noise still reads 'kept apart'."""
    from benchmarks.sft_report import _trainer_notes

    entry = {
        "variants": {"sft-padfree": {"attn_implementation": "padfree", "probe": {"status": "SAFE", "max_abs_diff": 0.0}}},
        "comparison": {"sft-padfree": {"train_loss_max_rel_diff": 3e-3, "eval_loss_rel_diff": 1e-3, "same_batches": True}},
    }
    assert "(keeps examples apart)" in _trainer_notes(entry, 1e-2)[0]
    assert "(differs: examples are NOT kept apart)" in _trainer_notes(entry, 1e-5)[0]


def test_the_trl_head_variant_runs_only_when_named():
    """``sft-padfree-trl-head`` (sft-padfree with TRL's fused head, for scripts/bench_scored_head.py) is opt-in."""
    from benchmarks.config import OPT_IN, VARIANTS

    assert OPT_IN == ("sft-padfree-trl-head",) and VARIANTS["sft-padfree-trl-head"].lm_head == "trl"
    assert "sft-padfree-trl-head" not in BenchConfig().variants and "sft-padfree" in BenchConfig().variants
    BenchConfig(variants=["sft-padfree-trl-head"]).validate()


@pytest.mark.parametrize(("argv", "prog", "message"), [
    (["--task", "kto", "--bogus"], "trl-padfree bench --task kto", "unrecognized arguments: --bogus"),
    (["--task", "grpo", "--steps", "x"], "trl-padfree bench --task grpo", "argument --steps: invalid int value: 'x'"),
    (["--task", "reward", "--rounds", "x"], "trl-padfree bench --task reward", "argument --rounds: invalid int"),
    (["--task", "nope"], "trl-padfree bench", "argument --task: invalid choice: 'nope'"),
    (["--task", "kto", "--output-dir", __file__], "trl-padfree bench --task kto",
     "it is a file, not a directory; pass a directory that can be written"),
    (["--task", "rloo", "--output-dir", __file__], "trl-padfree bench --task rloo",
     "it is a file, not a directory; pass a directory that can be written"),
    (["--task", "hybrid", "--variants", "packed-padfree"], "trl-padfree bench --task hybrid",
     "--variants must include the baseline padded-sdpa"),
    (["--task", "hybrid", "--variants", "padded-sdpa,trl-native"], "trl-padfree bench --task hybrid",
     "unknown hybrid variant 'trl-native' in --variants; choose from padded-sdpa, packed-sdpa, packed-padfree"),
    (["--task", "hybrid", "--repeats", "3"], "trl-padfree bench --task hybrid",
     "--repeats: not an option of --task hybrid"),
])
def test_one_command_runs_every_task_and_bad_options_exit_2_with_one_line(argv, prog, message, capsys):
    """``trl-padfree bench --task T`` parses the command line with T's options (benchmarks.cli.TASKS)."""
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", *argv])
    captured = capsys.readouterr()
    assert exc.value.code == 2 and captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith(f"{prog}: error: ") and message in captured.err


def test_every_task_has_a_module_with_a_parser_and_its_flop_share_target():
    from benchmarks.cli import TASKS, build_parser
    from benchmarks.targets import TARGETS

    assert set(TASKS) == set(TARGETS) == {"sft", "dpo", "grpo", "rloo", "reward", "kto", "hybrid"}
    for task in TASKS:
        parser = build_parser(task)
        assert parser.parse_args(["--task", task]).task == task
        assert 0 < TARGETS[task]["flop_share"] <= 1


def test_only_the_command_line_imports_the_benchmark_and_nothing_imports_it_at_import_time():
    """benchmarks/ is not in the wheel: inside trl_padfree only ``cli.bench_main`` imports it, in the function."""
    import ast

    root = Path(__file__).resolve().parent.parent
    found = []
    for path in sorted((root / "trl_padfree").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.relative_to(root)}:{node.lineno}" for n in names if n.split(".")[0] == "benchmarks"]
    assert len(found) == 1 and found[0].startswith("trl_padfree/cli.py:"), found
    tree = ast.parse((root / "trl_padfree" / "cli.py").read_text(encoding="utf-8"))
    bench_main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "bench_main")
    assert any(isinstance(n, ast.ImportFrom) and n.module == "benchmarks.cli" for n in ast.walk(bench_main))


HYBRID_TINY = [
    "--task", "hybrid", "--layers", "4", "--hidden", "32", "--heads", "4", "--kv-heads", "2", "--intermediate", "64",
    "--vocab-size", "128", "--batch-size", "4", "--steps", "2", "--warmup", "1", "--eval-batches", "1",
    "--length-scale", "0.1", "--max-length", "160", "--in-process",
]  # fmt: skip


def test_hybrid_task_reports_padfree_vs_padded_with_its_flop_ratio_and_equal_losses(tmp_path, capsys):
    """``--task hybrid``: a qwen3_5_text model (3 gated-delta-rule layers, 1 full attention) trained padded and
    packed ("padfree") on the same batches: the printed table and the report carry tokens/s, the ratio over padded,
    the FLOP ratio (recurrent layers counted per chunked token) and its share, and equal losses."""
    from transformers import CONFIG_MAPPING

    if "qwen3_5_text" not in CONFIG_MAPPING:
        pytest.skip("this transformers has no qwen3_5_text")
    from benchmarks.flops import chunked_slots, flop_ratio

    assert main([*HYBRID_TINY, "--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "(L L L A: L gated delta rule, A full attention)" in out and "FLOP ratio" in out
    report = json.loads((tmp_path / "hybrid-cpu.json").read_text())
    assert report["config"]["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert report["config"]["linear_layers"] == 3 and report["config"]["chunk_size"] == 64
    entry = report["datasets"]["flan"]
    padded, packed = entry["variants"]["padded-sdpa"], entry["variants"]["packed-padfree"]
    assert packed["batch_fingerprints"] == padded["batch_fingerprints"]
    for res in (padded, packed):  # each step's delta-rule slots: padded rows at their width, packed examples alone
        for work, tokens in zip(res["workloads"], res["input_tokens"], strict=True):
            assert work["slots"] == tokens and work["chunk_slots"] % 64 == 0 and work["chunk_slots"] >= 64
    rows = 4
    assert padded["workloads"][0]["chunk_slots"] == rows * chunked_slots([padded["workloads"][0]["slots"] // rows], 64)
    assert packed["workloads"][0]["chunk_slots"] < padded["workloads"][0]["chunk_slots"]
    cmp = entry["comparison"]["packed-padfree"]
    assert cmp["throughput_ratio"] == pytest.approx(packed["tokens_per_second"] / padded["tokens_per_second"])
    assert cmp["flop_ratio"] == pytest.approx(flop_ratio(report["config"], packed, padded)) and cmp["flop_ratio"] > 1
    assert cmp["share_of_flop_ratio"] == pytest.approx(cmp["throughput_ratio"] / cmp["flop_ratio"])
    assert cmp["train_loss_max_rel_diff"] < 1e-5
    assert f"{cmp['flop_ratio']:.2f}x" in out
    speed, loss = report["targets"]
    assert speed["holds"] is None and "not this run's setup" in speed["shown"]  # tiny: reported, not judged
    assert loss["holds"] is True and "train losses equal" in loss["target"]


def test_hybrid_flop_model_counts_recurrent_layers_linear_in_length():
    """A gated-delta-rule layer costs its (chunk-rounded) tokens, a full-attention layer its query-key pairs: so
    the hybrid's packed/padded FLOP ratio lies between a pure-attention model's and the token-slot ratio."""
    from benchmarks.flops import Workload, chunked_slots, forward_flops
    from benchmarks.hybrid import HybridConfig

    config = HybridConfig()
    shape = {**config.model, **config.shape(), **{k: getattr(config, k) for k in (
        "linear_key_heads", "linear_value_heads", "linear_key_head_dim", "linear_value_head_dim", "conv_kernel")}}
    lengths, width = [100, 300, 700, 900], 900
    padded = Workload(4 * width, 4 * width, 4 * width * width, 4 * chunked_slots([width], 64))
    packed = Workload(sum(lengths), sum(lengths), sum(n * n for n in lengths), chunked_slots(lengths, 64))
    hybrid = forward_flops(shape, padded)["total"] / forward_flops(shape, packed)["total"]
    llama = forward_flops(config.model, padded)["total"] / forward_flops(config.model, packed)["total"]
    assert 4 * width / sum(lengths) < hybrid < llama
    assert forward_flops(shape, packed)["attention"] > forward_flops(
        shape, Workload(packed.slots, packed.head_slots, packed.attention_qk, 0))["attention"]
