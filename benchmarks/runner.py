"""Running the benchmark: worker processes (one per variant), the interleaved (lockstep) and sequential
schedules, repeats, and the report of :func:`run_benchmark`.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .config import BASELINE, VARIANTS, BenchConfig, variant_unavailable
from .data import DATASETS
from .lockstep import LockstepWorker, run_in_lockstep, tail, worker_env
from .machine import _load_average, machine_info
from .measures import max_rel_diff
from .report import PAPER, compare, evaluate_targets
from .worker import run_variant


def _worker_command(spec_path: Path, out_path: Path, interactive: bool) -> list[str]:
    cmd = [sys.executable, "-m", "benchmarks", "--worker", str(spec_path), "--worker-output", str(out_path)]
    return [*cmd, "--interactive"] if interactive else cmd


def _write_spec(tmp: str, config: BenchConfig, dataset: str, variant: str) -> tuple[Path, Path]:
    spec_path, out_path = Path(tmp, f"{variant}.spec.json"), Path(tmp, f"{variant}.result.json")
    spec_path.write_text(json.dumps({"config": config.to_dict(), "dataset": dataset, "variant": variant}))
    return spec_path, out_path


def _run_in_subprocess(config: BenchConfig, dataset: str, variant: str) -> dict[str, Any]:
    """One variant, all steps, in a fresh worker process (the ``sequential`` schedule)."""
    with tempfile.TemporaryDirectory(prefix="trl-padfree-bench-") as tmp:
        spec_path, out_path = _write_spec(tmp, config, dataset, variant)
        cmd = _worker_command(spec_path, out_path, interactive=False)
        proc = subprocess.run(cmd, env=worker_env(), capture_output=True, text=True)
        if proc.returncode != 0 or not out_path.exists():
            raise RuntimeError(
                f"the {dataset}/{variant} worker failed (exit {proc.returncode}):\n{tail(proc.stderr or proc.stdout)}"
            )
        return json.loads(out_path.read_text())


def _run_interleaved(config: BenchConfig, dataset: str, variants: list[str]) -> dict[str, dict[str, Any]]:
    """All variants in their own worker processes, trained in lockstep: step i of every variant, then step i+1.

    Only one worker computes at a time; the others wait on their stdin. Drift of a shared machine's load then
    hits every variant alike, step by step. The order of the variants rotates from step to step. A variant with
    fewer steps (token-budget batching can change the count) stops early; one with more runs on alone.
    """
    with tempfile.TemporaryDirectory(prefix="trl-padfree-bench-") as tmp:
        workers = []
        for name in variants:
            spec_path, out_path = _write_spec(tmp, config, dataset, name)
            command = _worker_command(spec_path, out_path, interactive=True)
            workers.append(LockstepWorker(f"{dataset}/{name}", command, Path(tmp, f"{name}.stderr"), out_path))
        return dict(zip(variants, run_in_lockstep(workers), strict=True))


def _merge_repeat(variants: dict[str, dict[str, Any]], name: str, result: dict[str, Any]) -> None:
    """Keep the first run's details; collect every run's throughput (median), the worst peak memory."""
    if name not in variants:
        result["tokens_per_second_runs"] = [result["tokens_per_second"]]
        result["tokens_per_cpu_second_runs"] = [result["tokens_per_cpu_second"]]
        variants[name] = result
        return
    first = variants[name]
    first["tokens_per_second_runs"].append(result["tokens_per_second"])
    first["tokens_per_cpu_second_runs"].append(result["tokens_per_cpu_second"])
    first["tokens_per_second"] = statistics.median(first["tokens_per_second_runs"])
    if first["tokens_per_cpu_second"] is not None:
        first["tokens_per_cpu_second"] = statistics.median(first["tokens_per_cpu_second_runs"])
    first["peak_memory_mb"] = max(first["peak_memory_mb"], result["peak_memory_mb"])
    first["repeat_loss_max_rel_diff"] = max(
        first.get("repeat_loss_max_rel_diff", 0.0), max_rel_diff(result["train_loss"], first["train_loss"])
    )


def run_benchmark(config: BenchConfig, log=print) -> dict[str, Any]:
    """Run every (dataset, variant) pair and return the report (config, machine, results, comparisons, targets).

    Each variant runs in a fresh worker process (``config.subprocess``), all variants of a dataset trained in
    lockstep (``schedule="interleaved"``) or one after the other (``"sequential"``); or, for tests, in this
    process one after the other. With ``repeats > 1`` the whole measurement is repeated and tokens/s is the
    median of the runs.
    """
    config.validate()
    report: dict[str, Any] = {
        "benchmark": "trl-padfree: padded vs padding-free training (same examples, same mini-batches, same steps)",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {**config.to_dict(), "loss_rtol": config.effective_loss_rtol,
                   "parameters": config.parameter_count()},
        "machine": machine_info(config.device, threads=config.threads),
        "datasets": {},
        "paper": PAPER,
    }
    for dataset in config.datasets:
        stats = config.length_stats(dataset)
        if any(VARIANTS[name].batching == "token-budget" for name in config.variants):
            stats["token_budget"] = config.token_budget(dataset)
        log(f"\n{DATASETS[dataset].short}: mean length {stats['mean']:.0f}, median {stats['median']:.0f}, "
            f"{stats['real_tokens_per_step']:.0f} real tokens per step, padding ratio {stats['padding_ratio']:.2f}")
        variants: dict[str, dict[str, Any]] = {}
        runnable = []
        for name in config.variants:
            reason = variant_unavailable(name, config.device)
            if reason is None:
                runnable.append(name)
            else:
                variants[name] = {"variant": name, "skipped": reason}
                log(f"  {name:<15} skipped: {reason}")
        for repeat in range(config.repeats):
            started = time.perf_counter()
            if not config.subprocess:
                results = {name: run_variant(config, dataset, name) for name in runnable}
            elif config.schedule == "interleaved":
                results = _run_interleaved(config, dataset, runnable)
            else:
                results = {name: _run_in_subprocess(config, dataset, name) for name in runnable}
            wall = time.perf_counter() - started
            for name, result in results.items():
                _merge_repeat(variants, name, result)
                per_cpu = result["tokens_per_cpu_second"]
                cpu_note = "" if per_cpu is None else f" ({per_cpu:,.0f} per CPU-s)"
                rep = f" (run {repeat + 1}/{config.repeats})" if config.repeats > 1 else ""
                log(f"  {name:<15} {result['tokens_per_second']:>9,.0f} real tok/s{cpu_note}, peak "
                    f"{result['peak_memory_mb']:,.0f} MB, {result['median_step_seconds'] * 1000:,.1f} ms/step, "
                    f"final loss {result['train_loss'][-1]:.6f}, eval {result['eval_loss']:.6f}, "
                    f"{result['optimizer_steps']} steps{rep}")
            log(f"  [{wall:.0f} s, {'in-process' if not config.subprocess else config.schedule}]")
        ordered = {name: variants[name] for name in config.variants}
        comparison = compare(ordered, report["config"])
        for name, cmp in comparison.items():
            if name != BASELINE:
                log(f"  {name:<15} {cmp['throughput_ratio']:.2f}x padded real tok/s" + (
                    "" if cmp["flop_ratio"] is None else
                    f", FLOP ratio {cmp['flop_ratio']:.2f}x ({cmp['share_of_flop_ratio']:.0%} of it)"))
        report["datasets"][dataset] = {
            "label": DATASETS[dataset].label,  # the distribution; titles use the run's own length_stats
            "length_stats": stats,
            "variants": ordered,
            "comparison": comparison,
        }
    report["machine"]["load_average_end"] = _load_average()
    report["targets"] = evaluate_targets(report)
    return report
