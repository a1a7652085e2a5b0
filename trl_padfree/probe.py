"""Probe whether a model keeps padding-free packed examples apart (docs/probe.md).

That depends on the modeling code *and* the attention implementation (OPT under ``sdpa`` lets every packed example
attend to the ones before it, Llama does not), so the probe runs the model: :func:`check_packing` feeds a few random
sequences packed into one row (the collator's batch: ``seq_idx`` and ``cu_seq_lens_*`` included) and each alone,
and compares the logits; :func:`check_layout_packing` does the same for the trainers' layouts (preference pairs, RL
groups, reward pairs). The model runs in train mode with every source of randomness neutralised and restored after,
gradients off. A model that rejects the packed batch gets the verdict ``"error"``; the advice recommends only what
the probe ran and found safe. Tolerance: ``rtol * max|logits alone|`` (:data:`DEFAULT_RTOL` by compute dtype; on
tiny Llama/OPT models rounding noise is relative 3e-7 in fp32 / 3e-3 in bf16, a leak 0.3-0.5).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .attention import ATTN_IMPLEMENTATION, PadfreeAttentionError, counting_calls
from .recurrent import prepare_packed_layers

__all__ = [
    "ALTERNATIVES", "DEFAULT_LENGTHS", "DEFAULT_RTOL", "PackingLeakError", "PackingReport", "LAYOUTS",
    "assert_layout_packing_safe", "assert_packing_safe", "check_layout_packing", "check_packing",
    "first_leaking_module", "layer_kinds", "packed_batch", "training_rtol", "uses_padfree_attention",
]  # fmt: skip

DEFAULT_LENGTHS: tuple[int, ...] = (7, 12, 4, 9)
"""Lengths of the probe's sequences: different, so ``max_length`` and the boundaries matter; 32 tokens."""

DEFAULT_RTOL: dict[torch.dtype, float] = {torch.float64: 1e-4, torch.float32: 1e-4, torch.float16: 1e-2,
                                         torch.bfloat16: 5e-2}
"""Tolerance relative to ``max|logits|``, by compute dtype (see the module docstring for the measurements)."""


def training_rtol(args: Any) -> float | None:
    """The tolerance for a model trained with these ``TrainingArguments`` (accelerate's bf16/fp16 autocast, on CPU
    too, computes in that dtype although the weights are float32), or None to judge by its weights.

    >>> from types import SimpleNamespace
    >>> training_rtol(SimpleNamespace(bf16=True, fp16=False)), training_rtol(SimpleNamespace(bf16=False, fp16=False))
    (0.05, None)
    """
    if getattr(args, "bf16", False):
        return DEFAULT_RTOL[torch.bfloat16]
    if getattr(args, "fp16", False):
        return DEFAULT_RTOL[torch.float16]
    return None


# Attention implementations that take the packed boundaries from cu_seq_lens / position_ids themselves.
_VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3", "padfree", "paged|", "kernels-community/")

# Model types whose sdpa/eager/flex mask is built without position_ids (their modeling files never pass
# position_ids to transformers' masking_utils).
_MASK_IGNORES_POSITION_IDS = frozenset({"opt", "bloom", "mpt", "biogpt", "xglm", "gpt_oss", "granitemoehybrid"})

# Model types whose attention code does not go through transformers' AttentionInterface (so "padfree" and
# flash_attention_2 cannot separate their packed examples either); measured by scripts/probe_families.py.
_OWN_ATTENTION_CODE = frozenset({"bloom", "mpt", "xglm"})

# Model types with state-space / linear-attention / convolution layers that carry state across tokens.
_STATEFUL_LAYERS = frozenset({
    "mamba", "mamba2", "falcon_mamba", "bamba", "jamba", "zamba", "zamba2", "falcon_h1", "nemotron_h",
    "granitemoehybrid", "qwen3_next", "lfm2", "lfm2_moe", "minimax", "kimi_linear", "olmo_hybrid", "recurrent_gemma",
    "rwkv"})  # fmt: skip

# Attribute names of numbers that make a forward pass random in train mode.
_RANDOM_KNOB = re.compile(r"drop|jitter", re.IGNORECASE)

# Attention implementations the probe tries, in this order, when the model's own is not safe: it recommends one only
# when that run is safe (``"padfree"``: varlen, O(T) memory; ``"sdpa"``: transformers' block mask, O(T^2)).
ALTERNATIVES: tuple[str, ...] = ("padfree", "sdpa")

# Module class-name endings of the layers that carry state across tokens, and what transformers 5.24 needs to keep
# packed examples apart in them: their modeling files call these kernels with seq_idx / cu_seqlens, and the torch
# fall-backs raise "can't keep packed sequences apart without <package>" instead (transformers'
# integrations/hub_kernels.py, use_kernel_func_from_hub_with_fallback).
# ("MambaLayer": GraniteMoeHybridMambaLayer; "Mixer": BambaMixer, FalconH1Mixer)
_RECURRENT_KINDS: tuple[tuple[str, str], ...] = (
    ("GatedDeltaNet", "gated delta rule"), ("DeltaAttention", "kimi delta attention"),
    ("ShortConv", "short convolution"), ("MambaMixer", "mamba"), ("Mamba2Mixer", "mamba"), ("MambaLayer", "mamba"),
    ("Mixer", "mamba"))  # fmt: skip
_KERNELS: dict[str, str] = {
    "gated delta rule": "causal-conv1d and flash-linear-attention",
    "kimi delta attention": "causal-conv1d and flash-linear-attention",
    "short convolution": "causal-conv1d", "mamba": "mamba-ssm and causal-conv1d"}  # fmt: skip
_ATTENTION_KINDS = {
    "full_attention": "full attention", "sliding_attention": "sliding-window attention",
    "chunked_attention": "chunked attention", "indexed_attention": "indexed sparse attention",
    "compressed_sparse_attention": "compressed sparse attention",
    "heavily_compressed_attention": "compressed attention",
}  # fmt: skip
_ATTENTION_NAMES = frozenset(_ATTENTION_KINDS.values())


def _text_config(model: nn.Module) -> Any:
    config = getattr(model, "config", None)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _on(batch: Mapping[str, Any], device: torch.device | str | None) -> dict[str, Any]:
    return {k: (v.to(device) if isinstance(v, torch.Tensor) and device is not None else v) for k, v in batch.items()}


def model_sequences(model: nn.Module, lengths: Sequence[int], seed: int) -> list[list[int]]:
    """:func:`random_sequences` in ``model``'s vocabulary, avoiding its pad id."""
    return random_sequences(lengths, model_vocab_size(model), getattr(_text_config(model), "pad_token_id", None), seed)


def layer_kinds(model: nn.Module) -> tuple[str, ...]:
    """The kinds of token-mixing layers of ``model``: attention kinds (from the config's ``layer_types``) and
    attention features that matter for packing, then the recurrent kinds (from the module classes).

    >>> from trl_padfree.testing import tiny_llama
    >>> layer_kinds(tiny_llama())
    ('full attention',)
    """
    text = _text_config(model)
    recurrent: list[str] = []
    attention = False
    for module in model.modules():
        name = type(module).__name__
        kind = next((k for suffix, k in _RECURRENT_KINDS if name.endswith(suffix)), None)
        if kind is not None:
            if kind not in recurrent:
                recurrent.append(kind)
        elif name.endswith("Attention"):
            attention = True
    kinds: list[str] = []
    if attention:
        types = getattr(text, "layer_types", None) or []
        kinds = [_ATTENTION_KINDS[t] for t in dict.fromkeys(types) if t in _ATTENTION_KINDS]
        if not kinds:
            kinds = ["sliding-window attention" if getattr(text, "sliding_window", None) else "full attention"]
        if getattr(text, "attn_logit_softcapping", None):
            kinds.append("logit soft-capping")
        if any(n.endswith("sinks") for n, _ in model.named_parameters()):
            kinds.append("attention sinks")
        if getattr(text, "kv_lora_rank", None):
            kinds.append("multi-head latent attention")
        if getattr(text, "num_kv_shared_layers", 0):
            kinds.append("shared KV layers")
        if getattr(text, "attn_temperature_tuning", False):
            kinds.append("attention temperature tuning")
    return (*kinds, *recurrent)


class PackingLeakError(ValueError):
    """Raised by :func:`assert_packing_safe` when packed examples do not stay apart; ``.report`` has details."""

    def __init__(self, report: PackingReport) -> None:
        super().__init__(str(report))
        self.report = report


@dataclass(frozen=True)
class PackingReport:
    """Outcome of :func:`check_packing` / :func:`check_layout_packing`.

    ``status``: ``"safe"``, ``"leaks"``, ``"error"`` (the packed forward raised: ``error``, and ``inf`` diffs),
    ``"inconclusive"`` (two identical runs differed by ``noise``: randomness the probe cannot remove) or
    ``"unsupported"`` (``"padfree"`` is set but the model's attention code never calls it). ``tolerance`` is
    ``rtol * max|values alone|``; ``dtype`` the compute dtype it was chosen for. ``alternatives``:
    ``attn_implementation -> status`` of the :data:`ALTERNATIVES` tried because this one was not safe.
    """

    ok: bool
    status: str
    max_abs_diff: float
    tolerance: float
    model_type: str
    attn_implementation: str
    advice: str
    dtype: str
    device: str
    lengths: tuple[int, ...]
    example_diffs: tuple[float, ...]
    noise: float
    seconds: float
    error: str | None = None
    layer_kinds: tuple[str, ...] = ()
    alternatives: dict[str, str] = dataclasses.field(default_factory=dict)
    first_leak: str | None = None

    def __str__(self) -> str:
        where = f"{self.model_type} (attn_implementation={self.attn_implementation!r}, {self.dtype} on {self.device})"
        headline = {
            "safe": f"SAFE: {where} keeps packed examples apart.",
            "leaks": f"LEAKS: {where} lets packed examples attend to each other.",
            "error": f"ERROR: {where} rejects the padding-free batch: {self.error}",
            "inconclusive": f"INCONCLUSIVE: {where} is not deterministic in train mode, so the probe cannot tell.",
            "unsupported": f"UNSUPPORTED: {where} never calls this attention implementation"
            + (f" and fails: {self.error}" if self.error else "."),
        }[self.status]
        lines = [headline]
        if self.status not in ("error", "unsupported"):
            per_example = ", ".join(f"{d:.2g}" for d in self.example_diffs)
            lines.append(f"  max |logit diff| packed vs alone: {self.max_abs_diff:.3g} (tolerance {self.tolerance:.3g}; "
                         f"per example: {per_example}; two identical runs differ by {self.noise:.3g})")
        if self.layer_kinds:
            lines.append(f"  layers: {', '.join(self.layer_kinds)}")
        if self.first_leak:
            lines.append(f"  first module that mixes examples: {self.first_leak}")
        if self.alternatives:
            tried = ", ".join(f"{name!r} {status}" for name, status in self.alternatives.items())
            lines.append(f"  also tried: {tried}")
        lines.append(
            f"  {len(self.lengths)} random sequences of lengths {list(self.lengths)}, {self.seconds:.2f}s"
        )
        lines.append(f"  advice: {self.advice}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON dict of the report (``inf`` becomes None)."""
        out = dataclasses.asdict(self)
        out.update({k: list(getattr(self, k)) for k in ("lengths", "example_diffs", "layer_kinds")})
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}


def packed_batch(sequences: Sequence[Sequence[int]], device: torch.device | str | None = None) -> dict[str, Any]:
    """Build the padding-free batch for ``sequences``, in the project collator's format.

    ``input_ids``/``labels``/``position_ids`` (1, T) int64 (first label of every example -100, positions
    restarting at 0), ``seq_idx`` (1, T) int32, ``cu_seq_lens_q/k`` 1-D int32 (N+1), ``max_length_q/k`` ints,
    ``use_cache=False``, no ``attention_mask``. Same tensors as transformers'
    ``DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)`` plus ``use_cache``.

    >>> b = packed_batch([[5, 6, 7], [8, 9]])
    >>> b["position_ids"].tolist(), b["labels"].tolist(), b["cu_seq_lens_q"].tolist(), b["max_length_k"]
    ([[0, 1, 2, 0, 1]], [[-100, 6, 7, -100, 9]], [0, 3, 5], 3)
    >>> b["seq_idx"].tolist(), b["use_cache"], "attention_mask" in b
    ([[0, 0, 0, 1, 1]], False, False)
    """
    if not sequences or any(len(s) == 0 for s in sequences):
        raise ValueError("packed_batch needs at least one sequence and no empty sequence.")
    from .collator import DataCollatorForCompletionOnlyLM  # the real collator: the probe tests what trains

    batch = DataCollatorForCompletionOnlyLM(None, padding_free=True)([{"input_ids": list(s)} for s in sequences])
    return _on(batch, device)


def _input_embeddings(model: nn.Module) -> Any:
    get = getattr(model, "get_input_embeddings", None)
    return get() if callable(get) else None


def _model_device(model: nn.Module) -> torch.device:
    """Device the inputs must go to: the input embeddings' (first shard under a device map), else a parameter's."""
    weight = getattr(_input_embeddings(model), "weight", None)
    if isinstance(weight, torch.Tensor):
        return weight.device
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def probe_setting(model: nn.Module, rtol: float | None) -> tuple[torch.device, torch.dtype, float]:
    """``(device, compute dtype, tolerance)`` of a probe of ``model``: ``rtol``, or the dtype's default."""
    device = _model_device(model)
    if torch.is_autocast_enabled(device.type):  # the lowest floating precision the model computes in
        dtype = torch.get_autocast_dtype(device.type)
    else:
        dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
        order = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
        dtype = next((d for d in order if d in dtypes), torch.float32)
    return device, dtype, DEFAULT_RTOL.get(dtype, 1e-4) if rtol is None else rtol


def model_vocab_size(model: nn.Module) -> int:
    sizes = [getattr(_input_embeddings(model), "num_embeddings", None), getattr(_text_config(model), "vocab_size", None)]
    sizes = [n for n in sizes if isinstance(n, int)]
    if not sizes or min(sizes) < 2:
        raise ValueError("check_packing: cannot tell the model's vocabulary size (no input embeddings, no vocab_size).")
    return min(sizes)


def random_sequences(lengths: Sequence[int], vocab_size: int, pad_id: int | None, seed: int) -> list[list[int]]:
    """Seeded random token ids in ``[0, vocab_size)``, never the pad id (some models treat it specially)."""
    gen = torch.Generator().manual_seed(seed)
    avoid = pad_id if isinstance(pad_id, int) and 0 <= pad_id < vocab_size else None
    high = vocab_size - 1 if avoid is not None else vocab_size
    out = []
    for n in lengths:
        ids = torch.randint(0, high, (n,), generator=gen)
        if avoid is not None:
            ids = ids + (ids >= avoid).long()
        out.append(ids.tolist())
    return out


@contextlib.contextmanager
def deterministic_train_mode(model: nn.Module) -> Iterator[None]:
    """Train mode with dropout/layerdrop/jitter at 0 and the global RNG untouched; everything restored after."""
    changed: list[tuple[Any, str, Any]] = []

    def zero(obj: Any, name: str) -> None:
        value = getattr(obj, name, None)
        if isinstance(value, float | int) and not isinstance(value, bool) and value > 0:
            changed.append((obj, name, value))
            setattr(obj, name, 0.0)

    training = [(m, m.training) for m in model.modules()]
    configs: dict[int, Any] = {}
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            zero(module, "p")
        for name in list(vars(module)):
            if _RANDOM_KNOB.search(name):
                zero(module, name)
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            configs[id(config)] = config
            for sub in vars(config).values():  # sub-configs (text_config, vision_config, ...)
                if hasattr(sub, "to_dict") and hasattr(sub, "model_type"):
                    configs[id(sub)] = sub
    for config in configs.values():
        for name in list(vars(config)):
            if _RANDOM_KNOB.search(name):
                zero(config, name)
    device = _model_device(model)
    rng_devices = [device.index or 0] if device.type == "cuda" else []
    try:
        model.train()
        with torch.random.fork_rng(devices=rng_devices), torch.no_grad(), warnings.catch_warnings():
            # Gradient checkpointing under no_grad warns that no input requires grad: expected here.
            warnings.filterwarnings("ignore", message=".*requires_grad.*")
            torch.manual_seed(0)
            yield
    finally:
        for obj, name, value in reversed(changed):
            setattr(obj, name, value)
        for module, flag in training:
            module.training = flag


def alone_batch(seq: Sequence[int]) -> dict[str, Any]:
    """One example as the padded path sees it: ``attention_mask`` of ones, ``labels``, no cache."""
    ids = torch.tensor([list(seq)], dtype=torch.int64)
    labels = ids.clone()
    labels[0, 0] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels, "use_cache": False}


def probe_logits(model: nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
    # Without labels: TRL 1.8-1.14's default loss (chunked_nll) patches the model's forward to return no logits when
    # labels are given; the logits do not depend on them.
    out = model(**{k: v for k, v in batch.items() if k != "labels"})
    logits = out.logits if hasattr(out, "logits") else out[0]
    return logits.detach().float()[0]


def _report(model: nn.Module, setting: tuple[torch.device, torch.dtype, float], start: float, lengths: Sequence[int],
            expected: Sequence[torch.Tensor], got: Sequence[torch.Tensor] | None, error: str | None = None,
            noise: float = 0.0, bypassed: bool = False, **fields: Any) -> PackingReport:
    """The verdict on ``got[i]`` (packed) against ``expected[i]`` (alone): tolerance ``rtol * max|expected|``,
    ``inf`` diffs where the packed forward failed (``got`` None, ``error``); the advice is the caller's."""
    device, dtype, rtol = setting
    tolerance = rtol * max(e.abs().max().item() for e in expected) + 1e-12 if expected else math.nan
    diffs = ((math.inf,) * len(expected or lengths) if got is None
             else tuple((g - e).abs().max().item() for g, e in zip(got, expected, strict=True)))
    status = ("unsupported" if bypassed else "error" if error is not None else "inconclusive" if noise > tolerance
              else "safe" if max(diffs) <= tolerance else "leaks")
    return PackingReport(
        ok=status == "safe", status=status, max_abs_diff=max(diffs), tolerance=tolerance, model_type=_model_type(model),
        attn_implementation=_attn_name(model), advice="", dtype=str(dtype).removeprefix("torch."), device=str(device),
        lengths=tuple(lengths), example_diffs=diffs, noise=noise, seconds=time.perf_counter() - start, error=error,
        **fields)


def _model_type(model: nn.Module) -> str:
    return str(getattr(getattr(model, "config", None), "model_type", None) or type(model).__name__)


def _attn_name(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    attn = getattr(config, "_attn_implementation", None)
    if isinstance(attn, dict):  # composite configs: the text model's is the one that matters here
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else None
        attn = getattr(text_config, "_attn_implementation", None) or next(iter(attn.values()), None)
    return str(attn) if attn else "unknown"


# Attention features that "padfree" computes itself, or that flash-attn's varlen kernel lacks: where a model has one,
# "padfree" being safe says nothing about flash_attention_2.
_NOT_LIKE_FLASH = frozenset(
    {"attention sinks", "attention temperature tuning", "chunked attention", "shared KV layers"}
)


def _alternative_text(alternative: str | None, kinds: Sequence[str] = ()) -> str | None:
    """How the advice recommends an attention implementation the probe ran on this model and found safe."""
    if alternative is None:
        return None
    text = f'load it with attn_implementation="{alternative}" (the probe ran it on this model: safe)'
    if alternative == ATTN_IMPLEMENTATION and not _NOT_LIKE_FLASH & set(kinds) and not set(_KERNELS) & set(kinds):
        # flash-attn reads the same cu_seq_lens the padfree run was given, for plain attention (recurrent layers are
        # prepared for packed rows by "padfree"'s mask builder, which flash_attention_2 does not run)
        text += ' or "flash_attention_2" on a CUDA GPU with flash-attn'
    return text


def _advice(
    status: str, model_type: str, attn: str, noise: float, cache_off: bool = True,
    model_class: str = "the model", *, kinds: Sequence[str] = (), error: str | None = None,
    alternative: str | None = None,
) -> str:
    """One line: what to do. It recommends an attention implementation only when the probe ran it on this model and
    found it safe (``alternative``), flash-attn only for what flash-attn computes on packed rows, kernel packages
    only by the layers that need them; otherwise ``padding_free=False``.

    >>> _advice("leaks", "gpt_oss", "eager", 0.0, kinds=("full attention", "attention sinks"))
    'gpt_oss builds its eager attention mask without position_ids, so packed examples see each other, and no other attention implementation the probe tried is safe for it; set padding_free=False.'
    """
    use = _alternative_text(alternative, kinds)
    packages = max((_KERNELS[k] for k in kinds if k in _KERNELS), key=len, default=None)  # the kernels they need
    recurrent = [k for k in kinds if k in _KERNELS]
    stateful = bool(recurrent) or model_type in _STATEFUL_LAYERS
    layers = " / ".join(recurrent) if recurrent else "state-space/linear-attention"
    if status == "safe":
        return f"padding_free=True is safe for {model_type} with attn_implementation={attn!r}."
    if status == "inconclusive":
        return (
            f"two identical forward passes differed by {noise:.3g} even with dropout/layerdrop/jitter set to 0; "
            "find the remaining randomness (a custom stochastic module?) or use padding_free=False."
        )
    if status == "leaks" and not cache_off and not attn.startswith(_VARLEN_ATTENTION):
        return (
            "the packed batch does not set use_cache=False, so the model builds a KV cache and transformers "
            "skips its packed-sequence mask (the cache trap); pass use_cache=False with every padding-free "
            "batch (this package's collator does) and re-run the check."
        )
    if status == "unsupported":
        if stateful:
            return (
                f"{model_class} has no attention layer that calls attn_implementation={attn!r}, and its {layers} "
                "layers carry state across packed examples; set padding_free=False."
            )
        return (
            f"{model_class} computes attention in its own code, not through transformers' AttentionInterface, so "
            f"attn_implementation={attn!r} never runs for it; "
            + (use or "load it with attn_implementation='eager' and set padding_free=False (its own attention "
               "cannot keep packed examples apart)") + "."
        )
    if status == "error" and error and "can't keep packed sequences apart without" in error:
        if use:
            return (
                f"{model_type}'s {layers} layers refuse a packed row with attn_implementation={attn!r} (transformers' "
                f"torch fall-back); {use}, or set padding_free=False."
            )
        return (
            f"{model_type}'s {layers} layers keep packed examples apart only with the CUDA kernels of "
            f"{packages or 'the package the error names'} (transformers' torch fall-back refuses a packed row); "
            "install them on a CUDA machine, or set padding_free=False."
        )
    refused = status == "error" and error is not None and error.startswith("PadfreeAttentionError")  # a feature
    if refused and "soft-capping" in error:
        return (
            f"attn_implementation={attn!r} does not compute {model_type}'s attention logit soft-capping; "
            + (use or 'load it with attn_implementation="flash_attention_2" on a CUDA GPU (pip install flash-attn: '
               "it soft-caps packed rows)") + ", or set padding_free=False."
        )
    if refused:
        what = "attention sinks" if "sinks" in error else "attention"
        return (
            f"attn_implementation={attn!r} does not compute {model_type}'s {what}; "
            + (f"{use}, or set padding_free=False." if use else
               "no other attention implementation the probe tried is safe for it; set padding_free=False.")
        )
    if status == "error":
        return (
            f"{model_type}'s forward fails on the padding-free batch (position_ids, cu_seq_lens_*, max_length_*, "
            "seq_idx without attention_mask); "
            + (f"{use}, or set padding_free=False." if use else "set padding_free=False.")
        )
    # leaks
    if stateful:
        return (
            f"{model_type}'s {layers} layers carry state across packed examples (its torch code does not reset "
            "them at seq_idx boundaries), whatever the attention implementation; set padding_free=False."
        )
    if attn.startswith(_VARLEN_ATTENTION):
        why = (
            f"even the varlen attention {attn!r} does not keep {model_type}'s examples apart (its layers do not pass "
            "position_ids/cu_seq_lens through, or compute something from the row position)"
        )
    elif model_type in _OWN_ATTENTION_CODE and not use:
        return (
            f"{model_type} computes attention in its own code, with a mask built without position_ids, and does not "
            "use transformers' attention interface, so no attn_implementation can keep packed examples apart; "
            "set padding_free=False."
        )
    elif model_type in _MASK_IGNORES_POSITION_IDS:
        why = f"{model_type} builds its {attn} attention mask without position_ids, so packed examples see each other"
    else:
        why = f"the {attn} attention of {model_type} does not separate packed examples"
    if use:
        return f"{why}; {use} and re-run `trl-padfree check`, or set padding_free=False."
    return f"{why}, and no other attention implementation the probe tried is safe for it; set padding_free=False."


def error_line(exc: BaseException) -> str:
    """``"Type: first line of the message"``: how a probe reports a forward that failed (the Trainer would too).

    >>> error_line(ValueError("bad shape\\nmore"))
    'ValueError: bad shape'
    """
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def layout_report(
    model: nn.Module, *, expected: Sequence[torch.Tensor], got: Sequence[torch.Tensor] | None,
    error: str | None, setting: tuple[torch.device, torch.dtype, float], lengths: Sequence[int], start: float,
    batch: str, values: str, prompt_once: bool, fix: str,
) -> PackingReport:
    """The report of a layout probe (preference pairs, RL groups, reward pairs): ``got[i]`` is what the packed row
    gives for the sequence whose values alone are ``expected[i]`` (``got`` None where the packed forward failed
    with ``error``); ``batch`` and ``values`` name what was compared ("preference batch", "logits") and ``fix``
    the setting that turns padding-free off."""
    report = _report(model, setting, start, lengths, expected, got, error)
    layout, attn, status = "prompt-once" if prompt_once else "padding-free", _attn_name(model), report.status
    changes = (f"the {layout} {batch} changes this model's {values} (max diff {report.max_abs_diff:.3g} > "
               f"{report.tolerance:.3g})")
    if status == "safe":
        advice = ""
    elif status == "error":  # another attention would meet the same forward: nothing to recommend but the layout off
        advice = f"the {layout} {batch} fails in this model's forward ({error}); set {fix}."
    elif attn == ATTN_IMPLEMENTATION:  # never recommend the implementation that just leaked
        advice = (f"{changes} even with attn_implementation='padfree' (its layers compute something across the "
                  f"row); set {fix}.")
    else:
        flash = "" if prompt_once else " or 'flash_attention_2'"
        advice = (f"{changes}: its attention lets packed sequences see each other. Load it with "
                  f"attn_implementation='padfree'{flash}, or set {fix}.")
    return dataclasses.replace(report, advice=advice)


#: (prompt, chosen, rejected) lengths of the preference probe's pairs: uneven, so every boundary matters.
DEFAULT_PAIRS: tuple[tuple[int, int, int], ...] = ((6, 4, 3), (3, 2, 6), (5, 5, 1))
#: (prompt length, completion lengths) of the RL probe's groups.
DEFAULT_GROUPS: tuple[tuple[int, tuple[int, ...]], ...] = ((5, (3, 1, 4)), (2, (2, 5, 1)), (4, (3,)))
#: (shared prefix, chosen tail, rejected tail) lengths of the reward probe's pairs.
DEFAULT_REWARD_PAIRS: tuple[tuple[int, int, int], ...] = ((6, 4, 3), (3, 2, 6), (5, 5, 1), (1, 3, 2))


def _preference_layout(shapes: Any, vocab: int, pad: int | None, seed: int, prompt_once: bool) -> tuple:
    from .preference import DataCollatorForPreference

    lengths = [n for pair in shapes for n in pair]
    seqs = random_sequences(lengths, vocab, pad, seed)
    examples = [dict(zip(("prompt_ids", "chosen_ids", "rejected_ids"), seqs[3 * i : 3 * i + 3], strict=True))
                for i in range(len(shapes))]
    alone = []
    for ex in examples:  # with prompt_once the rejected segment is [last prompt token] + rejected
        alone += [(ex["prompt_ids"] + ex["chosen_ids"], 0),
                  (ex["prompt_ids"] + ex["rejected_ids"], len(ex["prompt_ids"]) - 1 if prompt_once else 0)]
    bounds = torch.tensor([0, *(len(s) - skip for s, skip in alone)]).cumsum(0).tolist()
    rows = [range(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return DataCollatorForPreference(pad_token_id=0, prompt_once=prompt_once)(examples), alone, rows, lengths


def _group_layout(shapes: Any, vocab: int, pad: int | None, seed: int, prompt_once: bool) -> tuple:
    from .rl_packing import pack_completion_rows

    if not shapes or any(p < 1 or not cs or min(cs) < 1 for p, cs in shapes):
        raise ValueError(f"probe groups need a prompt and completions of at least one token each, got {shapes!r}")
    seqs = iter(random_sequences([n for p, cs in shapes for n in (p, *cs)], vocab, pad, seed))
    per_group = [[(prompt, next(seqs)) for _ in cs] for prompt, cs in ((next(seqs), cs) for _, cs in shapes)]
    # interleaved as TRL's shuffle leaves them: g0c0, g1c0, ..., g0c1, ...
    rows = [g[k] for k in range(max(map(len, per_group))) for g in per_group if k < len(g)]
    p_width, c_width = max(len(p) for p, _ in rows), max(len(c) for _, c in rows)
    ids = torch.full((len(rows), p_width + c_width), pad if isinstance(pad, int) else 0, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, c) in enumerate(rows):  # TRL's padded batch: prompts left-padded, completions right-padded
        ids[i, p_width - len(p) : p_width + len(c)] = torch.tensor(p + c)
        mask[i, p_width - len(p) : p_width + len(c)] = 1
    packed = pack_completion_rows(ids, mask, c_width, prompt_once=prompt_once)
    alone, seen = [], set()
    for prompt, completion in rows:  # a later sibling's segment is [last prompt token] + completion
        alone.append((prompt + completion, len(prompt) - 1 if prompt_once and tuple(prompt) in seen else 0))
        seen.add(tuple(prompt))
    bounds = packed["cu_seq_lens_q"].tolist()
    spans = [range(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return packed, alone, spans, [len(p) + len(c) for p, c in rows]


def _reward_layout(shapes: Any, vocab: int, pad: int | None, seed: int, prompt_once: bool) -> tuple:
    from .reward_layout import DataCollatorForRewardPairs, reward_layout

    lengths = [n for pair in shapes for n in pair]
    seqs = random_sequences(lengths, vocab, pad, seed)
    examples = [{"chosen_ids": seqs[3 * i] + seqs[3 * i + 1], "rejected_ids": seqs[3 * i] + seqs[3 * i + 2]}
                for i in range(len(shapes))]
    batch = DataCollatorForRewardPairs(pad_token_id=pad, prompt_once=prompt_once)(examples)
    alone = [(ex["chosen_ids"], 0) for ex in examples] + [(ex["rejected_ids"], 0) for ex in examples]
    return batch, alone, reward_layout(examples, prompt_once=prompt_once)[1], lengths


#: The layouts :func:`check_layout_packing` probes: (builder, default shapes, what the batch is, values compared,
#: the setting that turns the layout off).
LAYOUTS: dict[str, tuple[Callable[..., tuple], Any, str, str, str]] = {
    "preference": (_preference_layout, DEFAULT_PAIRS, "preference batch", "logits", "DPOConfig(padding_free=False)"),
    "group": (_group_layout, DEFAULT_GROUPS, "GRPO/RLOO batch", "logits", "padding_free=False"),
    "reward": (_reward_layout, DEFAULT_REWARD_PAIRS, "reward batch", "scores", "RewardConfig(padding_free=False)"),
}


def check_layout_packing(model: nn.Module, layout: str, *, prompt_once: bool = False, shapes: Any = None,
                         seed: int = 0, rtol: float | None = None) -> PackingReport:
    """Run random sequences in a trainer's padding-free ``layout`` and each sequence alone; compare every position.

    ``layout`` is one of :data:`LAYOUTS`: ``"preference"`` (DPO/KTO pairs: with ``prompt_once`` the rejected
    response must see its prompt's keys and not the chosen response), ``"group"`` (GRPO/RLOO rows of one prompt,
    interleaved as TRL leaves them: with ``prompt_once`` a later sibling sees its prompt's shared keys and not its
    siblings) or ``"reward"`` (reward pairs: every token's score, read from the ``score`` head). ``shapes``: the
    lengths of the random examples (default from the table). Same tolerance, deterministic train mode and report
    as :func:`check_packing`.

    >>> from trl_padfree.testing import tiny_llama
    >>> check_layout_packing(tiny_llama(vocab_size=64, attn_implementation="padfree"), "group", prompt_once=True).status
    'safe'
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {sorted(LAYOUTS)}, got {layout!r}")
    build, default, batch_name, values, fix = LAYOUTS[layout]
    start = time.perf_counter()
    setting = device, _, _ = probe_setting(model, rtol)
    pad = getattr(_text_config(model), "pad_token_id", None)
    from .preference import MODEL_KEYS

    batch, alone, rows, lengths = build(default if shapes is None else shapes, model_vocab_size(model), pad, seed,
                                        prompt_once)

    def run(inputs: dict[str, Any]) -> torch.Tensor:
        if values == "logits":
            return probe_logits(model, inputs)
        from .reward_layout import scores_of

        return scores_of(model, inputs)[1].detach().float()

    error, got = None, None
    with deterministic_train_mode(model):
        expected = []
        for seq, skip in alone:
            ids = torch.tensor([seq], dtype=torch.int64)
            expected.append(run(_on({"input_ids": ids, "attention_mask": torch.ones_like(ids), "use_cache": False},
                                    device))[skip:])
        try:
            packed = run({**_on({k: v for k, v in batch.items() if k in MODEL_KEYS}, device), "use_cache": False})
            got = [packed[torch.as_tensor(list(r), device=packed.device)] for r in rows]
        except Exception as exc:  # the Trainer would hit the same error: report it
            error = error_line(exc)
    return layout_report(model, expected=expected, got=got, error=error, setting=setting, lengths=lengths,
                         start=start, batch=batch_name, values=values, prompt_once=prompt_once, fix=fix)


def assert_layout_packing_safe(model: nn.Module, layout: str, **kwargs: Any) -> PackingReport:
    """Like :func:`check_layout_packing`, but raise :class:`PackingLeakError` unless safe."""
    report = check_layout_packing(model, layout, **kwargs)
    if not report.ok:
        raise PackingLeakError(report)
    return report


def _record_rows(model: nn.Module, batch: Mapping[str, Any], length: int) -> tuple[list[str], dict[str, tuple]]:
    """Run ``batch``; for every submodule the first call's (input, output) tensors laid out ``(1, length, ...)``,
    and the order in which the modules finished."""
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    order: list[str] = []

    def row(t: Any) -> torch.Tensor | None:  # a tensor, the first of a tuple, or a model output's last_hidden_state
        t = t[0] if isinstance(t, (tuple, list)) and t else getattr(t, "last_hidden_state", t)
        ok = isinstance(t, torch.Tensor) and t.dim() >= 2 and tuple(t.shape[:2]) == (1, length)
        return t.detach().float() if ok else None

    def hook(name: str) -> Callable[..., None]:
        def record(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            if name in seen:
                return
            inp = row(args[0]) if args else row(kwargs.get("hidden_states", kwargs.get("input_ids")))
            out = row(output)
            if inp is not None and out is not None:
                seen[name] = (inp, out)
                order.append(name)

        return record

    handles = [m.register_forward_hook(hook(n), with_kwargs=True) for n, m in model.named_modules() if n]
    try:
        with torch.no_grad():
            model(**{k: v for k, v in batch.items() if k != "labels"})
    finally:
        for h in handles:
            h.remove()
    return order, seen


def first_leaking_module(
    model: nn.Module, alone: Sequence[Mapping[str, Any]], packed: Mapping[str, Any], rtol: float = 1e-5
) -> str | None:
    """The first module (in the order modules finish a forward) whose input is the same on the packed row as on
    the examples run alone but whose output is not: where examples start to mix, ``"name (ClassName)"``; None
    when no module's tensors line up with the row (or none mixes them). It names a layer the package does not
    know (a remote-code recurrent layer, say) in the probe's refusal.

    >>> from trl_padfree.testing import tiny_llama
    >>> class RunningMean(torch.nn.Module):  # mixes every earlier token of the row, whatever the example
    ...     def forward(self, x):
    ...         return x.cumsum(1) / torch.arange(1, x.shape[1] + 1)[None, :, None]
    >>> model = tiny_llama(vocab_size=64, attn_implementation="padfree").eval()
    >>> model.model.layers[1].mlp = RunningMean()
    >>> seqs = [[5, 6, 7], [8, 9, 10, 11]]
    >>> alone = [{"input_ids": torch.tensor([s]), "use_cache": False} for s in seqs]
    >>> first_leaking_module(model, alone, packed_batch(seqs))
    'model.layers.1.mlp (RunningMean)'
    """
    total = int(packed["input_ids"].shape[-1])
    order, packed_rows = _record_rows(model, packed, total)
    alone_rows = [_record_rows(model, batch, int(batch["input_ids"].shape[-1]))[1] for batch in alone]
    for name in order:
        if not all(name in rows for rows in alone_rows):
            continue
        ins, outs = [rows[name][0] for rows in alone_rows], [rows[name][1] for rows in alone_rows]
        if len({t.shape[2:] for t in ins}) > 1 or len({t.shape[2:] for t in outs}) > 1:
            continue  # a tensor whose other dimensions follow the length (a compressed cache): not a row of tokens
        inp, out = torch.cat(ins, dim=1), torch.cat(outs, dim=1)
        p_inp, p_out = packed_rows[name]
        if p_inp.shape != inp.shape or p_out.shape != out.shape:
            continue
        tol_in = rtol * max(inp.abs().max().item(), 1.0)
        tol_out = rtol * max(out.abs().max().item(), 1.0)
        if (p_inp - inp).abs().max().item() <= tol_in and (p_out - out).abs().max().item() > tol_out:
            return f"{name} ({type(model.get_submodule(name)).__name__})"
    return None


def check_packing(
    model: nn.Module, *, lengths: Sequence[int] = DEFAULT_LENGTHS, seed: int = 0, rtol: float | None = None,
    collate_fn: Callable[[list[dict[str, list[int]]]], Mapping[str, Any]] | None = None, try_alternatives: bool = True,
) -> PackingReport:
    """Run random sequences packed into one row and each alone, and report whether the packed ones stay apart.

    ``model``: a causal LM (PEFT-wrapped or not) on any device and dtype; ``rtol``: default from
    :data:`DEFAULT_RTOL` by compute dtype; ``collate_fn``: builds the packed batch from ``[{"input_ids": [...]},
    ...]`` (default :func:`packed_batch`), to probe another collator; ``try_alternatives``: when the model is not
    safe, probe each of :data:`ALTERNATIVES` too, so that the advice recommends only one safe on this model.

    The model is first prepared as the trainers prepare it (recurrent layers restart at every boundary of a packed
    row: :func:`~trl_padfree.recurrent.prepare_packed_layers`), so the verdict is about what training runs. A packed
    forward that raises, or ``"padfree"`` refusing the model, is the verdict ``"error"``; a model that fails on an
    ordinary batch raises (that is not a packing question).

    >>> from trl_padfree.testing import tiny_llama
    >>> report = check_packing(tiny_llama(vocab_size=64, attn_implementation="sdpa"))
    >>> report.ok, report.status, report.model_type, report.attn_implementation
    (True, 'safe', 'llama', 'sdpa')
    """
    lengths = tuple(int(n) for n in lengths)
    if len(lengths) < 2 or min(lengths) < 1:
        raise ValueError(f"check_packing needs at least 2 sequences of length >= 1; got lengths={list(lengths)}.")
    start = time.perf_counter()
    prepare_packed_layers(model)  # what the trainers do when training starts: recurrent layers reset at boundaries
    setting = device, _, rtol = probe_setting(model, rtol)
    model_type, attn = _model_type(model), _attn_name(model)
    sequences = model_sequences(model, lengths, seed)
    features = [{"input_ids": list(seq)} for seq in sequences]
    packed_inputs = _on(collate_fn(features) if collate_fn is not None else packed_batch(sequences), device)
    error, failure, alone, noise = None, None, [], math.nan
    with deterministic_train_mode(model), counting_calls() as calls:
        try:
            for seq in sequences:
                alone.append(probe_logits(model, _on(alone_batch(seq), device)))
            noise = (probe_logits(model, _on(alone_batch(sequences[-1]), device)) - alone[-1]).abs().max().item()
            packed = probe_logits(model, packed_inputs)
        except Exception as exc:  # the Trainer would hit the same error: report it instead of crashing
            failure = exc
    # "padfree" set, yet never called: the model computes attention in its own code (not through transformers'
    # AttentionInterface), where the masks built for "padfree" are not what it expects. A model without attention
    # layers (Mamba-2) is judged by its logits like any other.
    kinds = layer_kinds(model)
    has_attention = any(k in _ATTENTION_NAMES for k in kinds) or not any(k in _KERNELS for k in kinds)
    bypassed = attn == ATTN_IMPLEMENTATION and calls[0] == 0 and has_attention
    if failure is not None:
        refused = isinstance(failure, PadfreeAttentionError)
        if len(alone) < len(sequences) and not bypassed and not refused:
            raise failure  # the model fails on an ordinary batch: not a packing question
        error = error_line(failure)
    got = None
    if error is None:
        if packed.shape[0] != sum(lengths):
            raise ValueError(f"check_packing: packed logits have {packed.shape[0]} positions, expected {sum(lengths)}.")
        got = packed.split(lengths)
    report = _report(model, setting, start, lengths, alone, got, error, noise, bypassed, layer_kinds=kinds)
    status, first_leak, tried = report.status, None, {}
    if status == "leaks":
        with deterministic_train_mode(model):
            first_leak = first_leaking_module(model, [_on(alone_batch(q), device) for q in sequences], packed_inputs,
                                              rtol=rtol)
    if try_alternatives and status in ("leaks", "error", "unsupported") and packed_inputs.get("use_cache") is False:
        for other in ALTERNATIVES:
            if other != attn:
                tried[other] = _probe_with(model, other, lengths=lengths, seed=seed, rtol=rtol, collate_fn=collate_fn)
    alternative = next((name for name, verdict in tried.items() if verdict == "safe"), None)
    advice = (f"the first module that mixes packed examples is {first_leak}; " if first_leak else "") + _advice(
        status, model_type, attn, noise, cache_off=packed_inputs.get("use_cache") is False,
        model_class=type(model).__name__, kinds=kinds, error=error, alternative=alternative)
    return dataclasses.replace(report, advice=advice, alternatives=tried, first_leak=first_leak,
                               seconds=time.perf_counter() - start)


def _probe_with(model: nn.Module, attn: str, **kwargs: Any) -> str:
    """The probe's status for ``model`` with attention implementation ``attn`` (``"not offered"`` when the model
    cannot switch to it, ``"error"`` when the probe raises); the model's own implementation is restored after."""
    switch = getattr(model, "set_attn_implementation", None)
    original = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if not callable(switch) or not isinstance(original, str):
        return "not offered"
    try:
        switch(attn)
    except Exception:  # noqa: BLE001  (transformers refuses it for this model)
        return "not offered"
    try:
        if _attn_name(model) != attn:
            return "not offered"
        return check_packing(model, try_alternatives=False, **kwargs).status
    except Exception:  # noqa: BLE001  (a verdict, not a crash)
        return "error"
    finally:
        switch(original)


def uses_padfree_attention(model: nn.Module) -> bool:
    """Whether a forward pass of ``model`` calls the ``"padfree"`` attention function at all.

    transformers accepts ``attn_implementation="padfree"`` for every model, but models whose attention code does
    not go through its ``AttentionInterface`` (BLOOM, MPT, XGLM, state-space models) never call it. One short
    forward pass without gradients tells; a forward that raises before reaching the attention counts as not.

    >>> from trl_padfree.testing import tiny_llama
    >>> uses_padfree_attention(tiny_llama(vocab_size=64, attn_implementation="padfree"))
    True
    >>> uses_padfree_attention(tiny_llama(vocab_size=64, attn_implementation="sdpa"))
    False
    """
    ids = torch.tensor([[1, 2, 3, 1]], device=_model_device(model)) % max(model_vocab_size(model), 1)
    with torch.no_grad(), counting_calls() as calls, contextlib.suppress(Exception):  # the answer is in the counter
        model(input_ids=ids, use_cache=False)
    return calls[0] > 0


def assert_packing_safe(model: nn.Module, **kwargs: Any) -> PackingReport:
    """Like :func:`check_packing` (same keyword arguments), but raise :class:`PackingLeakError` unless safe.

    Call it once before padding-free training: the error message names the model type, the attention
    implementation and what to change.
    """
    report = check_packing(model, **kwargs)
    if not report.ok:
        raise PackingLeakError(report)
    return report
