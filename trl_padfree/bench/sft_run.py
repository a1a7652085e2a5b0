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
- ``sft-padfree``: this project's collator (``response_template=None``: it keeps TRL's labels and flattens) with
  ``attn_implementation="padfree"`` and ``SFTConfig(padding_free=False)``.

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
import logging
import queue
import tempfile
import threading
import time
import warnings
from typing import Any

from .batches import batch_fingerprint, fixed_batches
from .config import VARIANTS, BenchConfig
from .data import IGNORE_INDEX, completion_start
from .flops import is_varlen, sft_workload
from .records import bench_tokenizer, to_records
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
                           "examples (a bug in trl_padfree.bench.records)")
    if labels != [completion_labels(e) for e in examples]:
        raise RuntimeError(f"SFTTrainer's {split} labels are not the completion-only labels of the examples")


class _WarningLog(logging.Handler):
    """Collects the warnings TRL and transformers log while the trainer is built."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage().splitlines()[0][:300])


def _trainer_class():
    import trl

    class BenchSFTTrainer(trl.SFTTrainer):
        """``trl.SFTTrainer`` that pauses at the start of every loop iteration and observes each batch."""

        bench_run: SFTTrainerRun

        def get_batch_samples(self, *args: Any, **kwargs: Any):
            self.bench_run._boundary()
            return super().get_batch_samples(*args, **kwargs)

        def training_step(self, model, inputs, *args: Any, **kwargs: Any):
            self.bench_run._observe(inputs)
            synchronize(self.bench_run.device)
            start = time.perf_counter()
            loss = super().training_step(model, inputs, *args, **kwargs)
            synchronize(self.bench_run.device)
            self.bench_run._train_step_seconds = time.perf_counter() - start
            return loss

    return BenchSFTTrainer


def _callback(run: SFTTrainerRun):
    from transformers import TrainerCallback

    class BenchCallback(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kwargs):
            synchronize(run.device)
            run.records.compute_seconds.append(run._train_step_seconds + time.perf_counter() - self.started)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                run.records.losses.append(float(logs["loss"]))

        def on_epoch_end(self, args, state, control, **kwargs):
            run._close_step()

    return BenchCallback()


class SFTTrainerRun:
    """One ``sft-trainer`` variant on one dataset; the same interface as :class:`~.worker.VariantRun`."""

    def __init__(self, config: BenchConfig, dataset: str, variant: str, *, isolated: bool = False):
        import datasets
        import trl
        from transformers import PrinterCallback

        from ..collator import DataCollatorForCompletionOnlyLM

        self.config, self.dataset, self.variant = config, dataset, variant
        self.spec = spec = VARIANTS[variant]
        self.device = bench_device(config)
        train, evaluation = bench_examples(config, dataset)
        self.total_steps = len(fixed_batches(train, config.batch_size))
        self.records = StepRecords(config.warmup)
        self._tmp = tempfile.TemporaryDirectory(prefix="trl-padfree-bench-sft-")
        model = build_model(config, spec.attn_implementation, self.device)
        args = trl.SFTConfig(
            output_dir=self._tmp.name,
            padding_free=spec.collator == "trl",  # TRL's own padding-free path (and TRL's collator)
            max_length=None,  # the examples are already clipped to --max-length; TRL refuses padding_free + max_length
            per_device_train_batch_size=config.batch_size,
            max_steps=self.total_steps,
            train_sampling_strategy="sequential",  # the same mini-batches, in the same order, as the other variants
            learning_rate=config.lr,
            lr_scheduler_type="constant",
            max_grad_norm=0.0,  # no clipping, as in the benchmark's loop (the Trainer still computes the norm)
            activation_checkpointing=False,  # TRL defaults to on; the benchmark's loop has none
            bf16=False,
            fp16=False,  # the model is built in --dtype; no autocast
            logging_steps=1,
            save_strategy="no",
            eval_strategy="no",
            report_to="none",
            disable_tqdm=True,
            use_cpu=self.device.type == "cpu",
            dataloader_pin_memory=self.device.type == "cuda",
            seed=config.seed,
        )
        collator = None
        if spec.collator == "trl-padfree":
            collator = DataCollatorForCompletionOnlyLM(None, padding_free=spec.padding_free)
        log = _WarningLog()
        loggers = [logging.getLogger(name) for name in ("trl", "transformers")]
        for logger in loggers:
            logger.addHandler(log)
        bars = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()  # SFTTrainer's dataset preparation: six bars per variant otherwise
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                trainer = _trainer_class()(
                    model=model,
                    args=args,
                    train_dataset=datasets.Dataset.from_list(to_records(train)),
                    eval_dataset=datasets.Dataset.from_list(to_records(evaluation)),
                    processing_class=bench_tokenizer(config.vocab_size),
                    data_collator=collator,
                    optimizers=(make_optimizer(config, model), None),
                )
        finally:
            for logger in loggers:
                logger.removeHandler(log)
            if bars:
                datasets.enable_progress_bars()
        self.trainer_warnings = log.messages + [str(w.message).splitlines()[0][:300] for w in caught]
        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(_callback(self))
        trainer.bench_run = self
        _check_prepared(trainer.train_dataset, train, "train")
        _check_prepared(trainer.eval_dataset, evaluation, "eval")
        self.trainer, self.model = trainer, model
        self.eval_features = [
            [{"input_ids": e, "labels": completion_labels(e)} for e in batch]
            for batch in fixed_batches(evaluation, config.batch_size)
        ]

        self._go = threading.Semaphore(0)
        self._events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._open: tuple[float, float] | None = None
        self._ready = False
        self._excluded = 0.0
        self._train_step_seconds = 0.0
        self.memory = MemoryMeter(self.device, isolated)
        self.memory.start()
        self._thread = threading.Thread(target=self._train, name=f"bench-{variant}", daemon=True)
        self._thread.start()
        self._wait("ready")

    # --- the trainer thread -------------------------------------------------------------------------------------
    def _train(self) -> None:
        try:
            self.trainer.train()
            self._events.put(("finished", None))
        except BaseException as exc:  # handed to the main thread, which raises it
            self._events.put(("error", exc))

    def _boundary(self) -> None:
        """Start of a loop iteration: close the running step, wait for the next :meth:`step` call."""
        self._close_step()
        if not self._ready:
            self._ready = True
            self._events.put(("ready", None))
        if len(self.records.step_seconds) >= self.total_steps:
            return  # never wait for a step that will not be asked for
        self._go.acquire()
        self._excluded = 0.0
        self._open = (time.perf_counter(), time.process_time())

    def _close_step(self) -> None:
        if self._open is None:
            return
        synchronize(self.device)
        wall, cpu = time.perf_counter() - self._open[0], time.process_time() - self._open[1]
        self._open = None
        self.records.step_seconds.append(wall - self._excluded)
        self.records.cpu_seconds.append(cpu - self._excluded)
        self._events.put(("step", wall - self._excluded))

    def _observe(self, inputs: dict[str, Any]) -> None:
        """Record what the model receives (not counted in the step's time)."""
        start = time.perf_counter()
        rec = self.records
        rec.fingerprints.append(batch_fingerprint(inputs))
        varlen = is_varlen(self.model.config._attn_implementation)
        rec.workloads.append(dataclasses.asdict(sft_workload(inputs, varlen)))
        mask = inputs.get("attention_mask")
        rec.real_tokens.append(int(inputs["input_ids"].numel() if mask is None else mask.sum()))
        rec.input_tokens.append(int(inputs["input_ids"].numel()))
        rec.target_tokens.append(count_targets(inputs))
        self._excluded += time.perf_counter() - start

    # --- the caller's side ----------------------------------------------------------------------------------------
    def _wait(self, expected: str) -> Any:
        kind, payload = self._events.get()
        if kind == "error":
            raise RuntimeError(f"{self.variant}: SFTTrainer failed: {type(payload).__name__}: {payload}") from payload
        if kind != expected:
            raise RuntimeError(f"{self.variant}: expected {expected!r} from the trainer thread, got {kind!r}")
        return payload

    @property
    def steps_left(self) -> int:
        return self.total_steps - len(self.records.step_seconds)

    def step(self) -> dict[str, Any]:
        """Let the trainer run one whole loop iteration (one optimizer step) and wait for it."""
        if not self.steps_left:
            raise RuntimeError(f"{self.variant}: all {self.total_steps} steps are done")
        self._go.release()
        seconds = self._wait("step")
        return {"step": len(self.records.step_seconds), "seconds": seconds, "loss": self.records.losses[-1]}

    def finish(self) -> dict[str, Any]:
        """Wait for the trainer to end; evaluate; probe the attention that ran; return every measurement."""
        from ..probe import check_packing

        self._wait("finished")
        self._thread.join()
        rec = self.records
        if not (len(rec.losses) == len(rec.compute_seconds) == len(rec.fingerprints) == self.total_steps):
            raise RuntimeError(f"{self.variant}: the trainer ran {len(rec.losses)} logged steps, "
                               f"{len(rec.fingerprints)} batches; expected {self.total_steps}")
        collate = self.trainer.data_collator
        eval_loss, eval_targets = evaluate(self.model, collate, self.eval_features, self.device)
        memory = self.memory.result()
        probe = check_packing(self.model, collate_fn=lambda features: {**collate(features), "use_cache": False})
        self._tmp.cleanup()
        return {
            "dataset": self.dataset,
            "variant": self.variant,
            "runner": "sft-trainer",
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
