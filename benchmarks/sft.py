"""Padded vs padding-free fine-tuning benchmark: the paper's comparison (arXiv 2407.09105, Table 2) on any machine.

The same examples, in the same mini-batches, for the same number of optimizer steps, once per variant, with a
randomly initialised Llama built from a config (nothing is downloaded) on synthetic data whose lengths follow the
paper's two datasets: ``flan`` (FLAN-like, lognormal, median ~340 tokens, sigma 0.8: short, heavy right tail) and
``orcamath`` (OrcaMath-like, normal 400 +- 140). Every example is ``<bos> prompt <response template> completion
<eos>``, Zipf-distributed token ids; the loop variants collate with this project's collator (completion-only
labels, identical in both layouts), then ``model(**batch).loss``, ``backward()``, ``AdamW.step()``.

Variants (docs/benchmark.md): ``padded-sdpa`` (the baseline), ``packed-sdpa`` (transformers' sdpa, a dense
block-diagonal mask), ``packed-padfree`` (this project's varlen ``"padfree"``), ``packed-fa2`` (CUDA and
flash-attn only), ``trl-native`` (``trl.SFTTrainer``, ``SFTConfig(padding_free=True)``, TRL's collator, the
model's default attention), ``sft-padfree`` (``trl_padfree.SFTTrainer``, this collator, ``"padfree"``) and
``token-budget`` (whole examples up to ``--max-tokens`` per mini-batch: another step count). Each runs in a fresh
worker process, the workers of a dataset trained in lockstep (``--schedule sequential``: one after the other).
Every batch the model receives is fingerprinted, so "the same mini-batches" is verified.

Recorded per variant: real tokens/s over the timed steps, peak memory, every step's train loss, the eval loss, the
median step time and its part outside compute, and each step's matmul FLOPs (:mod:`.flops`), whose ratio over
padded is printed next to each measured ratio. Results go to ``<output-dir>/<name>.json``, ``.md`` and ``.png``.
Targets are judged only where they apply (else "n/a"): the throughput targets ask for 90% of the workload's FLOP
ratio; the command exits 1 when a judged target fails, 2 on bad options.

    trl-padfree bench                                   # CPU defaults (a few minutes on 2 cores)
    python scripts/bench.py --datasets flan --steps 20
    python scripts/bench.py --device cuda --dtype bfloat16 --model-size 0.5b

This is ``--task sft``; ``--task dpo|grpo|rloo|reward|kto`` runs the other trainers' benchmarks, each with its own
options (``trl-padfree bench --task dpo --help``). The benchmark is this directory of a source checkout, not part of
the installed package.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from .config import BASELINE, SCHEDULES, VARIANTS, BenchConfig, variant_unavailable
from .data import DATASETS
from .plot import plot
from .report import finish_report, max_rel_diff, new_report, run_and_report, write_report
from .runner import run_variants
from .sft_report import PAPER, compare, evaluate_targets, to_markdown
from .targets import verdict


def add_options(p: argparse.ArgumentParser, task: str) -> None:
    from .cli import csv

    d = BenchConfig()
    p.add_argument("--datasets", type=csv, default=",".join(d.datasets), help=f"comma list of {', '.join(DATASETS)}")
    BenchConfig.add_options(p, variants=" (packed-fa2 is skipped without CUDA + flash-attn)",
                            batch="examples per optimizer step",
                            seed="seed of the data and of the initial weights",
                            length_scale="multiply the datasets' lengths (e.g. 0.1 for a quick smoke run)",
                            max_length="examples are clipped to this length",
                            loss_rtol="tolerance of the loss-equality target (default 1e-5 in float32, 1e-2 otherwise)",
                            in_process="run variants in this process (faster start; CPU peak memory is then less "
                            "exact)",
                            name="output file stem (default: the device type, e.g. cpu)")
    p.add_argument("--eval-batches", type=int, default=d.eval_batches, help="eval mini-batches (after training)")
    p.add_argument("--min-length", type=int, default=d.min_length, help="examples are at least this long")
    p.add_argument("--prompt-fraction", type=float, default=d.prompt_fraction,
                   help="share of an example before the response template (not trained)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="token budget per mini-batch of the token-budget variant (default: the mean real tokens of "
                   "the fixed mini-batches)")
    p.add_argument("--repeats", type=int, default=d.repeats,
                   help="interleaved runs per variant; tokens/s is the median")
    p.add_argument("--schedule", choices=SCHEDULES, default=d.schedule,
                   help="interleaved: every variant in its own worker, trained in lockstep (step i of each, then "
                   "step i+1), so load drift on a shared machine hits all alike; all workers are alive at once, "
                   "each holding its model. sequential: one worker after the other")
    p.add_argument("--replot", type=Path, metavar="REPORT_JSON",
                   help="only rewrite the Markdown and PNG next to an existing report JSON (no training)")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """A :class:`BenchConfig` from parsed arguments (model preset first, then explicit overrides)."""
    return BenchConfig(
        **BenchConfig.values(args), datasets=args.datasets, eval_batches=args.eval_batches,
        min_length=args.min_length, prompt_fraction=args.prompt_fraction, repeats=args.repeats,
        schedule=args.schedule, max_tokens=args.max_tokens,
    )


def config_from_dict(values: dict[str, Any]) -> BenchConfig:
    return BenchConfig.from_dict(values)


def make_run(config: BenchConfig, dataset: str, variant: str, *, isolated: bool = False):
    """The run object of ``variant``: this benchmark's loop or an ``SFTTrainer`` run (:mod:`.sft_run`)."""
    from .sft_run import SFTTrainerRun, VariantRun

    run = SFTTrainerRun if VARIANTS[variant].runner == "sft-trainer" else VariantRun
    return run(config, dataset, variant, isolated=isolated)


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
    process one after the other (:func:`~.runner.run_variants`). With ``repeats > 1`` the whole measurement is
    repeated and tokens/s is the median of the runs.
    """
    config.validate()
    report = new_report("trl-padfree: padded vs padding-free training (same examples, same mini-batches, same steps)",
                        config, loss_rtol=config.effective_loss_rtol)
    report.update(datasets={}, paper=PAPER)
    schedule = config.schedule if config.subprocess else "in-process"
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
            results = run_variants(sys.modules[__name__], config, runnable, schedule, dataset)
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
            log(f"  [{wall:.0f} s, {schedule}]")
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
    return finish_report(report, evaluate_targets)


def _read_report(path: Path) -> dict[str, Any]:
    """The report JSON at ``path``; ``ValueError`` with the reason when it is not one."""
    if not path.is_file():
        raise ValueError("no such file")
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    missing = [key for key in ("config", "machine", "datasets") if not isinstance(report, dict) or key not in report]
    if missing:
        raise ValueError(f"not a trl-padfree bench report (no {', '.join(repr(k) for k in missing)})")
    return report


def main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``trl-padfree bench``: run the benchmark (or ``--replot`` a report), write JSON/Markdown/PNG, print the
    table and the targets."""
    if args.replot:
        try:
            report = _read_report(args.replot)
        except ValueError as exc:
            parser.error(f"--replot {args.replot}: {exc}; pass a JSON report written by trl-padfree bench")
        report["targets"] = evaluate_targets(report)  # derived from the measurements: re-checked with this code
        paths = write_report(report, args.replot.parent, args.replot.stem, to_markdown, plot)
        print(f"Wrote {paths['md']}, {paths['png']}")
        return verdict(report)
    return run_and_report(parser, args, config_from_args(args), run_benchmark, to_markdown, plot,
                          stem=args.device.split(":")[0])
