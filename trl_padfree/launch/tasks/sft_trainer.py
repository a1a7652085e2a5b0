"""``PadfreeSFTTrainer``: the package's ``SFTTrainer`` that also logs, from the training inputs themselves (summed
over all processes), ``real_tokens_per_second`` and ``padding_share`` (the share of a padded batch's tokens that
would be padding) per log, and over the whole run at the end (``train_real_tokens_per_second``,
``train_padding_share``, ``train_real_tokens``, ``train_padded_tokens``)."""

from __future__ import annotations

import time
from typing import Any

import torch

from trl_padfree.trainer import SFTTrainer

__all__ = ["PadfreeSFTTrainer", "batch_token_counts"]


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


class PadfreeSFTTrainer(SFTTrainer):
    """``SFTTrainer`` + token throughput and padding metrics (training time only) in the training logs."""

    own_token_log = True  # (trl_padfree.throughput's counts: this trainer counts its own)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._token_counts = torch.zeros(2, dtype=torch.float64)  # real, padded: this process, since last log
        self._token_totals = torch.zeros(2, dtype=torch.float64)  # all processes, whole run
        self._interval_start: float | None = None  # start of the current logging interval
        self._eval_seconds = 0.0  # evaluation time inside the current interval
        self._train_seconds = 0.0  # training time of all finished intervals
        collator = self.data_collator
        self._pad_multiple = getattr(collator, "pad_to_multiple_of", None) if getattr(collator, "padding_free", False) \
            else None

    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
        real, padded = batch_token_counts(inputs, self._pad_multiple)
        self._token_counts += torch.tensor([real, padded], dtype=torch.float64)
        if self._interval_start is None:  # the first step (an eval on start does not count)
            self._interval_start, self._eval_seconds = time.perf_counter(), 0.0
        return super().training_step(model, inputs, num_items_in_batch)

    def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        start = time.perf_counter()
        try:
            return super().evaluate(*args, **kwargs)
        finally:
            self._eval_seconds += time.perf_counter() - start

    def _close_interval(self) -> tuple[torch.Tensor, float]:
        """Token counts (all processes) and training seconds since the previous log; starts a new interval."""
        counts = self._token_counts
        self._token_counts = torch.zeros(2, dtype=torch.float64)
        if self.accelerator.num_processes > 1:
            counts = self.accelerator.reduce(counts.to(self.accelerator.device), reduction="sum").cpu()
        now = time.perf_counter()
        seconds = max(0.0, now - (self._interval_start or now) - self._eval_seconds)
        self._interval_start, self._eval_seconds = now, 0.0
        self._token_totals += counts
        self._train_seconds += seconds
        return counts, seconds

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:  # a periodic training log
            (real, padded), seconds = self._close_interval()
            if seconds > 0:
                logs["real_tokens_per_second"] = round(float(real) / seconds, 1)
            if padded > 0:
                logs["padding_share"] = round(1.0 - float(real / padded), 4)
        elif "train_runtime" in logs:  # the end-of-training metrics
            self._close_interval()
            real, padded = (float(x) for x in self._token_totals)
            logs["train_real_tokens"] = int(real)
            logs["train_padded_tokens"] = int(padded)
            if self._train_seconds > 0:
                logs["train_real_tokens_per_second"] = round(real / self._train_seconds, 1)
            if padded > 0:
                logs["train_padding_share"] = round(1.0 - real / padded, 4)
        super().log(logs, start_time)
