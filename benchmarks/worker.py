"""One variant's training run in this project's own loop (:class:`VariantRun`), the factory that picks the run
class of a variant (:func:`make_run`), and the worker process that runs it (``python -m benchmarks --worker
SPEC``).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from .batches import batch_fingerprint, fixed_batches, token_budget_batches
from .config import VARIANTS, BenchConfig
from .data import TEMPLATE_IDS
from .flops import is_varlen, sft_workload
from .training import (
    MemoryMeter,
    StepRecords,
    bench_device,
    bench_examples,
    build_model,
    count_targets,
    evaluate,
    make_optimizer,
    synchronize,
    to_device,
)


class VariantRun:
    """One variant trained on one dataset in a hand-written loop, one optimizer step at a time.

    Building it makes the data (seeded), the mini-batches (fixed, or by token budget), the collator, the model
    (seeded: the same initial weights for every variant) and the AdamW optimizer; :meth:`step` trains on the next
    mini-batch (collate, ``model(**batch).loss``, backward, ``optimizer.step()``); :meth:`finish` evaluates and
    returns the measurements (a JSON-serialisable dict). ``isolated`` says this process does nothing else (a
    fresh worker), so its lifetime peak RSS is the variant's peak memory; otherwise the peak RSS since the start
    of the run is used (CPU).
    """

    def __init__(self, config: BenchConfig, dataset: str, variant: str, *, isolated: bool = False):
        from trl_padfree.collator import DataCollatorForCompletionOnlyLM

        self.config, self.dataset, self.variant = config, dataset, variant
        self.spec = spec = VARIANTS[variant]
        self.device = bench_device(config)
        train, evaluation = bench_examples(config, dataset)
        self.max_tokens = config.token_budget(dataset) if spec.batching == "token-budget" else None
        if self.max_tokens is not None:
            self.train_batches = token_budget_batches(train, self.max_tokens, config.seed)
        else:
            self.train_batches = fixed_batches(train, config.batch_size)
        self.eval_batches = fixed_batches(evaluation, config.batch_size)
        self.collator = DataCollatorForCompletionOnlyLM(
            list(TEMPLATE_IDS), padding_free=spec.padding_free, on_template_not_found="raise"
        )
        self.model = build_model(config, spec.attn_implementation, self.device)
        self.optimizer = make_optimizer(config, self.model)
        self.memory = MemoryMeter(self.device, isolated)
        self.memory.start()
        self.records = StepRecords(config.warmup)

    @property
    def total_steps(self) -> int:
        return len(self.train_batches)

    @property
    def steps_left(self) -> int:
        return len(self.train_batches) - len(self.records.step_seconds)

    def step(self) -> dict[str, Any]:
        """Collate the next mini-batch, forward, backward, ``optimizer.step()``; timed (CUDA: synchronised)."""
        if not self.steps_left:
            raise RuntimeError(f"{self.variant}: all {len(self.train_batches)} steps are done")
        rec = self.records
        examples = self.train_batches[len(rec.step_seconds)]
        features = [{"input_ids": ids} for ids in examples]
        synchronize(self.device)
        c0, t0 = time.process_time(), time.perf_counter()
        batch = self.collator(features)
        t1 = time.perf_counter()
        batch = to_device(batch, self.device)
        loss = self.model(**batch).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        synchronize(self.device)
        t2, c2 = time.perf_counter(), time.process_time()
        rec.step_seconds.append(t2 - t0)
        rec.cpu_seconds.append(c2 - c0)
        rec.compute_seconds.append(t2 - t1)
        rec.losses.append(float(loss.detach().float().item()))
        rec.real_tokens.append(sum(map(len, examples)))
        rec.input_tokens.append(int(batch["input_ids"].numel()))
        rec.target_tokens.append(count_targets(batch))
        rec.fingerprints.append(batch_fingerprint(batch))
        rec.workloads.append(dataclasses.asdict(sft_workload(batch, is_varlen(self.spec.attn_implementation))))
        return {"step": len(rec.step_seconds), "seconds": t2 - t0, "loss": rec.losses[-1]}

    def finish(self) -> dict[str, Any]:
        """Evaluate (token-weighted loss over the eval set) and return every measurement."""
        eval_loss, eval_targets = evaluate(
            self.model, self.collator, [[{"input_ids": ids} for ids in b] for b in self.eval_batches], self.device
        )
        return {
            "dataset": self.dataset,
            "variant": self.variant,
            "runner": "loop",
            "attn_implementation": self.spec.attn_implementation,
            "padding_free": self.spec.padding_free,
            "batching": self.spec.batching,
            "max_tokens": self.max_tokens,
            **self.records.summary(self.memory.cuda),
            "eval_loss": eval_loss,
            "eval_target_tokens": eval_targets,
            **self.memory.result(),
        }


def make_run(config: BenchConfig, dataset: str, variant: str, *, isolated: bool = False):
    """The run object of ``variant``: :class:`VariantRun` (own loop) or an ``SFTTrainer`` run."""
    if VARIANTS[variant].runner == "sft-trainer":
        from .sft_run import SFTTrainerRun

        return SFTTrainerRun(config, dataset, variant, isolated=isolated)
    return VariantRun(config, dataset, variant, isolated=isolated)


def run_variant(config: BenchConfig, dataset: str, variant: str, *, isolated: bool = False) -> dict[str, Any]:
    """Train one variant on one dataset, all steps, and return its measurements (see :class:`VariantRun`)."""
    run = make_run(config, dataset, variant, isolated=isolated)
    while run.steps_left:
        run.step()
    return run.finish()


def _worker_main(spec_path: str, output_path: str, interactive: bool) -> int:
    """The worker: one variant in this (fresh) process; with ``interactive``, one step per ``step`` line on stdin."""
    spec = json.loads(Path(spec_path).read_text())
    config = BenchConfig.from_dict(spec["config"])
    if not interactive:
        result = run_variant(config, spec["dataset"], spec["variant"], isolated=True)
        Path(output_path).write_text(json.dumps(result))
        return 0
    from .lockstep import serve

    return serve(make_run(config, spec["dataset"], spec["variant"], isolated=True), output_path)
