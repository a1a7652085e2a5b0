"""``trl-padfree bench --task dpo``: TRL's padded DPO next to this package's padding-free and prompt-once DPO.

Three variants train the same UltraFeedback-like preference pairs (:mod:`.dpo_data`), in the same mini-batches of
``--batch-size`` pairs, for the same number of optimizer steps, each through a real ``DPOTrainer`` (TRL's dataset
preparation, dataloader, loss, logging every step) with a separate reference model whose forward is part of every
step:

- ``dpo-trl-padded``: ``trl.DPOTrainer`` as TRL 1.16 users run it: ``2B`` rows of prompt + response padded to the
  longest, the model's default attention (sdpa);
- ``dpo-padfree``: ``trl_padfree.DPOTrainer`` with ``DPOConfig(padding_free=True)``: the ``2B`` sequences in one
  row, ``attn_implementation="padfree"``;
- ``dpo-prompt-once``: the same with ``prompt_once=True``: each pair's prompt computed once.

Policy and reference start from the same seeded weights; AdamW with a constant learning rate, no clipping,
``sigmoid`` loss with ``--beta``. Each variant runs in a fresh worker process, all trained in lockstep. Every batch
the model receives is fingerprinted and its matmul FLOPs are counted from its layout, so "same pairs in the same
batches" is checked and the workload's FLOP ratio is printed next to each measured ratio.

Reported: real tokens/s (each prompt counted twice, as TRL counts them), forwarded token slots/s, the median step
time, peak memory, every step's loss side by side. Targets (CPU, float32, one thread, tiny Llama, batch 8, >= 6
timed steps, workers): padding-free and prompt-once real tokens/s >= 85% of their FLOP ratio over TRL's padded DPO,
peak memory below it, and TRL's logged logps and the per-step losses equal to its (relative 1e-5 and 1e-3 in
float32) with identical batches (docs/dpo-bench.md). Exit 1 when a judged target fails, 2 on bad options.

    trl-padfree bench --task dpo --threads 1
    trl-padfree bench --task dpo --length-scale 0.25 --steps 2 --warmup 0   # a quick look
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .data import bench_tokenizer
from .dpo_data import (
    batch_pairs,
    batch_workload,
    make_pairs,
    pair_stats,
    pairs_fingerprint,
    to_records,
)
from .preset import Preset
from .report import finish_report, new_report, run_and_report
from .runner import run_variants
from .stepped import SteppedTrainerRun, bench_trainer_class, trainer_arguments
from .training import build_model


@dataclass(frozen=True)
class DPOVariant:
    name: str
    label: str
    padding_free: bool
    prompt_once: bool
    attn_implementation: str | None  # None: the model's default (sdpa for Llama)


DPO_VARIANTS: dict[str, DPOVariant] = {
    v.name: v
    for v in (
        DPOVariant("dpo-trl-padded", "trl.DPOTrainer, padded (TRL 1.16 as users run it), sdpa", False, False, None),
        DPOVariant("dpo-padfree", 'trl_padfree.DPOTrainer, DPOConfig(padding_free=True), "padfree"', True, False,
                   "padfree"),
        DPOVariant("dpo-prompt-once", 'trl_padfree.DPOTrainer, padding_free + prompt_once=True, "padfree"', True,
                   True, "padfree"),
    )
}


@dataclass
class DPOBenchConfig(Preset):
    """Everything that defines a DPO benchmark run: the :class:`~.preset.Preset` and DPO's ``beta``."""

    VARIANTS: ClassVar[dict[str, DPOVariant]] = DPO_VARIANTS
    KIND: ClassVar[str] = "DPO "

    variants: list[str] = field(default_factory=lambda: list(DPO_VARIANTS))
    steps: int = 6
    lr: float = 1e-4
    max_length: int = 1024
    beta: float = 0.1

    @property
    def effective_loss_rtol(self) -> float:
        """Tolerance of the per-step losses: the DPO loss is a function of the margin, a difference of four
        per-sequence log-prob sums of ~1,000-3,000 nats each at these lengths, whose float32 resolution (ulp
        1.2-2.4e-4) alone moves the loss by ~1e-4 relative; so 1e-3 in float32 (5e-2 in half precision)."""
        if self.loss_rtol is not None:
            return self.loss_rtol
        return 1e-3 if self.dtype == "float32" else 5e-2

    @property
    def logps_rtol(self) -> float:
        """Tolerance of the logged per-sequence log-prob sums (``logps/chosen``, ``logps/rejected``)."""
        return 1e-5 if self.dtype == "float32" else 1e-2

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad option and how to fix it."""
        super().validate()
        if not (self.beta > 0 and math.isfinite(self.beta)):
            raise ValueError(f"--beta must be a finite number > 0, got {self.beta}")
        if self.max_length < 2:
            raise ValueError(f"--max-length must be >= 2 (a part is at least 2 tokens), got {self.max_length}")

    def pairs(self) -> list[dict[str, list[int]]]:
        """The seeded train pairs: ``(warmup + steps) * batch_size``, the same in every process."""
        return make_pairs((self.warmup + self.steps) * self.batch_size, vocab_size=self.vocab_size, seed=self.seed,
                          length_scale=self.length_scale, max_length=self.max_length)


class DPOTrainerRun(SteppedTrainerRun):
    """One DPO variant: its ``DPOTrainer`` trained one optimizer step per :meth:`step` (the trainer runs in a
    thread that pauses before the dataloader fetches each batch, so a step's time is the whole loop iteration:
    fetch + collation, policy forward/backward, reference forward, loss, optimizer, logging, callbacks)."""

    trainer_name = "DPOTrainer"

    def __init__(self, config: DPOBenchConfig, variant: str, *, isolated: bool = False):
        import datasets
        import trl

        import trl_padfree

        spec = DPO_VARIANTS[variant]
        pairs = config.pairs()
        self._setup(config, variant, spec, len(pairs) // config.batch_size)
        policy = build_model(config, spec.attn_implementation, self.device, positions=2 * config.max_length)
        reference = build_model(config, spec.attn_implementation, self.device, positions=2 * config.max_length)
        args = trl.DPOConfig(
            **trainer_arguments(config, self.device, self._tmp.name, self.total_steps),
            padding_free=spec.padding_free,
            max_length=None,  # the pairs are already clipped per part (--max-length); no truncation
            beta=config.beta,
            loss_type="sigmoid",
            gradient_checkpointing=False,
            dataloader_num_workers=0,
        )
        base = trl_padfree.DPOTrainer if spec.padding_free else trl.DPOTrainer
        extra = {"prompt_once": spec.prompt_once} if spec.padding_free else {}
        trainer = self._build_quietly(lambda: bench_trainer_class(base)(
            policy, reference, args=args, train_dataset=datasets.Dataset.from_list(to_records(pairs)),
            processing_class=bench_tokenizer(config.vocab_size), **extra,
        ))
        prepared = trainer.train_dataset
        for key in ("prompt", "chosen", "rejected"):
            if prepared[f"{key}_ids"] != [p[key] for p in pairs]:
                raise RuntimeError(f"DPOTrainer tokenized the {key} texts into other ids than the benchmark's pairs")
        self._start(trainer, policy, isolated)

    def _observe(self, inputs: dict[str, Any]) -> None:
        pairs = batch_pairs(inputs)
        work = batch_workload(inputs, scored_head=getattr(self.trainer, "lm_head_state", None) == "scored")
        rec = self.records
        rec.fingerprints.append(pairs_fingerprint(pairs))
        rec.real_tokens.append(sum(2 * len(p) + len(c) + len(r) for p, c, r in pairs))
        rec.input_tokens.append(work.slots)
        rec.target_tokens.append(sum(len(c) + len(r) for _, c, r in pairs))
        rec.workloads.append(dataclasses.asdict(work))

    def finish(self) -> dict[str, Any]:
        self._finished()
        rec = self.records
        memory = self.memory.result()
        summary = rec.summary(self.memory.cuda)
        timed = slice(self.config.warmup, None)
        probe = [
            {"max_abs_diff": r.max_abs_diff, "tolerance": r.tolerance, "attn": r.attn_implementation}
            for cb in self.trainer.callback_handler.callbacks for r in getattr(cb, "reports", [])
        ]
        self._tmp.cleanup()
        return {
            "variant": self.variant,
            "trainer": f"{type(self.trainer).__mro__[1].__module__}.{type(self.trainer).__mro__[1].__qualname__}",
            "attn_implementation": self.model.config._attn_implementation,
            "padding_free": self.spec.padding_free,
            "prompt_once": self.spec.prompt_once,
            **summary,
            "forwarded_tokens_per_second": sum(rec.input_tokens[timed]) / summary["timed_seconds"],
            "logged": self.logged,
            "probe": probe,
            "trainer_warnings": self.trainer_warnings,
            **memory,
        }


def make_run(config: DPOBenchConfig, dataset: None, variant: str, *, isolated: bool = False) -> DPOTrainerRun:
    return DPOTrainerRun(config, variant, isolated=isolated)


def config_from_dict(values: dict[str, Any]) -> DPOBenchConfig:
    return DPOBenchConfig(**values)


def run_dpo_benchmark(config: DPOBenchConfig, log=print) -> dict[str, Any]:
    """Run every variant (workers in lockstep, or in this process one after the other) and return the report."""
    from .dpo_report import compare, evaluate_targets

    config.validate()
    pairs = config.pairs()
    report = new_report("trl-padfree: DPO, TRL's padded DPOTrainer vs padding-free vs prompt-once (same pairs, same "
                        "batches, same steps; reference forward in every step)", config,
                        loss_rtol=config.effective_loss_rtol, logps_rtol=config.logps_rtol)
    report.update(task="dpo", length_stats=pair_stats(pairs, config.batch_size, config.warmup))
    s = report["length_stats"]
    log(f"UltraFeedback-like pairs (x{config.length_scale:g}): prompt mean {s['prompt']['mean']:.0f}, chosen "
        f"{s['chosen']['mean']:.0f}, rejected {s['rejected']['mean']:.0f} tokens; {s['trl_tokens_per_step']:.0f} "
        "TRL tokens per step (prompt counted twice)")
    started = time.perf_counter()
    results = run_variants(sys.modules[__name__], config, config.variants,
                           "interleaved" if config.subprocess else "in-process")
    report["wall_seconds"] = time.perf_counter() - started
    for name, res in results.items():
        log(f"  {name:<16} {res['tokens_per_second']:>9,.0f} real tok/s, {res['forwarded_tokens_per_second']:>9,.0f} "
            f"forwarded tok/s, peak {res['peak_memory_mb']:,.0f} MB, "
            f"{res['median_step_seconds'] * 1000:,.0f} ms/step, final loss {res['train_loss'][-1]:.6f}")
    report["variants"] = {name: results[name] for name in config.variants}
    report["comparison"] = compare(report)
    return finish_report(report, evaluate_targets)


# ---- command line ------------------------------------------------------------------------------------------------
def add_options(p: argparse.ArgumentParser, task: str) -> None:
    DPOBenchConfig.add_options(
        p, batch="preference pairs per optimizer step", seed="seed of the pairs and of the initial weights",
        length_scale="multiply every prompt and response length (keeps the distributions' shape)",
        max_length="each prompt, chosen and rejected is clipped to this many tokens",
        loss_rtol="tolerance of the per-step loss target (default 1e-3 in float32, 5e-2 in half precision: see "
        "DPOBenchConfig.effective_loss_rtol)",
        in_process="run the variants in this process, one after the other (CPU peak memory not judged)",
        name="output file stem (default: dpo-<device type>)")
    p.add_argument("--beta", type=float, default=DPOBenchConfig.beta, help="DPO beta (sigmoid loss)")


def main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``trl-padfree bench --task dpo``: run, write JSON/Markdown/PNG, print the tables and the targets."""
    from .dpo_report import to_markdown
    from .plot import plot_dpo

    config = DPOBenchConfig(**DPOBenchConfig.values(args), beta=args.beta)
    return run_and_report(parser, args, config, run_dpo_benchmark, to_markdown, plot_dpo,
                          stem=f"dpo-{config.device.split(':')[0]}", unit=" pairs")
