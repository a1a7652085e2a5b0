"""A variant trained through ``trl.SFTTrainer`` (:class:`SFTTrainerRun`): what a TRL user runs.

The examples become prompt/completion text records (:mod:`.records`); ``SFTTrainer`` prepares them (tokenization,
completion mask, labels), which is checked to give back exactly the benchmark's token ids and completion-only
labels. The trainer sees the same mini-batches in the same order as the other variants (``train_sampling_strategy=
"sequential"``, ``per_device_train_batch_size=batch_size``, ``max_steps`` = the run's steps), the same seeded model
and the same ``AdamW`` (passed in; constant learning rate, no clipping, as in the benchmark's own loop); it logs
every step (that is where the per-step losses come from; nothing is printed). The batch the model receives is
fingerprinted (:func:`~.batches.batch_fingerprint`), so "same mini-batches" is verified.

- ``trl-native``: ``SFTConfig(padding_free=True)`` with TRL's own collator and the model's default attention
  (transformers picks it; on CPU that is sdpa, not the FlashAttention TRL's docs ask for);
- ``sft-padfree``: :class:`trl_padfree.SFTTrainer` (its scored-positions LM head, :mod:`trl_padfree.scored_head`)
  with this project's collator (``response_template=None``: it keeps TRL's labels and flattens),
  ``attn_implementation="padfree"`` and ``SFTConfig(padding_free=False)``; ``sft-padfree-trl-head`` (opt-in): the
  same with ``scored_lm_head=False`` (TRL's fused head).

Timing covers the whole trainer loop, one optimizer step at a time: the trainer runs in a thread that pauses at
the start of every loop iteration (before the dataloader fetches and collates the next batch) until
:meth:`SFTTrainerRun.step` lets it go, so a step's wall time is fetch + collation + forward + backward + gradient
norm + optimizer step + logging + callbacks. ``compute_seconds`` is the part spent in ``training_step`` (forward,
backward) and ``optimizer.step()``; the rest is the trainer's per-step overhead. After training the attention
that really ran is read from the model and the packing probe (:func:`trl_padfree.check_packing`) is run on it with
the variant's own collator.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from typing import Any

from .batches import batch_fingerprint, fixed_batches
from .config import VARIANTS, BenchConfig
from .data import IGNORE_INDEX, completion_start
from .flops import is_varlen, sft_workload
from .records import bench_tokenizer, to_records
from .stepped import SteppedTrainerRun, bench_trainer_class, trainer_arguments
from .training import (
    StepRecords,
    bench_device,
    bench_examples,
    build_model,
    count_targets,
    evaluate,
    make_optimizer,
)


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
                           "examples (a bug in benchmarks.records)")
    if labels != [completion_labels(e) for e in examples]:
        raise RuntimeError(f"SFTTrainer's {split} labels are not the completion-only labels of the examples")


class SFTTrainerRun(SteppedTrainerRun):
    """One ``sft-trainer`` variant on one dataset; the same interface as :class:`~.worker.VariantRun`."""

    trainer_name = "SFTTrainer"

    def __init__(self, config: BenchConfig, dataset: str, variant: str, *, isolated: bool = False):
        import datasets
        import trl

        from trl_padfree.collator import DataCollatorForCompletionOnlyLM

        self.config, self.dataset, self.variant = config, dataset, variant
        self.spec = spec = VARIANTS[variant]
        self.device = bench_device(config)
        train, evaluation = bench_examples(config, dataset)
        self.total_steps = len(fixed_batches(train, config.batch_size))
        self.records = StepRecords(config.warmup)
        self._tmp = tempfile.TemporaryDirectory(prefix="trl-padfree-bench-sft-")
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
        """Record what the model receives (not counted in the step's time)."""
        start = time.perf_counter()
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
        self._excluded += time.perf_counter() - start

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
