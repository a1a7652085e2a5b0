"""What an SFT benchmark run is: the training variants and :class:`BenchConfig` (on :class:`~.preset.Preset`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from .data import DATASETS, FIRST_CONTENT_ID, TEMPLATE_IDS, length_stats, make_examples
from .preset import MODEL_PRESETS as MODEL_PRESETS
from .preset import Preset


@dataclass(frozen=True)
class Variant:
    """One way of training: batch layout, attention implementation, training loop, collator and batching.

    ``attn_implementation=None``: the model's own default (what transformers picks, sdpa for Llama).
    ``runner``: ``"loop"`` (this benchmark's loop: collate, ``model(**batch).loss``, backward, AdamW step) or
    ``"sft-trainer"`` (``trl.SFTTrainer`` on prompt/completion records: its dataset preparation, dataloader,
    loss, logging every step). ``collator``: ``"trl-padfree"`` (this project's) or ``"trl"`` (TRL's own, chosen by
    ``SFTConfig(padding_free=True)``). ``batching``: ``"fixed"`` (``batch_size`` examples per step) or
    ``"token-budget"`` (whole examples up to a token budget per step; a different number of steps). ``lm_head``
    (``sft-trainer`` runner with this project's collator): ``"scored"`` (:class:`trl_padfree.SFTTrainer`, whose
    scored-positions head projects only the completion positions) or ``"trl"`` (the same trainer with
    ``scored_lm_head=False``: TRL's fused head, every position on a CPU).
    """

    name: str
    padding_free: bool
    attn_implementation: str | None
    label: str
    runner: str = "loop"
    collator: str = "trl-padfree"
    batching: str = "fixed"
    lm_head: str = "scored"


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("padded-sdpa", False, "sdpa", "padded + sdpa"),
        Variant("packed-sdpa", True, "sdpa", "padding-free + transformers sdpa (block mask)"),
        Variant("packed-padfree", True, "padfree", 'padding-free + "padfree"'),
        Variant("packed-fa2", True, "flash_attention_2", "padding-free + flash_attention_2"),
        Variant("trl-native", True, None, "trl.SFTTrainer, SFTConfig(padding_free=True), TRL's collator, "
                "the model's default attention", runner="sft-trainer", collator="trl"),
        Variant("sft-padfree", True, "padfree", 'trl_padfree.SFTTrainer, this collator, "padfree"',
                runner="sft-trainer"),
        Variant("sft-padfree-trl-head", True, "padfree", 'trl_padfree.SFTTrainer, this collator, "padfree", '
                "TRL's fused LM head (scored_lm_head=False)", runner="sft-trainer", lm_head="trl"),
        Variant("token-budget", True, "padfree", 'padding-free + "padfree", token-budget mini-batches',
                batching="token-budget"),
    )
}
BASELINE = "padded-sdpa"
OPT_IN = ("sft-padfree-trl-head",)
"""Variants run only when ``--variants`` names them (``sft-padfree-trl-head``: ``sft-padfree`` before the
scored-positions LM head, for ``scripts/bench_scored_head.py``)."""


def variant_unavailable(name: str, device: str) -> str | None:
    """Why variant ``name`` cannot run on ``device`` here, or None when it can.

    >>> variant_unavailable("packed-fa2", "cpu")
    'flash_attention_2 needs a CUDA device (got --device cpu)'
    >>> variant_unavailable("packed-padfree", "cpu") is None
    True
    """
    if VARIANTS[name].batching == "token-budget":
        try:
            from trl_padfree.batching import TokenBudgetBatchSampler  # noqa: F401
        except ImportError as exc:
            return f"trl_padfree.batching.TokenBudgetBatchSampler does not import here ({exc})"
    if VARIANTS[name].attn_implementation != "flash_attention_2":
        return None
    if not device.startswith("cuda"):
        return f"flash_attention_2 needs a CUDA device (got --device {device})"
    from trl_padfree.attention_backends import flash_attn_available

    if not flash_attn_available():
        return "the flash-attn package is not installed or does not import (pip install packaging ninja setuptools wheel && pip install --no-build-isolation 'trl-padfree[flash]')"
    return None


@dataclass
class BenchConfig(Preset):
    """Everything that defines an SFT benchmark run: the :class:`~.preset.Preset` and the SFT data's own fields."""

    VARIANTS: ClassVar[dict[str, Variant]] = VARIANTS
    MIN_VOCAB: ClassVar[int] = FIRST_CONTENT_ID + 8

    variants: list[str] = field(default_factory=lambda: [v for v in VARIANTS if v not in OPT_IN])
    datasets: list[str] = field(default_factory=lambda: list(DATASETS))
    eval_batches: int = 2
    min_length: int = 16
    prompt_fraction: float = 0.7
    repeats: int = 1
    schedule: str = "interleaved"
    max_tokens: int | None = None

    def token_budget(self, dataset: str) -> int:
        """Real tokens per mini-batch of the token-budget variant: ``max_tokens``, or by default the mean real
        tokens of this run's fixed mini-batches (warm-up included), rounded, so both cover the same examples with
        batches of the same mean size."""
        if self.max_tokens is not None:
            return self.max_tokens
        return round(self.length_stats(dataset)["mean_batch_tokens"])

    def examples(self, dataset: str, split: str = "train") -> list[list[int]]:
        """The seeded examples of ``dataset``: ``(warmup + steps) * batch_size`` train, ``eval_batches * batch_size``
        eval ones."""
        batches = self.warmup + self.steps if split == "train" else self.eval_batches
        return make_examples(dataset, batches * self.batch_size, split=split, vocab_size=self.vocab_size,
                             seed=self.seed, min_length=self.min_length, max_length=self.max_length,
                             length_scale=self.length_scale, prompt_fraction=self.prompt_fraction)

    def length_stats(self, dataset: str) -> dict[str, float]:
        """:func:`~.data.length_stats` of this run's train examples of ``dataset``."""
        return length_stats([len(e) for e in self.examples(dataset)], self.batch_size, self.warmup)

    @property
    def effective_loss_rtol(self) -> float:
        """The tolerance of the loss-equality target: 1e-5 in float32, 1e-2 in half precision (unless set)."""
        if self.loss_rtol is not None:
            return self.loss_rtol
        return 1e-5 if self.dtype == "float32" else 1e-2

    def positive(self) -> dict[str, int]:
        return {**super().positive(), "eval_batches": self.eval_batches, "repeats": self.repeats}

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad option and how to fix it."""
        for name in self.datasets:
            if name not in DATASETS:
                raise ValueError(f"unknown dataset {name!r} in --datasets; choose from {', '.join(DATASETS)}")
        if not self.datasets:
            raise ValueError("--datasets must name at least one entry")
        super().validate()
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"--max-tokens must be >= 1 (or left out for the fixed batches' mean), got "
                             f"{self.max_tokens}")
        shortest = len(TEMPLATE_IDS) + 4
        if self.min_length < shortest or self.max_length < self.min_length:
            raise ValueError(
                f"need {shortest} <= --min-length <= --max-length (an example is <bos>, >= 1 prompt token, the "
                f"{len(TEMPLATE_IDS)}-token template, >= 1 completion token, <eos>); got --min-length "
                f"{self.min_length}, --max-length {self.max_length}"
            )
        if not 0.0 < self.prompt_fraction < 1.0:
            raise ValueError(f"--prompt-fraction must be in (0, 1), got {self.prompt_fraction}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")


SCHEDULES = ("interleaved", "sequential")
