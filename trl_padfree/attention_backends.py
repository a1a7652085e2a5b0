"""Varlen attention kernels behind the ``"padfree"`` attention implementation.

Three interchangeable kernels compute causal (optionally sliding-window) attention over a flat batch of
concatenated sequences described by ``cu_seq_lens`` (cumulative lengths, int32, ``N + 1`` entries), on token-major
tensors (``query`` ``(total_q, H, D)``, ``key``/``value`` ``(total_k, H_kv, D)``, output ``(total_q, H, D_v)``):

* ``"flash_attn"``: flash-attn's ``flash_attn_varlen_func`` (CUDA, fp16/bf16; soft-capping from 2.6, sinks where
  the build takes ``s_aux`` or ``learnable_sink``: :func:`flash_attn_features_available`).
* ``"torch_varlen"``: PyTorch's ``torch.nn.attention.varlen.varlen_attn`` (CUDA sm80+, fp16/bf16, no dropout,
  no soft-capping, no sinks).
* ``"sdpa_loop"``: ``scaled_dot_product_attention`` per sequence (any device and dtype; the CPU path); with
  soft-capping or sinks, which SDPA lacks, each sequence's scores explicitly (:func:`scores_attention`).

:func:`decide_backend` chooses (a pure function once its optional arguments are given); :func:`run_varlen_attention`
dispatches. The CPU loop avoids what costs time there: GQA through ``enable_gqa`` (no ``repeat_interleave`` copies;
SDPA keeps its fused CPU flash kernel, 1.7x faster), the boundaries read once per call, one ``split`` per tensor
(whose backward is one concatenation; slicing each sequence made the backward twice as slow), no copies but the
final concatenation. Batching similar lengths into padded SDPA calls was measured slower on 1-2 CPU threads. The
loop costs about 12% more than the bare SDPA kernels; on a shared CPU run it with one intra-op thread (3-6x slower
with 2 threads under load).
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
from itertools import pairwise
from typing import Any, Literal

import torch
import torch.nn.functional as F

Backend = Literal["flash_attn", "torch_varlen", "sdpa_loop"]

BACKENDS: tuple[str, ...] = ("flash_attn", "torch_varlen", "sdpa_loop")

_HALF_DTYPES = (torch.float16, torch.bfloat16)
# Largest head dimension of the flash kernels (flash-attn 2 and PyTorch's varlen kernel alike).
_MAX_FLASH_HEAD_DIM = 256


@functools.cache
def flash_attn_available() -> bool:
    """Whether the optional ``flash_attn`` package (with ``flash_attn_varlen_func``) can be imported.

    >>> isinstance(flash_attn_available(), bool)
    True
    """
    if importlib.util.find_spec("flash_attn") is None:
        return False
    try:
        from flash_attn import flash_attn_varlen_func  # noqa: F401
    except Exception:  # a broken build (wrong CUDA, ABI mismatch) is "not available", not a crash
        return False
    return True


_FEATURE_NAMES = {"softcap": "logit soft-capping", "sinks": "sinks"}
# flash_attn_varlen_func's name for the per-head sink logits: FA3 builds (vLLM's) call it s_aux, FA4 learnable_sink.
_SINK_ARGUMENTS = ("s_aux", "learnable_sink")


@functools.cache
def flash_attn_features_available() -> frozenset[str]:
    """Which of ``"softcap"`` and ``"sinks"`` the installed ``flash_attn_varlen_func`` takes (empty without it).

    >>> flash_attn_features_available() <= {"softcap", "sinks"}
    True
    """
    if not flash_attn_available():
        return frozenset()
    from flash_attn import flash_attn_varlen_func

    parameters = inspect.signature(flash_attn_varlen_func).parameters
    features = {"softcap"} if "softcap" in parameters else set()
    if any(name in parameters for name in _SINK_ARGUMENTS):
        features.add("sinks")
    return frozenset(features)


@functools.cache
def torch_varlen_available() -> bool:
    """Whether this PyTorch ships ``torch.nn.attention.varlen.varlen_attn`` (2.9+) with ``window_size``.

    >>> isinstance(torch_varlen_available(), bool)
    True
    """
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return False
    return "window_size" in inspect.signature(varlen_attn).parameters


@functools.cache
def _torch_varlen_supports_gqa() -> bool:
    from torch.nn.attention.varlen import varlen_attn

    return "enable_gqa" in inspect.signature(varlen_attn).parameters


def select_backend(device: torch.device | str, dtype: torch.dtype, **options: Any) -> Backend:
    """The fastest correct varlen kernel for one attention call (:func:`decide_backend`'s choice).

    >>> select_backend("cpu", torch.float32)
    'sdpa_loop'
    >>> select_backend("cuda", torch.bfloat16, flash_attn_installed=True)
    'flash_attn'
    >>> select_backend("cuda", torch.bfloat16, flash_attn_installed=False, torch_varlen_installed=True,
    ...                cuda_capability=(9, 0))
    'torch_varlen'
    >>> select_backend("cuda", torch.float32, flash_attn_installed=True, torch_varlen_installed=True,
    ...                cuda_capability=(9, 0))
    'sdpa_loop'
    >>> select_backend("cuda", torch.bfloat16, softcap=True, flash_attn_installed=True,
    ...                flash_attn_features=frozenset({"softcap"}))
    'flash_attn'
    >>> select_backend("cuda", torch.bfloat16, sinks=True, flash_attn_installed=True,
    ...                flash_attn_features=frozenset({"softcap"}))
    'sdpa_loop'
    """
    return decide_backend(device, dtype, **options)[0]


def decide_backend(
    device: torch.device | str, dtype: torch.dtype, *, dropout: float = 0.0, head_dim: int = 64,
    softcap: bool = False, sinks: bool = False, flash_attn_installed: bool | None = None,
    torch_varlen_installed: bool | None = None, cuda_capability: tuple[int, int] | None = None,
    flash_attn_features: frozenset[str] | None = None,
) -> tuple[Backend, str | None]:
    """``(backend, why a CUDA call gets the loop or None)`` for one attention call.

    ``device``/``dtype``: the query's; ``dropout``: this call's (``torch_varlen`` has none); ``head_dim``: the
    largest of the query/key and value head dimensions (the flash kernels stop at 256); ``softcap``/``sinks``: the
    call soft-caps its logits (Gemma-2) / has per-head sinks (GPT-OSS). The other four are detected when None:
    whether flash-attn imports, whether ``varlen_attn`` exists, the CUDA ``(major, minor)``, and which of
    ``"softcap"``/``"sinks"`` the installed ``flash_attn_varlen_func`` takes.

    >>> decide_backend("cpu", torch.float32)
    ('sdpa_loop', None)
    >>> print(decide_backend("cuda", torch.bfloat16, flash_attn_installed=False, torch_varlen_installed=False,
    ...                      cuda_capability=(9, 0))[1])
    no varlen kernel: flash-attn is not installed and this PyTorch has no torch.nn.attention.varlen.varlen_attn \
with window_size (PyTorch 2.11+); pip install flash-attn, or upgrade torch
    """
    device = torch.device(device)
    if device.type != "cuda":
        return "sdpa_loop", None
    if dtype not in _HALF_DTYPES:
        return "sdpa_loop", (
            f"{dtype} inputs: the varlen kernels take float16/bfloat16 only; train in bf16 (e.g. bf16=True, "
            "or load the model with dtype=torch.bfloat16)"
        )
    if head_dim > _MAX_FLASH_HEAD_DIM:
        return "sdpa_loop", f"head dimension {head_dim} is above the flash kernels' limit of {_MAX_FLASH_HEAD_DIM}"
    if flash_attn_installed is None:
        flash_attn_installed = flash_attn_available()
    needed = {name for name, used in (("softcap", softcap), ("sinks", sinks)) if used}
    if flash_attn_installed:
        if flash_attn_features is None:
            flash_attn_features = flash_attn_features_available()
        missing = sorted(needed - flash_attn_features)
        if missing:
            return "sdpa_loop", (
                f"attention {' and '.join(_FEATURE_NAMES[m] for m in missing)}: the installed flash-attn's "
                "flash_attn_varlen_func has no argument for it (softcap needs flash-attn >= 2.6; sinks need a "
                "kernel with `s_aux` or `learnable_sink`)"
            )
        return "flash_attn", None
    if needed:
        return "sdpa_loop", (
            f"attention {' and '.join(_FEATURE_NAMES[m] for m in sorted(needed))}: torch's varlen_attn has none "
            "and flash-attn is not installed; pip install flash-attn (>= 2.6 has softcap)"
        )
    if dropout > 0.0:  # varlen_attn has no dropout argument
        return "sdpa_loop", (
            f"attention dropout {dropout:g}: torch's varlen_attn has none and flash-attn is not installed; "
            "pip install flash-attn, or set the model's attention_dropout to 0"
        )
    if torch_varlen_installed is None:
        torch_varlen_installed = torch_varlen_available()
    if not torch_varlen_installed:
        return "sdpa_loop", (
            "no varlen kernel: flash-attn is not installed and this PyTorch has no "
            "torch.nn.attention.varlen.varlen_attn with window_size (PyTorch 2.11+); pip install flash-attn, or "
            "upgrade torch"
        )
    if cuda_capability is None:
        cuda_capability = torch.cuda.get_device_capability(device)
    if tuple(cuda_capability) < (8, 0):
        return "sdpa_loop", (
            f"this GPU (compute capability {cuda_capability[0]}.{cuda_capability[1]}) is older than the sm80 that "
            "torch's varlen_attn needs, and flash-attn is not installed"
        )
    return "torch_varlen", None


def _flash_attn(query, key, value, cu_q, cu_k, max_q, max_k, *, scale, causal, sliding_window, dropout,
                softcap=None, sinks=None) -> torch.Tensor:
    from flash_attn import flash_attn_varlen_func

    left = -1 if sliding_window is None else sliding_window - 1  # transformers' window: kv > q - sliding_window
    extra: dict[str, Any] = {} if softcap is None else {"softcap": softcap}
    if sinks is not None:
        parameters = inspect.signature(flash_attn_varlen_func).parameters
        name = next(n for n in _SINK_ARGUMENTS if n in parameters)
        extra[name] = sinks.to(query.dtype)  # as transformers' flash_attention_forward passes s_aux
    return flash_attn_varlen_func(query, key, value, cu_q, cu_k, max_q, max_k, dropout_p=dropout, softmax_scale=scale,
                                  causal=causal, window_size=(left, 0 if causal else left), **extra)


def _torch_varlen(query, key, value, cu_q, cu_k, max_q, max_k, *, scale, causal, sliding_window) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn

    left = -1 if sliding_window is None else sliding_window - 1
    # A tuple, not a list: varlen_attn recognises plain causal attention by `window_size == (-1, 0)`.
    kwargs: dict = {"scale": scale, "window_size": (left, 0) if causal else (left, left)}
    if key.shape[1] != query.shape[1]:
        if _torch_varlen_supports_gqa():
            kwargs["enable_gqa"] = True
        else:
            groups = query.shape[1] // key.shape[1]
            key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    return varlen_attn(query, key, value, cu_q.int(), cu_k.int(), max_q, max_k, **kwargs)


def window_mask(q_length: int, k_length: int, sliding_window: int | None, causal: bool, device) -> torch.Tensor:
    """Boolean ``(q_length, k_length)`` mask (True = attend), bottom-right aligned like transformers' masks.

    >>> window_mask(4, 4, 2, True, "cpu").int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    """
    distance = torch.arange(k_length - q_length, k_length, device=device)[:, None] - torch.arange(k_length, device=device)
    mask = torch.ones(q_length, k_length, dtype=torch.bool, device=device)
    if causal:
        mask &= distance >= 0
    if sliding_window is not None:
        mask &= distance < sliding_window
        if not causal:
            mask &= distance > -sliding_window
    return mask


def _loop(query, key, value, cu_q, cu_k, *, scale, causal, sliding_window, dropout, softcap=None, sinks=None
          ) -> torch.Tensor:
    """Per-sequence attention over token-major ``(T, H, D)`` tensors (see the module docstring): SDPA, or
    :func:`scores_attention` with soft-capping or sinks (memory of one sequence's scores at a time)."""
    starts_q = cu_q.tolist()
    starts_k = starts_q if cu_k is cu_q else cu_k.tolist()
    lengths_q = [b - a for a, b in pairwise(starts_q)]
    lengths_k = [b - a for a, b in pairwise(starts_k)]
    # One split per tensor into head-major views: its backward is a single concatenation, whereas slicing each
    # sequence out would allocate and add a zero-filled full-size gradient per sequence.
    q_seqs = query.transpose(0, 1).split(lengths_q, dim=1)
    k_seqs = key.transpose(0, 1).split(lengths_k, dim=1)
    v_seqs = value.transpose(0, 1).split(lengths_k, dim=1)
    explicit, gqa = softcap is not None or sinks is not None, key.shape[1] != query.shape[1]
    outputs = []
    for q, k, v in zip(q_seqs, k_seqs, v_seqs, strict=True):
        q_length, k_length = q.shape[1], k.shape[1]
        mask = None
        if sliding_window is not None and max(q_length, k_length) > sliding_window:
            mask = window_mask(q_length, k_length, sliding_window, causal, q.device)
        elif causal and (explicit or q_length != k_length):
            mask = window_mask(q_length, k_length, None, True, q.device)
        if explicit:
            out = scores_attention(q[None], k[None], v[None], mask, scale=scale, softcap=softcap, sinks=sinks,
                                   dropout=dropout)
        else:
            out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, dropout_p=dropout,
                                                 is_causal=causal and mask is None, scale=scale, enable_gqa=gqa)
        outputs.append(out[0].transpose(0, 1))
    # SDPA's CPU kernel writes (1, H, L, D) outputs with a (1, L, H, D) memory layout: the transposes are free.
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=0)


def scores_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, *,
    scale: float | None = None, softcap: float | None = None, sinks: torch.Tensor | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """Attention with the scores computed explicitly, as transformers' eager code does (Gemma-2, GPT-OSS).

    ``query`` ``(B, H, Lq, D)``, ``key``/``value`` ``(B, H_kv, Lk, D)`` (GQA by broadcasting, no copies),
    ``mask`` boolean (True = attend) or additive, broadcastable to ``(B, 1, Lq, Lk)``, or ``None``. The logits
    ``q.k * scale`` are soft-capped (``tanh(x / softcap) * softcap``) before masking; ``sinks`` ``(H,)`` adds one
    logit per head to every softmax denominator (a column that attends to nothing), as in
    ``transformers.models.gpt_oss.modeling_gpt_oss.eager_attention_forward``. The softmax runs in float32.
    Returns ``(B, H, Lq, D_v)``.

    >>> q, k, v = torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2), torch.ones(1, 1, 1, 2)
    >>> scores_attention(q, k, v, None, sinks=torch.zeros(1)).tolist()  # the sink takes half the weight
    [[[[0.5, 0.5]]]]
    """
    batch, heads, q_length, head_dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    scale = head_dim**-0.5 if scale is None else scale
    q = query.reshape(batch, kv_heads, groups, q_length, head_dim)
    scores = torch.matmul(q, key.unsqueeze(2).transpose(-1, -2)) * scale  # (B, H_kv, G, Lq, Lk)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        while mask.ndim < 4:
            mask = mask.unsqueeze(0)
        if mask.shape[1] == heads > 1:  # a mask per head
            mask = mask.reshape(mask.shape[0], kv_heads, groups, *mask.shape[-2:])
        else:
            mask = mask.unsqueeze(2)  # (B, 1, 1, Lq, Lk) against the grouped heads
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + mask
    if sinks is not None:
        sink = sinks.reshape(1, kv_heads, groups, 1, 1).to(scores.dtype)
        scores = torch.cat([scores, sink.expand(batch, -1, -1, q_length, 1)], dim=-1)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    if sinks is not None:
        probs = probs[..., :-1]  # the sink column attends to nothing
    if dropout > 0.0:
        probs = F.dropout(probs, p=dropout)
    out = torch.matmul(probs.to(value.dtype), value.unsqueeze(2))  # (B, H_kv, G, Lq, D_v)
    return out.reshape(batch, heads, q_length, value.shape[-1])


def run_varlen_attention(
    backend: Backend, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seq_lens_q: torch.Tensor,
    cu_seq_lens_k: torch.Tensor, max_length_q: int, max_length_k: int, *, scale: float | None = None,
    causal: bool = True, sliding_window: int | None = None, dropout: float = 0.0, softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of every sequence to itself only, on token-major tensors; returns ``(total_q, H, D_v)``.

    ``backend``: one of :data:`BACKENDS`; ``query`` ``(total_q, H, D)``, ``key``/``value`` ``(total_k, H_kv, D)``
    (``H`` a multiple of ``H_kv``); ``cu_seq_lens_q/k``: int32 ``(N + 1,)`` from 0; ``max_length_q/k``: Python
    ints; ``scale`` (None: ``1/sqrt(D)``); ``causal`` inside each sequence (bottom-right aligned when query and key
    lengths differ); ``sliding_window`` as transformers' (a query sees itself and ``sliding_window - 1`` keys
    before it); ``softcap`` (``tanh(x / softcap) * softcap``) and per-head ``sinks`` ``(H,)``: ``"sdpa_loop"``
    then computes the scores explicitly, ``"torch_varlen"`` refuses them.

    >>> q = torch.randn(5, 2, 4); kv = torch.randn(5, 1, 4)
    >>> cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    >>> out = run_varlen_attention("sdpa_loop", q, kv, kv, cu, cu, 3, 3)
    >>> out.shape
    torch.Size([5, 2, 4])
    >>> torch.allclose(out[0], kv[0].expand(2, 4))  # the first token of a sequence only sees itself
    True
    """
    common = {"scale": scale, "causal": causal, "sliding_window": sliding_window}
    if backend == "sdpa_loop":
        return _loop(query, key, value, cu_seq_lens_q, cu_seq_lens_k, **common, dropout=dropout, softcap=softcap,
                     sinks=sinks)
    args = (query, key, value, cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k)
    if backend == "flash_attn":
        return _flash_attn(*args, **common, dropout=dropout, softcap=softcap, sinks=sinks)
    if backend == "torch_varlen":
        if softcap is not None or sinks is not None:
            raise ValueError("The torch_varlen backend has no softcap or sinks; use 'flash_attn' or 'sdpa_loop'.")
        if dropout > 0.0:
            raise ValueError("The torch_varlen backend has no dropout; use 'flash_attn' or 'sdpa_loop'.")
        return _torch_varlen(*args, **common)
    raise ValueError(f"Unknown varlen attention backend {backend!r}; expected one of {BACKENDS}.")
