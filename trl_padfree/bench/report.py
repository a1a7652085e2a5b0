"""The report: comparisons with the padded baseline, the issue's targets, the paper's numbers, the Markdown
table and the written JSON/Markdown/PNG files.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .config import BASELINE, _fmt_params
from .plot import plot


def _max_rel_diff(values: Sequence[float], reference: Sequence[float]) -> float:
    if len(values) != len(reference):
        return math.inf
    return max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(values, reference, strict=True)), default=0.0)


def compare(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per variant of one dataset: ratios vs the padded baseline and loss differences (None without baseline)."""
    base = results.get(BASELINE)
    out: dict[str, dict[str, Any]] = {}
    warmup = base["warmup_steps"] if base is not None and "skipped" not in base else 0
    for name, res in results.items():
        if "skipped" in res or base is None:
            continue
        out[name] = {
            "throughput_ratio": res["tokens_per_second"] / base["tokens_per_second"],
            # Per timed step, baseline seconds / variant seconds (same examples in both): robust to load spikes.
            "median_step_speedup": statistics.median(
                b / v for b, v in zip(base["step_seconds"][warmup:], res["step_seconds"][warmup:], strict=True)
            ),
            "cpu_throughput_ratio": None
            if res["tokens_per_cpu_second"] is None
            else res["tokens_per_cpu_second"] / base["tokens_per_cpu_second"],
            "memory_ratio": res["peak_memory_mb"] / base["peak_memory_mb"],
            "train_loss_max_rel_diff": _max_rel_diff(res["train_loss"], base["train_loss"]),
            "eval_loss_rel_diff": abs(res["eval_loss"] - base["eval_loss"]) / abs(base["eval_loss"]),
            "same_steps": res["optimizer_steps"] == base["optimizer_steps"],
        }
    return out


SPEED_TARGET_SETUP = "CPU, float32, tiny Llama (4 x 256, 8 / 4 heads, MLP 688, vocab 2048), batch 8"


def _is_speed_target_setup(config: dict[str, Any]) -> bool:
    """Whether a run is the setup the throughput targets were set for (other setups report ratios, no verdict).

    >>> _is_speed_target_setup({"device": "cpu", "dtype": "float32", "batch_size": 8, "layers": 4, "hidden": 256,
    ...                         "heads": 8, "kv_heads": 4, "intermediate": 688, "vocab_size": 2048})
    True
    >>> _is_speed_target_setup({"device": "cuda", "dtype": "bfloat16", "batch_size": 8})
    False
    """
    expected = dict(device="cpu", dtype="float32", batch_size=8, layers=4, hidden=256, heads=8, kv_heads=4,
                    intermediate=688, vocab_size=2048)
    return all(config.get(key) == value for key, value in expected.items())


def evaluate_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, checked against the measured numbers (``holds`` is None when not measured).

    Set for the 2-core CPU, fp32, tiny Llama (4 x 256, 8 / 4 heads), batch 8 defaults: "padfree" >= 4x padded
    sdpa and >= 3x packed sdpa in real tokens/s on FLAN-like data, >= 1.8x padded on OrcaMath-like data; loss
    curves of the padding-free variants equal to padded (relative tolerance ``loss_rtol``); "padfree" peak memory
    below padded. The throughput targets get a verdict only for that setup; other runs (a GPU, another model)
    report the ratios with ``holds`` None.

    >>> evaluate_targets({"config": {"loss_rtol": 1e-5}, "datasets": {}})[0]["holds"] is None
    True
    """
    rtol = report["config"]["loss_rtol"]
    datasets = report["datasets"]
    speed_setup = _is_speed_target_setup(report["config"])
    targets: list[dict[str, Any]] = []

    def tps(dataset: str, variant: str) -> float | None:
        res = datasets.get(dataset, {}).get("variants", {}).get(variant)
        return None if res is None or "skipped" in res else res["tokens_per_second"]

    def ratio_target(dataset: str, variant: str, baseline: str, threshold: float) -> None:
        a, b = tps(dataset, variant), tps(dataset, baseline)
        value = None if a is None or b is None else a / b
        shown = "not measured" if value is None else f"{value:.2f}x"
        if value is not None and not speed_setup:
            shown += f" (set for the {SPEED_TARGET_SETUP}; not this run's setup)"
        targets.append({
            "target": f"{dataset}: {variant} >= {threshold:g}x {baseline} real tokens/s",
            "value": value,
            "shown": shown,
            "holds": None if value is None or not speed_setup else value >= threshold,
        })

    ratio_target("flan", "packed-padfree", BASELINE, 4.0)
    ratio_target("flan", "packed-padfree", "packed-sdpa", 3.0)
    ratio_target("orcamath", "packed-padfree", BASELINE, 1.8)
    for dataset, entry in datasets.items():
        for variant, cmp in entry.get("comparison", {}).items():
            if variant == BASELINE:
                continue
            worst = max(cmp["train_loss_max_rel_diff"], cmp["eval_loss_rel_diff"])
            targets.append({
                "target": f"{dataset}: {variant} train/eval losses equal {BASELINE} (rel. tol. {rtol:g})",
                "value": worst,
                "shown": f"max rel. diff {worst:.1e}" + ("" if cmp["same_steps"] else ", different step counts"),
                "holds": worst <= rtol and cmp["same_steps"],
            })
    for dataset, entry in datasets.items():
        variants = entry.get("variants", {})
        a, b = variants.get("packed-padfree"), variants.get(BASELINE)
        measured = a is not None and b is not None and "skipped" not in a and "skipped" not in b
        targets.append({
            "target": f"{dataset}: packed-padfree peak memory below {BASELINE}",
            "value": a["peak_memory_mb"] / b["peak_memory_mb"] if measured else None,
            "shown": f"{a['peak_memory_mb']:.0f} vs {b['peak_memory_mb']:.0f} MB" if measured else "not measured",
            "holds": a["peak_memory_mb"] < b["peak_memory_mb"] if measured else None,
        })
    return targets


PAPER = {
    "source": "arXiv 2407.09105, Table 2: 8x A100-80GB, FSDP, padded -> padding-free (flash attention)",
    "flan": {
        "Mistral-7B": {"tokens_per_s_per_gpu": [742, 1408], "peak_mb": [30625, 24549], "val_loss": [1.129, 1.127]},
        "Llama-2-7B": {"tokens_per_s_per_gpu": [771, 1455], "peak_mb": [29234, 23854], "val_loss": [1.266, 1.262]},
        "Granite-8B-code": {
            "tokens_per_s_per_gpu": [693, 1358], "peak_mb": [36277, 27538], "val_loss": [1.169, 1.169]},
        "summary": "~2x throughput, ~-20% peak memory",
    },
    "orcamath": {
        "Llama-2-7B": {"tokens_per_s_per_gpu": [1269, 1746]},
        "Mistral-7B": {"tokens_per_s_per_gpu": [1216, 1658]},
        "summary": "~1.4x throughput, ~-6% peak memory",
    },
}


def _fmt_ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def _fmt_number(value: float | None) -> str:
    return "" if value is None else f"{value:,.0f}"


def _check(holds: bool | None) -> str:
    return {True: "PASS", False: "FAIL", None: "n/a"}[holds]


def to_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: setup, one table per dataset (ratios vs padded), the targets."""
    c, m = report["config"], report["machine"]
    device = m["gpu"] or m["cpu"]
    lines = [
        "# Padded vs padding-free training: trl-padfree benchmark",
        "",
        f"- Machine: {device} ({m['cpu_count']} CPUs, {m['torch_threads']} torch threads); "
        f"torch {m['torch']}, transformers {m['transformers']}, trl-padfree {m['trl_padfree']}"
        + (f" (git {m['git']})" if m.get("git") else "")
        + (f", flash-attn {m['flash_attn']}" if m.get("flash_attn") else "") + f"; {m['platform']}"
        + (f"; load average (1/5/15 min) {m['load_average_start']} at start, {m.get('load_average_end')} at end"
           if m.get("load_average_start") else ""),
        f"- Model: random-init Llama, {c['layers']} layers x {c['hidden']} hidden, {c['heads']} heads / "
        f"{c['kv_heads']} kv heads, MLP {c['intermediate']}, vocab {c['vocab_size']} "
        f"({_fmt_params(c['parameters'])} parameters), {c['dtype']} on {c['device']}",
        f"- Training: AdamW lr {c['lr']:g}, batch {c['batch_size']}, {c['warmup']} warm-up + {c['steps']} timed "
        f"steps, eval on {c['eval_batches']} batches, seed {c['seed']}; loss = model(**batch).loss over "
        "completion tokens (the collator's completion-only labels, identical in both layouts)",
        "- Real tokens/s counts non-padding tokens over the timed steps (collation + forward + backward + "
        "optimizer step), per second of wall-clock time and, on CPU, per second of this process's CPU time (less "
        "sensitive to other load on a shared machine)"
        + (f"; median of {c['repeats']} runs" if c["repeats"] > 1 else "")
        + ". 'Median step speed-up' is the median over the timed steps of padded seconds / variant seconds "
        "for the same mini-batch (robust to load spikes)",
        "- Schedule: "
        + ("in-process, one variant after the other (peak memory less exact)" if not c["subprocess"] else
           "each variant in a fresh worker process, trained in lockstep (step i of every variant, then step i+1)"
           if c["schedule"] == "interleaved" else "each variant in a fresh worker process, one after the other"),
        "",
    ]
    for entry in report["datasets"].values():
        s = entry["length_stats"]
        lines += [
            f"## {entry['label']}",
            "",
            f"Example length mean {s['mean']:.0f}, median {s['median']:.0f}, max {s['max']}; "
            f"{s['real_tokens_per_step']:.0f} real tokens per step; padded batches hold "
            f"{s['padding_ratio']:.2f} token slots per real token.",
            "",
            "| variant | real tokens/s | vs padded | median step speed-up | tokens/CPU-s | vs padded "
            "| peak memory (MB) | vs padded | above start (MB) | final train loss | eval loss "
            "| max rel. loss diff vs padded | optimizer steps |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        kind = None
        for name, res in entry["variants"].items():
            if "skipped" in res:
                lines.append(f"| {name} | skipped: {res['skipped']} |" + " |" * 12)
                continue
            kind = res["memory_kind"]
            cmp = entry["comparison"].get(name)
            diff = "" if cmp is None else f"{max(cmp['train_loss_max_rel_diff'], cmp['eval_loss_rel_diff']):.1e}"
            above = res.get("memory_above_start_mb")
            lines.append(
                f"| {name} | {res['tokens_per_second']:,.0f} | "
                f"{_fmt_ratio(cmp and cmp['throughput_ratio'])} | {_fmt_ratio(cmp and cmp['median_step_speedup'])} | "
                f"{_fmt_number(res['tokens_per_cpu_second'])} | "
                f"{_fmt_ratio(cmp and cmp['cpu_throughput_ratio'])} | {res['peak_memory_mb']:,.0f} | "
                f"{_fmt_ratio(cmp and cmp['memory_ratio'])} | {'' if above is None else f'{above:,.0f}'} | "
                f"{res['train_loss'][-1]:.6f} | {res['eval_loss']:.6f} | {diff} | {res['optimizer_steps']} |"
            )
        if kind:
            lines += ["", f"Peak memory: {kind}; 'above start' subtracts the memory held before the first step."]
        lines.append("")
    lines += ["## Targets", ""]
    for t in report["targets"]:
        lines.append(f"- {_check(t['holds'])}: {t['target']}: {t['shown']}")
    lines += [
        "",
        "Paper (arXiv 2407.09105, Table 2; 8x A100-80GB, FSDP), padded -> padding-free: FLAN ~2x tokens/s and "
        "~-20% peak memory (Mistral-7B 742 -> 1408 tok/s/GPU, Llama-2-7B 771 -> 1455, Granite-8B-code "
        "693 -> 1358); OrcaMath ~1.4x and ~-6% (Llama-2 1269 -> 1746, Mistral 1216 -> 1658); validation loss "
        "unchanged.",
        "",
    ]
    return "\n".join(lines)


def write_outputs(report: dict[str, Any], output_dir: Path, name: str) -> dict[str, Path]:
    """Write ``<name>.json``, ``<name>.md`` and ``<name>.png`` under ``output_dir``; return their paths."""
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = {ext: output_dir / f"{name}.{ext}" for ext in ("json", "md", "png")}
    paths["json"].write_text(json.dumps(report, indent=1) + "\n")
    paths["md"].write_text(to_markdown(report))
    plot(report, paths["png"])
    return paths
