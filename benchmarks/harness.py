"""The harness: every variant trains in a fresh worker process (``python -m benchmarks --worker SPEC OUT``) through
its real trainer's ``train()``; the worker measures, the parent compares and writes the report.

Measured per optimizer step, in every task alike: wall time (step end to step end: fetch and collation, forwards,
backward, optimizer, logging), the logged loss, the records the collator received (their fingerprint: the same
records in the same steps in every variant, verified), their tokens (:func:`~.workloads.record_tokens`), and the
matmul FLOPs of every forward the models ran (:mod:`.flops`, from a forward pre-hook on each model; forwards inside
``generate`` are timed apart and not counted). One memory meter: CUDA ``max_memory_allocated``, else the worker's
peak RSS (a fresh process per variant: its peak is the variant's own).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

from .flops import forward_flops, workload
from .workloads import TASKS, record_tokens

ROOT = Path(__file__).resolve().parents[1]


class Meter:
    """Records a trainer's steps (a ``TrainerCallback``), its batches (a collator wrapper) and forwards (hooks)."""

    def __init__(self, trainer: Any, opts: Any) -> None:
        from transformers import TrainerCallback

        self.trainer, self.opts = trainer, opts
        self.hybrid = TASKS[opts.task].model == "hybrid"
        self.steps: list[dict[str, Any]] = []
        self.batches: list[tuple[str, int]] = []
        self._open = self._new()
        self.in_generate = False
        meter = self

        class Callback(TrainerCallback):
            def on_train_begin(self, args, state, control, **kw):
                meter.sync()
                meter.started = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                meter.sync()
                now = time.perf_counter()
                meter._open["seconds"] = now - meter.started
                if meter.batches:  # the dataloader fetches ahead: the oldest collated batch is this step's
                    meter._open["records"], meter._open["tokens"] = meter.batches.pop(0)
                meter.steps.append(meter._open)
                meter._open, meter.started = meter._new(), now

            def on_log(self, args, state, control, logs=None, **kw):
                if logs and "loss" in logs and meter.steps:
                    meter.steps[-1]["loss"] = float(logs["loss"])

        trainer.add_callback(Callback())
        collate = trainer.data_collator

        def recording(features: list[dict[str, Any]]) -> Any:
            extra = opts.completion if TASKS[opts.task].trainer in ("GRPO", "RLOO") else 0
            self.batches.append((fingerprint(features), sum(record_tokens(f) + extra for f in features)))
            return collate(features)

        trainer.data_collator = recording
        models = [trainer.model] + [m for m in (getattr(trainer, "ref_model", None),) if m is not None]
        for model in models:
            model.register_forward_pre_hook(self._forward, with_kwargs=True)
            if hasattr(model, "generate"):
                model.generate = self._timed_generate(model.generate)

    @staticmethod
    def _new() -> dict[str, Any]:
        return {"records": "", "tokens": 0, "flops": 0.0, "generation_seconds": 0.0, "forwards": 0}

    def sync(self) -> None:
        import torch

        if self.opts.device.startswith("cuda"):
            torch.cuda.synchronize()

    def _forward(self, module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        import torch

        if self.in_generate:
            return
        if args and "input_ids" not in kwargs:
            kwargs = {"input_ids": args[0], **kwargs}
        scored = getattr(self.trainer, "lm_head_state", None) == "scored"
        work = workload(kwargs, module.config._attn_implementation, scored)
        if TASKS[self.opts.task].model == "classifier":
            work["head"] = 0  # a reward model's score head is d x 1
        factor = 3 if torch.is_grad_enabled() and module.training else 1
        self._open["flops"] += factor * forward_flops(self.opts.shape, work, self.hybrid)
        self._open["forwards"] += 1

    def _timed_generate(self, generate: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.in_generate, start = True, time.perf_counter()
            try:
                return generate(*args, **kwargs)
            finally:
                self.in_generate = False
                self._open["generation_seconds"] += time.perf_counter() - start
        return timed


def fingerprint(features: list[dict[str, Any]]) -> str:
    """``"<records>:<crc32>"`` of the records' token ids (or prompt text), in order.

    >>> fingerprint([{"input_ids": [1, 2], "completion_mask": [0, 1]}]) == fingerprint([{"input_ids": [1, 2]}])
    True
    """
    keys = ("input_ids", "prompt_ids", "chosen_ids", "rejected_ids", "completion_ids", "prompt", "label")
    canonical = [{k: f[k] for k in keys if k in f} for f in features]
    return f"{len(features)}:{zlib.crc32(json.dumps(canonical, default=str).encode()):08x}"


def peak_memory_mb(device: str) -> float:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


def worker(spec_path: str, out_path: str) -> int:
    """One variant, in this fresh process: build, train, measure; the measurements to ``out_path`` (JSON)."""
    import argparse
    import logging

    import datasets
    import torch
    import transformers

    from .workloads import build_trainer

    spec = json.loads(Path(spec_path).read_text())
    opts = argparse.Namespace(**spec["opts"])
    variant = next(v for v in TASKS[opts.task].variants if v.name == spec["variant"])
    if opts.threads:
        torch.set_num_threads(opts.threads)
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    logging.getLogger("trl").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="trl-padfree-bench-") as tmp:
        trainer = build_trainer(opts.task, variant, opts, spec["records"], tmp)
        meter = Meter(trainer, opts)
        before = peak_memory_mb(opts.device)
        if opts.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        trainer.train()
        peak = peak_memory_mb(opts.device)
    result = {"variant": variant.name, "steps": meter.steps, "peak_memory_mb": peak, "memory_before_mb": before,
              "attn_implementation": trainer.model.config._attn_implementation,
              "trainer": f"{type(trainer).__module__}.{type(trainer).__name__}",
              "lm_head": getattr(trainer, "lm_head_state", None)}
    Path(out_path).write_text(json.dumps(result))
    return 0


def run_variant(opts: Any, variant: str, records: list[dict[str, Any]], log: Any) -> dict[str, Any]:
    """``variant`` in a fresh worker process; its measurements (stderr's tail in the error if it fails)."""
    with tempfile.TemporaryDirectory(prefix="trl-padfree-bench-") as tmp:
        spec, out = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec.write_text(json.dumps({"opts": vars(opts), "variant": variant, "records": records}, default=str))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
               "TQDM_DISABLE": "1"}
        if opts.threads:
            env["OMP_NUM_THREADS"] = str(opts.threads)
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "benchmarks", "--worker", str(spec), str(out)], env=env,
                              capture_output=True, text=True, cwd=ROOT)
        if proc.returncode or not out.is_file():
            tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
            raise RuntimeError(f"variant {variant} failed (exit {proc.returncode}):\n{tail}")
        log(f"  {variant}: {time.perf_counter() - started:.0f} s")
        return json.loads(out.read_text())


def summarize(res: dict[str, Any], warmup: int) -> dict[str, Any]:
    """A variant's figures over its timed steps (those after ``warmup``)."""
    timed = res["steps"][warmup:]
    seconds = sum(s["seconds"] for s in timed)
    tokens = sum(s["tokens"] for s in timed)
    gen = [s["generation_seconds"] for s in timed]
    return {
        "tokens_per_second": tokens / seconds,
        "flops_per_token": sum(s["flops"] for s in timed) / tokens,
        "median_step_ms": 1000 * statistics.median(s["seconds"] for s in timed),
        "median_generation_ms": 1000 * statistics.median(gen),
        "median_rest_ms": 1000 * statistics.median(s["seconds"] - g for s, g in zip(timed, gen, strict=True)),
        "peak_memory_mb": res["peak_memory_mb"],
        "losses": [s.get("loss") for s in res["steps"]],
        "fingerprints": [s["records"] for s in res["steps"]],
    }


def compare(figures: dict[str, dict[str, Any]], baseline: str) -> dict[str, dict[str, Any]]:
    """Each variant's measured ratios over ``baseline``, the FLOP ratio beside them, loss and batch agreement.

    >>> f = {"a": {"tokens_per_second": 10.0, "flops_per_token": 6.0, "peak_memory_mb": 100.0, "losses": [1.0],
    ...            "fingerprints": [["1:ab"]], "median_rest_ms": 4.0},
    ...      "b": {"tokens_per_second": 25.0, "flops_per_token": 2.0, "peak_memory_mb": 50.0, "losses": [1.0],
    ...            "fingerprints": [["1:ab"]], "median_rest_ms": 2.0}}
    >>> c = compare(f, "a")["b"]
    >>> c["speed"], c["flop_ratio"], round(c["share"], 3), c["memory"], c["same_batches"], c["loss_diff"]
    (2.5, 3.0, 0.833, 0.5, True, 0.0)
    """
    base = figures[baseline]
    out = {}
    for name, f in figures.items():
        same = f["fingerprints"] == base["fingerprints"]
        pairs = [(a, b) for a, b in zip(f["losses"], base["losses"], strict=False) if a is not None and b is not None]
        speed, flop_ratio = f["tokens_per_second"] / base["tokens_per_second"], base["flops_per_token"] / f["flops_per_token"]
        out[name] = {"speed": speed, "flop_ratio": flop_ratio, "share": speed / flop_ratio,
                     "rest": base["median_rest_ms"] / f["median_rest_ms"] if f["median_rest_ms"] else None,
                     "memory": f["peak_memory_mb"] / base["peak_memory_mb"], "same_batches": same,
                     "loss_diff": max((abs(a - b) for a, b in pairs), default=None)
                     if same and len(f["losses"]) == len(base["losses"]) else None}
    return out


def table(figures: dict[str, dict[str, Any]], ratios: dict[str, dict[str, Any]], baseline: str,
          generation: bool) -> list[str]:
    """The Markdown table: measured figures and ratios over the baseline, the FLOP ratio beside them."""
    gen_head = " generation ms | rest ms | rest vs base |" if generation else ""
    lines = [f"| variant | real tokens/s | vs {baseline} | FLOP ratio | share of it | ms/step |{gen_head} peak MB "
             f"| memory vs base | max abs. loss diff | same batches |",
             "|---|---:|---:|---:|---:|---:|" + ("---:|---:|---:|" if generation else "") + "---:|---:|---:|---|"]
    for name, f in figures.items():
        r = ratios[name]
        gen = (f" {f['median_generation_ms']:,.0f} | {f['median_rest_ms']:,.0f} | {r['rest']:.2f}x |"
               if generation else "")
        diff = "" if r["loss_diff"] is None else f"{r['loss_diff']:.1e}"
        lines.append(f"| {name} | {f['tokens_per_second']:,.0f} | {r['speed']:.2f}x | {r['flop_ratio']:.2f}x | "
                     f"{r['share']:.0%} | {f['median_step_ms']:,.0f} |{gen} {f['peak_memory_mb']:,.0f} | "
                     f"{r['memory']:.2f}x | {diff} | {'yes' if r['same_batches'] else 'no'} |")
    return lines


def machine(opts: Any) -> dict[str, Any]:
    import torch
    import transformers
    import trl

    git = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True)
    cpu = platform.processor() or platform.machine()
    if Path("/proc/cpuinfo").is_file():
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), cpu)
    gpu = torch.cuda.get_device_name() if opts.device.startswith("cuda") else None
    return {"cpu": cpu, "cpus": os.cpu_count(), "gpu": gpu, "torch": torch.__version__,
            "transformers": transformers.__version__, "trl": trl.__version__, "git": git.stdout.strip() or None,
            "load_average": list(os.getloadavg())}


def run(opts: Any, log: Any = print) -> dict[str, Any]:
    """Every dataset and variant (``--rounds`` times in turns; medians), the report (also written as JSON and
    Markdown to ``<output-dir>/<name>``); the Markdown is printed."""
    from .workloads import records

    task = TASKS[opts.task]
    rl = task.trainer in ("GRPO", "RLOO")
    n = (opts.warmup + opts.steps) * (opts.groups if rl else opts.batch_size)
    report: dict[str, Any] = {"task": opts.task, "options": vars(opts), "machine": machine(opts), "datasets": {}}
    lines = [f"# trl-padfree bench --task {opts.task}" + (" --whole-step" if getattr(opts, "whole_step", False)
                                                        else ""), "",
             f"- {opts.model_size} model ({', '.join(f'{k} {v}' for k, v in opts.shape.items())}, {task.model}), "
             f"{opts.dtype} on {opts.device}, {opts.threads or 'default'} torch threads; batch {opts.batch_size}, "
             f"{opts.warmup} warm-up + {opts.steps} timed steps, lengths x{opts.scale:g}, {opts.rounds} round(s), "
             "each variant in its own process",
             f"- Machine: {report['machine']['cpu']} ({report['machine']['cpus']} CPUs), "
             f"{report['machine']['gpu'] or 'no GPU'}; torch {report['machine']['torch']}, transformers "
             f"{report['machine']['transformers']}, trl {report['machine']['trl']}, git {report['machine']['git']}; "
             f"load average {report['machine']['load_average']}"]
    for dataset in opts.datasets:
        data = records(opts.task, dataset, n, vocab=opts.shape["vocab_size"], seed=opts.seed, scale=opts.scale,
                       max_length=opts.max_length, prompt_mean=opts.prompt_mean)
        log(f"{opts.task} {dataset}".strip() + f": {len(data)} records, {sum(map(record_tokens, data)):,} tokens")
        rounds: dict[str, list[dict[str, Any]]] = {v: [] for v in opts.variants}
        for _ in range(opts.rounds):
            for variant in opts.variants:
                rounds[variant].append(run_variant(opts, variant, data, log))
        figures = {}
        for name, results in rounds.items():
            each = [summarize(r, opts.warmup) for r in results]
            figures[name] = {**each[0], **{k: statistics.median(e[k] for e in each) for k in
                                           ("tokens_per_second", "median_step_ms", "median_rest_ms",
                                            "median_generation_ms", "peak_memory_mb")}}
        ratios = compare(figures, opts.variants[0])
        report["datasets"][dataset] = {"variants": rounds, "figures": figures, "ratios": ratios}
        lines += ["", f"## {dataset or opts.task}", "", *table(figures, ratios, opts.variants[0], rl)]
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
