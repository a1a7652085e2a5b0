"""Real tokens/s in the training logs of every trainer of this package, and for GRPO/RLOO the time spent generating.

:class:`RealTokensLog` (a mixin of :class:`~trl_padfree.trainer.PadfreeTrainerMixin`, so of every trainer here)
counts, at every training micro-step, the
real (non-padding) tokens of the batch the loss is computed on (:func:`real_tokens`: the tokens TRL itself counts as
``num_tokens``, so a pair's prompt counts twice in DPO and a group's prompt once per completion in GRPO, whatever the
layout forwards) and logs, with every periodic training log:

- ``real_tokens_per_second``: real tokens of all processes per second of training since the previous log
  (evaluation time left out);
- with ``count_padding`` (the launch's SFT trainer, whose batches are the completion-only collator's):
  ``padding_share``, the share of a padded batch's tokens that would be padding (:func:`batch_token_counts`);
- GRPO / RLOO: ``generation_seconds`` (this process's seconds inside TRL's ``_generate`` since the previous log) and
  ``generation_share`` (their share of the training seconds).

The end-of-training metrics get the same over the whole run: ``train_real_tokens``,
``train_real_tokens_per_second``, with ``count_padding`` ``train_padded_tokens`` and ``train_padding_share``, and for
GRPO / RLOO ``train_generation_seconds`` and ``train_generation_share``.
"""

from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["RealTokensLog", "batch_token_counts", "real_tokens"]


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


def batch_token_counts(inputs: dict[str, Any], pad_to_multiple_of: int | None = None) -> tuple[int, int]:
    """``(real tokens, tokens of the same examples padded to the longest)`` of one collated batch.

    ``pad_to_multiple_of``: the collator's; a flattened row may then end with a padding segment of its own
    (:func:`trl_padfree.flattening.packed_batch`), which is neither real tokens nor an example, and a padded batch
    would be rounded up to the multiple too.

    >>> import torch
    >>> batch_token_counts({"input_ids": torch.ones(1, 7), "cu_seq_lens_q": torch.tensor([0, 2, 7])})
    (7, 10)
    >>> batch_token_counts({"input_ids": torch.ones(1, 7), "cu_seq_lens_q": torch.tensor([0, 2, 7]), "max_length_q": 5})
    (7, 10)
    >>> batch_token_counts({"input_ids": torch.ones(2, 5), "attention_mask": torch.tensor([[1] * 5, [1, 1, 0, 0, 0]])})
    (7, 10)
    >>> padded_row = {"input_ids": torch.ones(1, 8), "labels": torch.tensor([[-100, 1, 1, -100, 1] + [-100] * 3]),
    ...               "cu_seq_lens_q": torch.tensor([0, 3, 5, 8]), "max_length_q": 3}
    >>> batch_token_counts(padded_row, pad_to_multiple_of=4)   # 2 examples of 5 tokens; padded: 2 x 4
    (5, 8)
    """
    cu = inputs.get("cu_seq_lens_q")
    if cu is not None and pad_to_multiple_of:
        return _flat_counts_without_padding(inputs, cu.reshape(-1), pad_to_multiple_of)
    if cu is not None and isinstance(inputs.get("max_length_q"), int):
        # the collator's flattened row: its segments cover the row, and the longest is given (no device sync per step)
        return int(inputs["input_ids"].numel()), (cu.numel() - 1) * inputs["max_length_q"]
    if cu is not None:
        lengths = torch.diff(cu.reshape(-1))
        return int(lengths.sum()), int(lengths.numel() * lengths.max())
    mask = inputs.get("attention_mask")
    ids = inputs["input_ids"]
    if mask is not None:
        return int(mask.sum()), int(ids.numel())
    return int(ids.numel()), int(ids.numel())


def _flat_counts_without_padding(inputs: dict[str, Any], cu: torch.Tensor, multiple: int) -> tuple[int, int]:
    """:func:`batch_token_counts` of a flattened row whose collator pads it to a ``multiple`` (reads ``cu`` once).

    The last segment is the padding one when it is exactly what rounds the rest up to the multiple and has no
    trained label (a real example of that length with a trained token is not padding).
    """
    bounds = cu.tolist()
    lengths = [b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    rest, last = bounds[-2] if len(bounds) > 1 else 0, lengths[-1] if lengths else 0
    if 0 < last < multiple and last == -rest % multiple and len(lengths) > 1:
        labels = inputs.get("labels")
        if labels is None or not bool(labels.reshape(-1)[rest:].ne(-100).any()):
            lengths.pop()
    width = -(-max(lengths, default=0) // multiple) * multiple
    return sum(lengths), len(lengths) * width


class RealTokensLog:
    """Mixin for a TRL trainer (see the module docstring)."""

    count_padding: bool = False  # also count what a padded batch would have had (batch_token_counts)
    _rt_start: float | None = None  # start of the current logging interval (None: no training step yet)
    _rt_eval = 0.0  # evaluation seconds inside the current interval
    _rt_tokens = (0, 0)  # (real, padded) tokens of this process in the current interval
    _rt_generation = 0.0  # seconds generating in the current interval
    _rt_seconds = 0.0  # training seconds of all finished intervals
    _rt_total_tokens = (0, 0)  # (real, padded) tokens, all processes, all finished intervals
    _rt_total_generation = 0.0
    _rt_generates = False  # whether this trainer generated (GRPO / RLOO)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        if self._rt_start is None:  # the first step (an evaluation on start does not count)
            self._rt_start, self._rt_eval = time.perf_counter(), 0.0
        return super().training_step(*args, **kwargs)

    def count_real_tokens(self, inputs: dict[str, Any]) -> None:
        """Count a training batch's real tokens (a trainer whose ``compute_loss`` does not reach this mixin's calls
        it itself)."""
        if not (self.model.training and torch.is_grad_enabled()):
            return
        if self.count_padding:
            collator = self.data_collator  # its padding segment (pad_to_multiple_of) is neither real nor padded
            multiple = getattr(collator, "pad_to_multiple_of", None) if getattr(collator, "padding_free", False) else None
            real, padded = batch_token_counts(inputs, multiple)
        else:
            real, padded = real_tokens(inputs), 0
        self._rt_tokens = (self._rt_tokens[0] + real, self._rt_tokens[1] + padded)

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

    def _rt_close_interval(self) -> tuple[float, float, float, float]:
        """(real tokens, padded tokens of all processes, training seconds, generation seconds) since the previous
        log."""
        tokens = torch.tensor(self._rt_tokens, dtype=torch.float64)
        if self.accelerator.num_processes > 1:
            tokens = self.accelerator.reduce(tokens.to(self.accelerator.device), reduction="sum").cpu()
        real, padded = (int(n) for n in tokens)
        now = time.perf_counter()
        seconds = max(0.0, now - (self._rt_start or now) - self._rt_eval)
        generation = self._rt_generation
        self._rt_start, self._rt_eval, self._rt_tokens, self._rt_generation = now, 0.0, (0, 0), 0.0
        self._rt_total_tokens = (self._rt_total_tokens[0] + real, self._rt_total_tokens[1] + padded)
        self._rt_seconds += seconds
        self._rt_total_generation += generation
        return real, padded, seconds, generation

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if "loss" in logs or "train_runtime" in logs:  # a periodic training log, or the end-of-training metrics
            real, padded, seconds, generation = self._rt_close_interval()
            prefix = "" if "loss" in logs else "train_"
            if prefix:
                (real, padded), seconds, generation = self._rt_total_tokens, self._rt_seconds, self._rt_total_generation
                logs["train_real_tokens"] = real
                if self.count_padding:
                    logs["train_padded_tokens"] = padded
            if seconds > 0:
                logs[prefix + "real_tokens_per_second"] = round(real / seconds, 1)
                if self._rt_generates:
                    logs[prefix + "generation_seconds"] = round(generation, 3)
                    logs[prefix + "generation_share"] = round(generation / seconds, 4)
            if padded > 0:
                logs[prefix + "padding_share"] = round(1.0 - real / padded, 4)
        super().log(logs, *args, **kwargs)
