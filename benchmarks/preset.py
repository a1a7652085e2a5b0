"""One preset dataclass for every trainer task (SFT, DPO): what variants run, on what Llama, how many steps, with
which optimizer, on which device, and its command-line options; each task's config adds its own fields and checks
(:mod:`.config`, :mod:`.dpo`)."""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .cli import add_output, csv

DTYPES = ("float32", "bfloat16", "float16")
MODEL_KEYS = ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab_size")

MODEL_PRESETS: dict[str, dict[str, int]] = {
    # The CPU target model: 4 layers x 256 hidden, 8 heads / 4 kv heads.
    "tiny": dict(layers=4, hidden=256, intermediate=688, heads=8, kv_heads=4, vocab_size=2048),
    # ~0.5B parameters (Llama-2-style 32k vocabulary, head dim 128, GQA 5:1) for a one-shot GPU run.
    "0.5b": dict(layers=24, hidden=1280, intermediate=3456, heads=10, kv_heads=2, vocab_size=32000),
    # The shape of the real model of `make demo-real` (SmolLM2-135M-Instruct: scripts/real_model.py), random
    # weights; the benchmark's Llama keeps its own LM head (untied), so 163M parameters instead of 134.5M.
    "smollm2-135m": dict(layers=30, hidden=576, intermediate=1536, heads=9, kv_heads=3, vocab_size=49152),
}


@dataclass
class Preset:
    """The fields every trainer task shares (also the worker's input, as JSON). ``VARIANTS``: the task's variants
    by name; ``KIND`` names them in errors; ``MIN_VOCAB``: the smallest vocabulary its data fits."""

    VARIANTS: ClassVar[dict[str, Any]] = {}
    KIND: ClassVar[str] = ""
    MIN_VOCAB: ClassVar[int] = 16

    variants: list[str] = field(default_factory=list)
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
    lr: float = 5e-4
    seed: int = 0
    dtype: str = "float32"
    device: str = "cpu"
    threads: int = 0
    length_scale: float = 1.0
    max_length: int = 2048
    subprocess: bool = True
    loss_rtol: float | None = None

    @classmethod
    def add_options(cls, p: argparse.ArgumentParser, **helps: str) -> None:
        """The options of the preset (defaults from ``cls()``); ``helps``: the task's words for ``batch``, ``seed``,
        ``length_scale``, ``max_length``, ``loss_rtol``, ``in_process`` and ``name`` (and a ``variants`` note)."""
        d = cls()
        p.add_argument("--variants", type=csv, default=",".join(d.variants),
                       help=f"comma list of {', '.join(cls.VARIANTS)}{helps.get('variants', '')}")
        p.add_argument("--model-size", choices=list(MODEL_PRESETS), default="tiny",
                       help="model preset; --layers/--hidden/... override single values")
        for flag in ("layers", "hidden", "intermediate", "heads", "kv-heads", "vocab-size"):
            p.add_argument(f"--{flag}", type=int, default=None, help="override the preset's value")
        p.add_argument("--batch-size", type=int, default=d.batch_size, help=helps["batch"])
        p.add_argument("--steps", type=int, default=d.steps, help="timed optimizer steps")
        p.add_argument("--warmup", type=int, default=d.warmup, help="optimizer steps trained before timing starts")
        p.add_argument("--lr", type=float, default=d.lr, help="AdamW learning rate (constant)")
        p.add_argument("--seed", type=int, default=d.seed, help=helps["seed"])
        p.add_argument("--dtype", choices=DTYPES, default=d.dtype, help="model/optimizer dtype")
        p.add_argument("--device", default=d.device, help="cpu, cuda or cuda:N")
        p.add_argument("--threads", type=int, default=d.threads,
                       help="torch threads per worker (0: torch's default)")
        p.add_argument("--length-scale", type=float, default=d.length_scale, help=helps["length_scale"])
        p.add_argument("--max-length", type=int, default=d.max_length, help=helps["max_length"])
        p.add_argument("--loss-rtol", type=float, default=None, help=helps["loss_rtol"])
        p.add_argument("--in-process", action="store_true", help=helps["in_process"])
        add_output(p, helps["name"])

    @staticmethod
    def values(args: argparse.Namespace) -> dict[str, Any]:
        """The preset's fields from parsed :meth:`add_options` options (model preset first, then overrides)."""
        model = dict(MODEL_PRESETS[args.model_size])
        for key in model:
            if getattr(args, key) is not None:
                model[key] = getattr(args, key)
        return dict(variants=args.variants, model_size=args.model_size, **model, batch_size=args.batch_size,
                    steps=args.steps, warmup=args.warmup, lr=args.lr, seed=args.seed, dtype=args.dtype,
                    device=args.device, threads=args.threads, length_scale=args.length_scale,
                    max_length=args.max_length, subprocess=not args.in_process, loss_rtol=args.loss_rtol)

    @property
    def model(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in MODEL_KEYS}

    def positive(self) -> dict[str, int]:
        """The integer options that must be >= 1."""
        return {k: getattr(self, k) for k in (*MODEL_KEYS[:5], "batch_size", "steps")}

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad option and how to fix it."""
        for name in self.variants:
            if name not in self.VARIANTS:
                raise ValueError(f"unknown {self.KIND}variant {name!r} in --variants; choose from "
                                 f"{', '.join(self.VARIANTS)}")
        if not self.variants:
            raise ValueError(f"--variants must name at least one of {', '.join(self.VARIANTS)}")
        for name, value in self.positive().items():
            if value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if self.warmup < 0:
            raise ValueError(f"--warmup must be >= 0, got {self.warmup}")
        if self.threads < 0:
            raise ValueError(f"--threads must be >= 0 (0: torch's default), got {self.threads}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"--lr must be a finite number > 0, got {self.lr}")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(
                f"--hidden ({self.hidden}) must be divisible by --heads ({self.heads}) and --heads by --kv-heads "
                f"({self.kv_heads}); e.g. --hidden 256 --heads 8 --kv-heads 4"
            )
        if self.vocab_size < self.MIN_VOCAB:
            raise ValueError(f"--vocab-size must be >= {self.MIN_VOCAB}, got {self.vocab_size}")
        if not (self.length_scale > 0 and math.isfinite(self.length_scale)):
            raise ValueError(f"--length-scale must be a finite number > 0, got {self.length_scale}")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not (self.device == "cpu" or self.device == "cuda" or self.device.startswith("cuda:")):
            raise ValueError(f"--device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.loss_rtol is not None and not self.loss_rtol > 0:
            raise ValueError(f"--loss-rtol must be > 0, got {self.loss_rtol}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        return cls(**data)

    def parameter_count(self) -> int:
        """Parameters of the Llama this config builds (untied embeddings).

        >>> Preset().parameter_count()
        3950848
        >>> round(Preset(**MODEL_PRESETS["0.5b"]).parameter_count() / 1e9, 2)
        0.49
        """
        head_dim = self.hidden // self.heads
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_heads * head_dim
        per_layer = attention + 3 * self.hidden * self.intermediate + 2 * self.hidden
        return self.layers * per_layer + 2 * self.vocab_size * self.hidden + self.hidden


def fmt_params(n: int) -> str:
    """
    >>> fmt_params(3_167_488), fmt_params(494_832_640), fmt_params(41_000)
    ('3.17M', '0.49B', '41.0k')
    """
    if n >= 1e9 * 0.1:
        return f"{n / 1e9:.2f}B"
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k"
