"""What a benchmark run is: the training variants, the model presets and :class:`BenchConfig`."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from .data import DATASETS, FIRST_CONTENT_ID, TEMPLATE_IDS, length_stats, make_examples


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
            from ..batching import TokenBudgetBatchSampler  # noqa: F401
        except ImportError as exc:
            return f"trl_padfree.batching.TokenBudgetBatchSampler does not import here ({exc})"
    if VARIANTS[name].attn_implementation != "flash_attention_2":
        return None
    if not device.startswith("cuda"):
        return f"flash_attention_2 needs a CUDA device (got --device {device})"
    from ..attention_backends import flash_attn_available

    if not flash_attn_available():
        return "the flash-attn package is not installed or does not import (pip install packaging ninja setuptools wheel && pip install --no-build-isolation 'trl-padfree[flash]')"
    return None


MODEL_PRESETS: dict[str, dict[str, int]] = {
    # The CPU target model: 4 layers x 256 hidden, 8 heads / 4 kv heads.
    "tiny": dict(layers=4, hidden=256, intermediate=688, heads=8, kv_heads=4, vocab_size=2048),
    # ~0.5B parameters (Llama-2-style 32k vocabulary, head dim 128, GQA 5:1) for a one-shot GPU run.
    "0.5b": dict(layers=24, hidden=1280, intermediate=3456, heads=10, kv_heads=2, vocab_size=32000),
}


@dataclass
class BenchConfig:
    """Everything that defines a benchmark run (also the worker's input, as JSON)."""

    datasets: list[str] = field(default_factory=lambda: list(DATASETS))
    variants: list[str] = field(default_factory=lambda: [v for v in VARIANTS if v not in OPT_IN])
    model_size: str = "tiny"
    layers: int = 4
    hidden: int = 256
    intermediate: int = 688
    heads: int = 8
    kv_heads: int = 4
    vocab_size: int = 2048
    batch_size: int = 8
    steps: int = 10
    warmup: int = 1
    eval_batches: int = 2
    lr: float = 5e-4
    seed: int = 0
    dtype: str = "float32"
    device: str = "cpu"
    threads: int = 0
    min_length: int = 16
    max_length: int = 2048
    length_scale: float = 1.0
    prompt_fraction: float = 0.7
    repeats: int = 1
    subprocess: bool = True
    schedule: str = "interleaved"
    loss_rtol: float | None = None
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

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad option and how to fix it."""
        for name in self.datasets:
            if name not in DATASETS:
                raise ValueError(f"unknown dataset {name!r} in --datasets; choose from {', '.join(DATASETS)}")
        for name in self.variants:
            if name not in VARIANTS:
                raise ValueError(f"unknown variant {name!r} in --variants; choose from {', '.join(VARIANTS)}")
        if not self.datasets or not self.variants:
            raise ValueError("--datasets and --variants must each name at least one entry")
        positive = dict(layers=self.layers, hidden=self.hidden, intermediate=self.intermediate, heads=self.heads,
                        kv_heads=self.kv_heads, batch_size=self.batch_size, steps=self.steps,
                        eval_batches=self.eval_batches, repeats=self.repeats)
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if self.warmup < 0:
            raise ValueError(f"--warmup must be >= 0, got {self.warmup}")
        if self.threads < 0:
            raise ValueError(f"--threads must be >= 0 (0: torch's default), got {self.threads}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"--lr must be a finite number > 0, got {self.lr}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"--max-tokens must be >= 1 (or left out for the fixed batches' mean), got "
                             f"{self.max_tokens}")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(
                f"--hidden ({self.hidden}) must be divisible by --heads ({self.heads}) and --heads by --kv-heads "
                f"({self.kv_heads}); e.g. --hidden 256 --heads 8 --kv-heads 4"
            )
        if self.vocab_size < FIRST_CONTENT_ID + 8:
            raise ValueError(f"--vocab-size must be >= {FIRST_CONTENT_ID + 8}, got {self.vocab_size}")
        shortest = len(TEMPLATE_IDS) + 4
        if self.min_length < shortest or self.max_length < self.min_length:
            raise ValueError(
                f"need {shortest} <= --min-length <= --max-length (an example is <bos>, >= 1 prompt token, the "
                f"{len(TEMPLATE_IDS)}-token template, >= 1 completion token, <eos>); got --min-length "
                f"{self.min_length}, --max-length {self.max_length}"
            )
        if not 0.0 < self.prompt_fraction < 1.0:
            raise ValueError(f"--prompt-fraction must be in (0, 1), got {self.prompt_fraction}")
        if self.length_scale <= 0:
            raise ValueError(f"--length-scale must be > 0, got {self.length_scale}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"--dtype must be one of {', '.join(_DTYPES)}, got {self.dtype!r}")
        if not (self.device == "cpu" or self.device == "cuda" or self.device.startswith("cuda:")):
            raise ValueError(f"--device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchConfig:
        return cls(**data)

    def parameter_count(self) -> int:
        """Parameters of the Llama this config builds (untied embeddings).

        >>> BenchConfig().parameter_count()
        3950848
        >>> round(BenchConfig(**MODEL_PRESETS["0.5b"]).parameter_count() / 1e9, 2)
        0.49
        """
        head_dim = self.hidden // self.heads
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_heads * head_dim
        mlp = 3 * self.hidden * self.intermediate
        per_layer = attention + mlp + 2 * self.hidden
        return self.layers * per_layer + 2 * self.vocab_size * self.hidden + self.hidden


_DTYPES = ("float32", "bfloat16", "float16")
SCHEDULES = ("interleaved", "sequential")


def _fmt_params(n: int) -> str:
    """
    >>> _fmt_params(3_167_488), _fmt_params(494_832_640), _fmt_params(41_000)
    ('3.17M', '0.49B', '41.0k')
    """
    if n >= 1e9 * 0.1:
        return f"{n / 1e9:.2f}B"
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k"
