"""Real tokens/s in the training logs of every trainer of this package, and for GRPO/RLOO the time spent generating.

:class:`RealTokensLog` (a mixin of :class:`~trl_padfree.trainer.PadfreeTrainerMixin`, so of every trainer here)
counts, at every training micro-step, the
real (non-padding) tokens of the batch the loss is computed on (:func:`real_tokens`: the tokens TRL itself counts as
``num_tokens``, so a pair's prompt counts twice in DPO and a group's prompt once per completion in GRPO, whatever the
layout forwards) and logs, with every periodic training log, keys consistent with the launch's SFT trainer
(:mod:`trl_padfree.launch.tasks.sft_trainer`, which counts its own):

- ``real_tokens_per_second``: real tokens of all processes per second of training since the previous log
  (evaluation time left out);
- GRPO / RLOO: ``generation_seconds`` (this process's seconds inside TRL's ``_generate`` since the previous log) and
  ``generation_share`` (their share of the training seconds).

The end-of-training metrics get the same over the whole run: ``train_real_tokens``,
``train_real_tokens_per_second`` and, for GRPO / RLOO, ``train_generation_seconds`` and ``train_generation_share``.
"""

from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["RealTokensLog", "real_tokens"]


def real_tokens(inputs: dict[str, Any]) -> int:
    """The real (non-padding) tokens of one batch as a trainer's ``compute_loss`` gets it.

    >>> real_tokens({"num_tokens": 11, "input_ids": torch.ones(1, 9)})   # this package's flat preference rows
    11
    >>> real_tokens({"prompt_mask": torch.tensor([[0, 1, 1]]), "completion_mask": torch.tensor([[1, 1, 0]])})  # GRPO
    4
    >>> real_tokens({"input_ids": torch.ones(2, 4), "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])})
    5
    """
    if "num_tokens" in inputs:
        return int(inputs["num_tokens"])
    if "prompt_mask" in inputs and "completion_mask" in inputs:
        return int(inputs["prompt_mask"].sum()) + int(inputs["completion_mask"].sum())
    if "attention_mask" in inputs:
        return int(inputs["attention_mask"].sum())
    ids = inputs.get("input_ids")
    return int(ids.numel()) if isinstance(ids, torch.Tensor) else 0


class RealTokensLog:
    """Mixin for a TRL trainer (see the module docstring); ``own_token_log = True`` for a trainer that counts its
    own (the launch's SFT trainer)."""

    own_token_log: bool = False
    _rt_start: float | None = None  # start of the current logging interval (None: no training step yet)
    _rt_eval = 0.0  # evaluation seconds inside the current interval
    _rt_tokens = 0  # real tokens of this process in the current interval
    _rt_generation = 0.0  # seconds generating in the current interval
    _rt_seconds = 0.0  # training seconds of all finished intervals
    _rt_total_tokens = 0  # real tokens, all processes, all finished intervals
    _rt_total_generation = 0.0
    _rt_generates = False  # whether this trainer generated (GRPO / RLOO)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        if self._rt_start is None:  # the first step (an evaluation on start does not count)
            self._rt_start, self._rt_eval = time.perf_counter(), 0.0
        return super().training_step(*args, **kwargs)

    def count_real_tokens(self, inputs: dict[str, Any]) -> None:
        """Count a training batch's real tokens (a trainer whose ``compute_loss`` does not reach this mixin's calls
        it itself)."""
        if not self.own_token_log and self.model.training and torch.is_grad_enabled():
            self._rt_tokens += real_tokens(inputs)

    def compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        self.count_real_tokens(inputs)
        return super().compute_loss(model, inputs, *args, **kwargs)

    def _generate(self, *args: Any, **kwargs: Any) -> Any:
        """TRL's GRPO/RLOO generation, timed while training (not in evaluation)."""
        if not self.model.training:
            return super()._generate(*args, **kwargs)
        self._rt_generates = True
        start = time.perf_counter()
        try:
            return super()._generate(*args, **kwargs)
        finally:
            self._rt_generation += time.perf_counter() - start

    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return super().evaluate(*args, **kwargs)
        finally:
            self._rt_eval += time.perf_counter() - start

    def _rt_close_interval(self) -> tuple[int, float, float]:
        """(real tokens of all processes, training seconds, generation seconds) since the previous log."""
        tokens = torch.tensor(float(self._rt_tokens), dtype=torch.float64)
        if self.accelerator.num_processes > 1:
            tokens = self.accelerator.reduce(tokens.to(self.accelerator.device), reduction="sum").cpu()
        now = time.perf_counter()
        seconds = max(0.0, now - (self._rt_start or now) - self._rt_eval)
        generation = self._rt_generation
        self._rt_start, self._rt_eval, self._rt_tokens, self._rt_generation = now, 0.0, 0, 0.0
        self._rt_total_tokens += int(tokens)
        self._rt_seconds += seconds
        self._rt_total_generation += generation
        return int(tokens), seconds, generation

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if not self.own_token_log and "loss" in logs:  # a periodic training log
            tokens, seconds, generation = self._rt_close_interval()
            if seconds > 0:
                logs["real_tokens_per_second"] = round(tokens / seconds, 1)
                if self._rt_generates:
                    logs["generation_seconds"] = round(generation, 3)
                    logs["generation_share"] = round(generation / seconds, 4)
        elif not self.own_token_log and "train_runtime" in logs:  # the end-of-training metrics
            self._rt_close_interval()
            logs["train_real_tokens"] = self._rt_total_tokens
            if self._rt_seconds > 0:
                logs["train_real_tokens_per_second"] = round(self._rt_total_tokens / self._rt_seconds, 1)
                if self._rt_generates:
                    logs["train_generation_seconds"] = round(self._rt_total_generation, 3)
                    logs["train_generation_share"] = round(self._rt_total_generation / self._rt_seconds, 4)
        super().log(logs, *args, **kwargs)
