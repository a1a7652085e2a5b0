"""One SFT variant's training run, one optimizer step at a time: in this benchmark's own loop (:class:`VariantRun`),
or through ``trl.SFTTrainer`` (:class:`SFTTrainerRun`): what a TRL user runs (docs/benchmark.md, "Variants").

``SFTTrainer`` prepares the examples' prompt/completion records (:func:`~.data.to_records`), checked to give back
exactly the benchmark's token ids and completion-only labels; it sees the same mini-batches in the same order,
the same seeded model and the same ``AdamW`` as the loop, logs every step, and runs in a thread paused before each
loop iteration (:mod:`.stepped`), so a step's wall time is the whole trainer loop iteration; ``compute_seconds``
the part in ``training_step`` and ``optimizer.step()``. After training the attention that really ran is read from
the model and the packing probe (:func:`trl_padfree.check_packing`) is run with the variant's own collator.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from .config import VARIANTS, BenchConfig
from .data import (
    IGNORE_INDEX,
    TEMPLATE_IDS,
    batch_fingerprint,
    bench_tokenizer,
    completion_start,
    fixed_batches,
    to_records,
    token_budget_batches,
)
from .flops import is_varlen, sft_workload
from .stepped import SteppedTrainerRun, bench_trainer_class, trainer_arguments
from .training import (
    MemoryMeter,
    StepRecords,
    bench_device,
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
        train, evaluation = config.examples(dataset, "train"), config.examples(dataset, "eval")
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


def completion_labels(ids: list[int]) -> list[int]:
    """The completion-only labels of an example: -100 up to the end of the response template.

    >>> completion_labels([1, 9, 3, 4, 5, 11, 2])
    [-100, -100, -100, -100, -100, 11, 2]
    """
    end = completion_start(ids)
    return [IGNORE_INDEX] * end + list(ids[end:])


def _check_prepared(prepared: Any, examples: list[list[int]], split: str) -> None:
    """Raise unless SFTTrainer's prepared dataset holds exactly ``examples`` and their completion-only labels."""
    ids, labels = prepared["input_ids"], prepared["labels"]
    if ids != examples:
        raise RuntimeError(f"SFTTrainer tokenized the {split} records into other token ids than the benchmark's "
                           "examples (a bug in benchmarks.data.to_records)")
    if labels != [completion_labels(e) for e in examples]:
        raise RuntimeError(f"SFTTrainer's {split} labels are not the completion-only labels of the examples")


class SFTTrainerRun(SteppedTrainerRun):
    """One ``sft-trainer`` variant on one dataset; the same interface as :class:`VariantRun`."""

    trainer_name = "SFTTrainer"

    def __init__(self, config: BenchConfig, dataset: str, variant: str, *, isolated: bool = False):
        import datasets
        import trl

        from trl_padfree.collator import DataCollatorForCompletionOnlyLM

        self.dataset = dataset
        train, evaluation = config.examples(dataset, "train"), config.examples(dataset, "eval")
        self._setup(config, variant, VARIANTS[variant], len(fixed_batches(train, config.batch_size)))
        spec = self.spec
        model = build_model(config, spec.attn_implementation, self.device)
        args = trl.SFTConfig(
            **trainer_arguments(config, self.device, self._tmp.name, self.total_steps),
            padding_free=spec.collator == "trl",  # TRL's own padding-free path (and TRL's collator)
            max_length=None,  # the examples are already clipped to --max-length; TRL refuses padding_free + max_length
        )
        collator, trainer_class, extra = None, trl.SFTTrainer, {}
        if spec.collator == "trl-padfree":
            from trl_padfree.trainer import SFTTrainer

            collator = DataCollatorForCompletionOnlyLM(None, padding_free=spec.padding_free)
            # this project's trainer: its LM head (the probe runs after training; the threads are the bench's)
            trainer_class = SFTTrainer
            extra = dict(check_packing=False, torch_num_threads=None, scored_lm_head=spec.lm_head == "scored")
        trainer = self._build_quietly(lambda: bench_trainer_class(trainer_class)(
            model=model,
            args=args,
            train_dataset=datasets.Dataset.from_list(to_records(train)),
            eval_dataset=datasets.Dataset.from_list(to_records(evaluation)),
            processing_class=bench_tokenizer(config.vocab_size),
            data_collator=collator,
            optimizers=(make_optimizer(config, model), None),
            **extra,
        ))
        _check_prepared(trainer.train_dataset, train, "train")
        _check_prepared(trainer.eval_dataset, evaluation, "eval")
        self.eval_features = [
            [{"input_ids": e, "labels": completion_labels(e)} for e in batch]
            for batch in fixed_batches(evaluation, config.batch_size)
        ]

        self._start(trainer, model, isolated)

    def _head_scores_targets_only(self) -> bool:
        """Whether the LM head projects only the trained positions: this project's scored head, or TRL's fused head
        on CUDA/XPU with Triton (elsewhere TRL's head projects every position)."""
        from trl_padfree.scored_head import scored_head_unavailable, trl_head_is_compact

        if self.spec.collator == "trl-padfree" and self.spec.lm_head == "scored" and scored_head_unavailable() is None:
            return True

        return trl_head_is_compact(self.device)

    def _observe(self, inputs: dict[str, Any]) -> None:
        rec = self.records
        rec.fingerprints.append(batch_fingerprint(inputs))
        varlen = is_varlen(self.model.config._attn_implementation)
        work = sft_workload(inputs, varlen)
        if self._head_scores_targets_only():
            work = dataclasses.replace(work, head_slots=count_targets(inputs))
        rec.workloads.append(dataclasses.asdict(work))
        mask = inputs.get("attention_mask")
        rec.real_tokens.append(int(inputs["input_ids"].numel() if mask is None else mask.sum()))
        rec.input_tokens.append(int(inputs["input_ids"].numel()))
        rec.target_tokens.append(count_targets(inputs))

    def finish(self) -> dict[str, Any]:
        """Wait for the trainer to end; evaluate; probe the attention that ran; return every measurement."""
        from trl_padfree.probe import check_packing

        self._finished()
        rec = self.records
        collate = self.trainer.data_collator
        eval_loss, eval_targets = evaluate(self.model, collate, self.eval_features, self.device)
        memory = self.memory.result()
        probe = check_packing(self.model, collate_fn=lambda features: {**collate(features), "use_cache": False})
        self._tmp.cleanup()
        return {
            "dataset": self.dataset,
            "variant": self.variant,
            "runner": "sft-trainer",
            "lm_head": getattr(self.trainer, "lm_head_state", None) or "trl: trl.SFTTrainer",
            "attn_implementation": self.model.config._attn_implementation,
            "attn_requested": self.spec.attn_implementation or "model default",
            "padding_free": self.spec.padding_free,
            "sft_config_padding_free": bool(self.trainer.args.padding_free),
            "collator": f"{type(collate).__module__}.{type(collate).__qualname__}",
            "batching": self.spec.batching,
            "max_tokens": None,
            **rec.summary(self.memory.cuda),
            "eval_loss": eval_loss,
            "eval_target_tokens": eval_targets,
            **memory,
            "probe": {k: probe.to_dict()[k] for k in ("status", "max_abs_diff", "tolerance", "advice")},
            "trainer_warnings": self.trainer_warnings,
        }
