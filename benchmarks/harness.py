"""The harness: every variant trains in a fresh worker process (spawned, :func:`worker`) through its real trainer's
``train()``; the worker measures (:class:`Meter`: each optimizer step's time, loss, records and tokens, and the
FLOPs of its forwards; :func:`peak_memory_mb`, the one memory meter), the parent compares the variants and writes
the report (docs/benchmark.md, "What is measured").
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch
from transformers import PrinterCallback, TrainerCallback

from .flops import forward_flops, workload
from .workloads import IDS, RL, TASKS, build_trainer, record_tokens, records

ROOT = Path(__file__).resolve().parents[1]
STEP = {"records": "", "tokens": 0, "flops": 0.0, "generation_seconds": 0.0}  # a step as it starts


class Meter(TrainerCallback):
    """Times a trainer's optimizer steps (this callback), records its batches (a collator wrapper) and counts its
    models' forward FLOPs (a pre-hook on each; forwards inside ``generate`` are timed apart and not counted)."""

    def __init__(self, trainer: Any, opts: Any) -> None:
        self.trainer, self.opts, self.task = trainer, opts, TASKS[opts.task]
        self.steps: list[dict[str, Any]] = []
        self.batches: list[tuple[str, int]] = []
        self.step, self.in_generate = dict(STEP), False
        trainer.add_callback(self)
        collate, extra = trainer.data_collator, opts.completion if self.task.trainer in RL else 0

        def recording(features: list[dict[str, Any]]) -> Any:
            self.batches.append((fingerprint(features), sum(record_tokens(f) + extra for f in features)))
            return collate(features)

        trainer.data_collator = recording
        for model in (m for m in (trainer.model, getattr(trainer, "ref_model", None)) if m is not None):
            model.register_forward_pre_hook(self.forward, with_kwargs=True)
            if hasattr(model, "generate"):
                model.generate = self.timed(model.generate)

    def now(self) -> float:
        """``time.perf_counter()`` once the device's queued work is done."""
        if self.opts.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter()

    def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
        self.started = self.now()

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        now = self.now()
        if self.batches:  # the dataloader fetches ahead: the oldest collated batch is this step's
            self.step["records"], self.step["tokens"] = self.batches.pop(0)
        self.steps.append({**self.step, "seconds": now - self.started})
        self.step, self.started = dict(STEP), now

    def on_log(self, *args: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        if logs and "loss" in logs and self.steps:
            self.steps[-1]["loss"] = float(logs["loss"])

    def forward(self, module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        """Count the FLOPs of this forward (:mod:`.flops`), from its arguments."""
        if self.in_generate:
            return
        if args and "input_ids" not in kwargs:
            kwargs = {"input_ids": args[0], **kwargs}
        scored = getattr(self.trainer, "lm_head_state", None) == "scored"
        work = workload(kwargs, module.config._attn_implementation, scored)
        if self.task.model == "classifier":
            work["head"] = 0  # a reward model's score head is d x 1
        factor = 3 if torch.is_grad_enabled() and module.training else 1
        self.step["flops"] += factor * forward_flops(self.opts.shape, work, self.task.model == "hybrid")

    def timed(self, generate: Any) -> Any:
        """``generate``, its time added to the step's generation time."""
        def timed_generate(*args: Any, **kwargs: Any) -> Any:
            self.in_generate, start = True, time.perf_counter()
            try:
                return generate(*args, **kwargs)
            finally:
                self.in_generate = False
                self.step["generation_seconds"] += time.perf_counter() - start
        return timed_generate


def fingerprint(features: list[dict[str, Any]]) -> str:
    """``"<records>:<crc32>"`` of the records' token ids (or prompt text), in order.

    >>> fingerprint([{"input_ids": [1, 2], "completion_mask": [0, 1]}]) == fingerprint([{"input_ids": [1, 2]}])
    True
    """
    canonical = [{k: f[k] for k in (*IDS, "prompt", "label") if k in f} for f in features]
    return f"{len(features)}:{zlib.crc32(json.dumps(canonical, default=str).encode()):08x}"


def peak_memory_mb(device: str) -> float:
    """The one memory meter: CUDA's peak allocated memory, else this process's peak RSS."""
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**20 if sys.platform == "darwin" else 2**10)


def worker(options: dict[str, Any], name: str, data: list[dict[str, Any]]) -> dict[str, Any]:
    """Variant ``name``, in a fresh process: build, train, measure; its measurements."""
    opts = argparse.Namespace(**options)
    variant = next(v for v in TASKS[opts.task].variants if v.name == name)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    for fd in (1, 2):  # the console shows the report, not the libraries' progress bars and warnings; an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), fd)  # reaches the parent with its traceback
    with tempfile.TemporaryDirectory(prefix="trl-padfree-bench-") as tmp:
        trainer = build_trainer(opts.task, variant, opts, data, tmp)
        trainer.remove_callback(PrinterCallback)  # the losses are in the report
        meter = Meter(trainer, opts)
        if opts.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        trainer.train()
    return {"variant": variant.name, "steps": meter.steps, "peak_memory_mb": peak_memory_mb(opts.device),
            "attn_implementation": trainer.model.config._attn_implementation,
            "trainer": f"{type(trainer).__module__}.{type(trainer).__name__}",
            "lm_head": getattr(trainer, "lm_head_state", None)}


def run_variant(opts: Any, variant: str, data: list[dict[str, Any]], log: Any) -> dict[str, Any]:
    """``variant`` in a fresh (spawned) worker process, whose peak memory is the variant's own; its measurements."""
    started = time.perf_counter()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        result = pool.submit(worker, vars(opts), variant, data).result()
    log(f"  {variant}: {time.perf_counter() - started:.0f} s")
    return result


def summarize(rounds: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """A variant's figures over its timed steps (those after ``warmup``): the median over its rounds."""
    def median(figure: Any) -> float:  # of figure(the timed steps) over the rounds
        return statistics.median(figure(r["steps"][warmup:]) for r in rounds)

    def ratio(a: str, b: str) -> float:  # the sum of a over the sum of b
        return median(lambda steps: sum(s[a] for s in steps) / sum(s[b] for s in steps))

    def step_ms(seconds: Any) -> float:  # the median step's, in ms
        return 1000 * median(lambda steps: statistics.median(map(seconds, steps)))

    first = rounds[0]["steps"]
    return {"tokens_per_second": ratio("tokens", "seconds"), "flops_per_token": ratio("flops", "tokens"),
            "median_step_ms": step_ms(lambda s: s["seconds"]),
            "median_generation_ms": step_ms(lambda s: s["generation_seconds"]),
            "median_rest_ms": step_ms(lambda s: s["seconds"] - s["generation_seconds"]),
            "peak_memory_mb": statistics.median(r["peak_memory_mb"] for r in rounds),
            "losses": [s.get("loss") for s in first], "fingerprints": [s["records"] for s in first]}


def compare(f: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """A variant's measured ratios over the baseline's (:func:`summarize` figures each), the FLOP ratio beside them,
    loss and batch agreement.

    >>> base = {"tokens_per_second": 10.0, "flops_per_token": 6.0, "peak_memory_mb": 100.0, "losses": [1.0, None],
    ...         "fingerprints": ["1:ab", "1:cd"], "median_rest_ms": 4.0}
    >>> c = compare({**base, "tokens_per_second": 25.0, "flops_per_token": 2.0, "peak_memory_mb": 50.0}, base)
    >>> c["speed"], c["flop_ratio"], round(c["share"], 3), c["memory"], c["same_batches"], c["loss_diff"]
    (2.5, 3.0, 0.833, 0.5, True, 0.0)
    """
    same = f["fingerprints"] == base["fingerprints"]  # then as many losses, step by step
    diffs = [abs(a - b) for a, b in zip(f["losses"], base["losses"], strict=False) if a is not None and b is not None]
    speed, flops = f["tokens_per_second"] / base["tokens_per_second"], base["flops_per_token"] / f["flops_per_token"]
    return {"speed": speed, "flop_ratio": flops, "share": speed / flops,
            "rest": base["median_rest_ms"] / f["median_rest_ms"] if f["median_rest_ms"] else None,
            "memory": f["peak_memory_mb"] / base["peak_memory_mb"], "same_batches": same,
            "loss_diff": max(diffs, default=None) if same else None}


def table(figures: dict[str, dict[str, Any]], ratios: dict[str, dict[str, Any]], baseline: str,
          generation: bool) -> list[str]:
    """The Markdown table: measured figures and ratios over the baseline, the FLOP ratio beside them."""
    columns = [("real tokens/s", "{f[tokens_per_second]:,.0f}"), (f"vs {baseline}", "{r[speed]:.2f}x"),
               ("FLOP ratio", "{r[flop_ratio]:.2f}x"), ("share of it", "{r[share]:.0%}"),
               ("ms/step", "{f[median_step_ms]:,.0f}")]
    if generation:
        columns += [("generation ms", "{f[median_generation_ms]:,.0f}"), ("rest ms", "{f[median_rest_ms]:,.0f}"),
                    ("rest vs base", "{r[rest]:.2f}x")]
    columns += [("peak MB", "{f[peak_memory_mb]:,.0f}"), ("memory vs base", "{r[memory]:.2f}x"),
                ("max abs. loss diff", "{diff}"), ("same batches", "{same}")]
    lines = ["| variant | " + " | ".join(head for head, _ in columns) + " |", "|---|" + "---:|" * (len(columns) - 1)
             + "---|"]
    for name, f in figures.items():
        r = ratios[name]
        diff, same = "" if r["loss_diff"] is None else f"{r['loss_diff']:.1e}", "yes" if r["same_batches"] else "no"
        lines.append(f"| {name} | " + " | ".join(cell.format(f=f, r=r, diff=diff, same=same) for _, cell in columns)
                     + " |")
    return lines


def machine(opts: Any) -> dict[str, Any]:
    """Where the report was measured: CPU, GPU, library versions, git commit, load average."""
    import transformers
    import trl

    git = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True)
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    cpu = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.M)
    return {"cpu": cpu[1] if cpu else platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "gpu": torch.cuda.get_device_name() if opts.device.startswith("cuda") else None,
            "torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
            "git": git.stdout.strip() or None, "load average": [round(x, 2) for x in os.getloadavg()]}


def run(opts: Any, log: Any = print) -> dict[str, Any]:
    """Every dataset and variant (``--rounds`` times in turns; medians), the report (also written as JSON and
    Markdown to ``<output-dir>/<name>``, the figure as PNG); the Markdown is printed."""
    task = TASKS[opts.task]
    n = (opts.warmup + opts.steps) * (opts.groups if task.trainer in RL else opts.batch_size)
    report: dict[str, Any] = {"task": opts.task, "options": vars(opts), "machine": machine(opts), "datasets": {}}
    lines = [f"# trl-padfree bench --task {opts.task}" + " --whole-step" * opts.whole_step, "",
             f"- {opts.model_size} model ({', '.join(f'{k} {v}' for k, v in opts.shape.items())}, {task.model}), "
             f"{opts.dtype} on {opts.device}, {opts.threads or 'default'} torch threads; batch {opts.batch_size}, "
             f"{opts.warmup} warm-up + {opts.steps} timed steps, lengths x{opts.scale:g}, {opts.rounds} round(s), "
             "each variant in its own process",
             "- Machine: " + ", ".join(f"{k} {v}" for k, v in report["machine"].items())]
    for dataset in opts.datasets:
        data = records(opts.task, dataset, n, vocab=opts.shape["vocab_size"], scale=opts.scale,
                       max_length=opts.max_length, prompt_mean=opts.prompt_mean)
        log(f"{opts.task} {dataset}".strip() + f": {len(data)} records, {sum(map(record_tokens, data)):,} tokens")
        rounds: dict[str, list[dict[str, Any]]] = {v: [] for v in opts.variants}
        for _ in range(opts.rounds):
            for variant in opts.variants:
                rounds[variant].append(run_variant(opts, variant, data, log))
        figures = {name: summarize(results, opts.warmup) for name, results in rounds.items()}
        ratios = {name: compare(f, figures[opts.variants[0]]) for name, f in figures.items()}
        report["datasets"][dataset] = {"variants": rounds, "figures": figures, "ratios": ratios}
        lines += ["", f"## {dataset or opts.task}", "", *table(figures, ratios, opts.variants[0], task.trainer in RL)]
    lines += ["", "FLOP ratio: the baseline's matmul FLOPs per real token over the variant's (benchmarks/flops.py); "
              "share of it: the measured real-tokens/s ratio over the FLOP ratio."]
    report["markdown"] = "\n".join(lines) + "\n"
    opts.output_dir.mkdir(parents=True, exist_ok=True)
    stem = opts.output_dir / opts.name
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
    stem.with_suffix(".md").write_text(report["markdown"])
    from .plot import plot

    png = plot(report, stem.with_suffix(".png"))
    log(report["markdown"] + f"Wrote {stem}.json, {stem}.md" + (f", {png}" if png else
        " (no figure: matplotlib is missing; pip install -e '.[bench]')"))
    return report
