"""A real TRL trainer driven one optimizer step at a time: the common part of the bench's trainer variants.

``SFTTrainer`` (:mod:`.sft_run`) and ``DPOTrainer`` (:mod:`.dpo`) variants run their whole ``Trainer.train()`` loop
in a thread that pauses before the dataloader fetches each batch; :meth:`SteppedTrainerRun.step` lets it run one
loop iteration (fetch + collation, forward/backward, optimizer, logging, callbacks) and returns its time. So the
variants of a benchmark can be trained in lockstep (step i of each, then step i+1), the load of a shared machine
hitting them alike. A subclass builds its trainer, then calls :meth:`SteppedTrainerRun._start`; it observes each
batch in ``_observe`` (time excluded from the step) and collects its results in ``finish``.
"""

from __future__ import annotations

import logging
import queue
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from .training import MemoryMeter, StepRecords, bench_device, synchronize

__all__ = ["SteppedTrainerRun", "bench_callback", "bench_trainer_class", "trainer_arguments"]


def trainer_arguments(config: Any, device: Any, output_dir: str, total_steps: int) -> dict[str, Any]:
    """The ``TrainingArguments`` every trainer variant shares: ``batch_size`` per step, the same batches in the same
    order (sequential sampling), AdamW at a constant ``lr`` without clipping (the Trainer still computes the norm),
    no activation checkpointing (TRL defaults to on; the benchmark's loop has none), the model in its own
    ``--dtype`` (no autocast), a log every step, nothing saved or evaluated."""
    return dict(
        output_dir=output_dir, per_device_train_batch_size=config.batch_size, max_steps=total_steps,
        train_sampling_strategy="sequential", learning_rate=config.lr, lr_scheduler_type="constant",
        max_grad_norm=0.0, activation_checkpointing=False, bf16=False, fp16=False, logging_steps=1,
        save_strategy="no", eval_strategy="no", report_to="none", disable_tqdm=True,
        use_cpu=device.type == "cpu", dataloader_pin_memory=device.type == "cuda", seed=config.seed,
    )


class _WarningLog(logging.Handler):
    """The first line of every message the libraries log while a trainer is built."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage().splitlines()[0][:300])


def bench_trainer_class(base: type) -> type:
    """``base`` (a TRL trainer class) pausing at the start of every loop iteration and observing each batch."""

    class BenchTrainer(base):
        bench_run: SteppedTrainerRun

        def get_batch_samples(self, *args: Any, **kwargs: Any):
            self.bench_run._boundary()
            return super().get_batch_samples(*args, **kwargs)

        def training_step(self, model, inputs, *args: Any, **kwargs: Any):
            start = time.perf_counter()
            self.bench_run._observe(inputs)  # not counted in the step's time
            self.bench_run._excluded += time.perf_counter() - start
            synchronize(self.bench_run.device)
            start = time.perf_counter()
            loss = super().training_step(model, inputs, *args, **kwargs)
            synchronize(self.bench_run.device)
            self.bench_run._train_step_seconds = time.perf_counter() - start
            return loss

    BenchTrainer.__name__ = BenchTrainer.__qualname__ = f"Bench{base.__name__}"
    return BenchTrainer


def bench_callback(run: SteppedTrainerRun) -> Any:
    """The callback that records each step's compute time, loss and logged metrics and closes the last step."""
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
                run.logged.append({k: float(v) for k, v in logs.items() if isinstance(v, int | float)})

        def on_epoch_end(self, args, state, control, **kwargs):
            run._close_step()

    return BenchCallback()


class SteppedTrainerRun:
    """Base of the bench's trainer variants (see the module docstring).

    A subclass calls :meth:`_setup`, builds its trainer with :meth:`_build_quietly`, then calls :meth:`_start`.
    """

    trainer_name = "Trainer"

    def _setup(self, config: Any, variant: str, spec: Any, total_steps: int) -> None:
        """The run's config, variant, device, step count, records and a scratch ``output_dir``."""
        self.config, self.variant, self.spec, self.total_steps = config, variant, spec, total_steps
        self.device = bench_device(config)
        self.records = StepRecords(config.warmup)
        self._tmp = tempfile.TemporaryDirectory(prefix=f"trl-padfree-bench-{self.trainer_name}-")

    def _build_quietly(self, build: Callable[[], Any]) -> Any:
        """``build()`` with the libraries' warnings collected into ``trainer_warnings`` and no dataset bars."""
        import datasets

        log = _WarningLog()
        loggers = [logging.getLogger(name) for name in ("trl", "transformers")]
        for logger in loggers:
            logger.addHandler(log)
        bars = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()  # the trainers' dataset preparation: several bars per variant otherwise
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                trainer = build()
        finally:
            for logger in loggers:
                logger.removeHandler(log)
            if bars:
                datasets.enable_progress_bars()
        self.trainer_warnings = log.messages + [str(w.message).splitlines()[0][:300] for w in caught]
        return trainer

    def _start(self, trainer: Any, model: Any, isolated: bool) -> None:
        """Hook the trainer up and start its thread; returns once it waits before its first batch."""
        from transformers import PrinterCallback

        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(bench_callback(self))
        trainer.bench_run = self
        self.trainer, self.model = trainer, model
        self.logged: list[dict[str, float]] = []
        self._go = threading.Semaphore(0)
        self._events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._open: tuple[float, float] | None = None
        self._ready = False
        self._excluded = 0.0
        self._train_step_seconds = 0.0
        self.memory = MemoryMeter(self.device, isolated)
        self.memory.start()
        self._thread = threading.Thread(target=self._train, name=f"bench-{self.variant}", daemon=True)
        self._thread.start()
        self._wait("ready")

    def _observe(self, inputs: dict[str, Any]) -> None:  # pragma: no cover - every subclass records its batch
        """Record what the model receives (its fingerprint, token counts and workload)."""
        raise NotImplementedError

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

    # --- the caller's side ----------------------------------------------------------------------------------------
    def _wait(self, expected: str) -> Any:
        kind, payload = self._events.get()
        if kind == "error":
            raise RuntimeError(f"{self.variant}: {self.trainer_name} failed: {type(payload).__name__}: {payload}"
                               ) from payload
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

    def _finished(self) -> None:
        """Wait for the trainer thread to end and check that every step was logged and observed."""
        self._wait("finished")
        self._thread.join()
        rec = self.records
        if not (len(rec.losses) == len(rec.compute_seconds) == len(rec.fingerprints) == self.total_steps):
            raise RuntimeError(f"{self.variant}: the trainer ran {len(rec.losses)} logged steps, "
                               f"{len(rec.fingerprints)} batches; expected {self.total_steps}")
