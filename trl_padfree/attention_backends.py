"""Varlen attention kernels behind the ``"padfree"`` attention implementation.

Three interchangeable kernels compute causal (optionally sliding-window) attention over a flat batch of
concatenated sequences described by ``cu_seq_lens`` (cumulative lengths, int32, ``N + 1`` entries):

* ``"flash_attn"``: ``flash_attn.flash_attn_varlen_func`` from the optional flash-attn package (CUDA, fp16/bf16;
  attention logit soft-capping from flash-attn 2.6, attention sinks where the build takes ``s_aux`` or
  ``learnable_sink``, see :func:`flash_attn_features_available`).
* ``"torch_varlen"``: PyTorch's own ``torch.nn.attention.varlen.varlen_attn`` (CUDA sm80+, fp16/bf16, no dropout,
  no soft-capping, no sinks).
* ``"sdpa_loop"``: ``scaled_dot_product_attention`` per sequence (any device and dtype; the CPU path). With
  soft-capping or sinks, which SDPA lacks, it computes each sequence's scores explicitly instead
  (:func:`scores_attention`, the math of transformers' eager code, memory of one sequence at a time).

:func:`select_backend` is the pure decision function; :func:`run_varlen_attention` dispatches to the kernel.
All kernels take and return token-major tensors: ``query`` ``(total_q, H, D)``, ``key``/``value``
``(total_k, H_kv, D)``, output ``(total_q, H, D_v)``.

The CPU loop is the one that must be fast, so it avoids what costs time there:

* GQA runs through ``enable_gqa=True``: no ``repeat_interleave`` copies of keys and values, and SDPA still picks
  its fused CPU flash kernel (about 1.7x faster than repeating the heads, forward + backward, length 340);
* the boundaries are read once per call (``cu_seq_lens.tolist()``), never per sequence;
* the sequences are cut out with one ``split`` per tensor (whose backward is one concatenation) instead of one
  slice per sequence (whose backward zero-fills and accumulates a full-size gradient per sequence: it made the
  backward pass of the whole loop about twice as slow);
* inputs stay strided views; the CPU flash kernel reads them as they are and writes token-major outputs, so the
  only copy is the final concatenation.

Batching several sequences of equal or similar length into one right-padded SDPA call (exact for causal
attention) was measured and rejected: on 1-2 CPU threads the stacking, padding and their backward cost more than
the per-call overhead they save (about 2x slower for 64 sequences of 50 tokens, 1.2x for FLAN-like batches).

Where the time goes (measured with a since-removed micro-benchmark that ran the same comparison as
``trl-padfree bench --datasets flan``: tiny Llama 4x256, FLAN-like batches of 8, fp32, 1 thread):
the loop costs about 12% more than the bare SDPA kernels on the same sequences, and the kernels themselves run
at about 50-60 GFLOP/s (backward about 3x forward). The rest of a train step (projections, MLP, LM head) is
proportional to the real tokens; with attention replaced by a no-op, a packed step is still ~40% of the
time of transformers' packed sdpa step, which caps "padfree / packed sdpa" at about 3.9x on these batches.
On a shared CPU, run with one intra-op thread: with two threads and other processes on the cores, every
parallel region waits for a descheduled thread, and a loop of short kernels has many more regions than one
dense kernel (measured: the loop 3-6x slower with 2 threads than with 1 under load).
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


def select_backend(
    device: torch.device | str,
    dtype: torch.dtype,
    *,
    dropout: float = 0.0,
    head_dim: int = 64,
    softcap: bool = False,
    sinks: bool = False,
    flash_attn_installed: bool | None = None,
    torch_varlen_installed: bool | None = None,
    cuda_capability: tuple[int, int] | None = None,
    flash_attn_features: frozenset[str] | None = None,
) -> Backend:
    """Choose the fastest correct varlen kernel for one attention call.

    Pure function of its arguments once the three optional ones are given (they are detected when ``None``),
    so the decision is testable anywhere.

    Args:
        device: device of the query tensor.
        dtype: dtype of the query tensor.
        dropout: attention dropout probability of this call (``torch_varlen`` has no dropout).
        head_dim: largest of the query/key and value head dimensions (the flash kernels stop at 256).
        softcap: the call soft-caps its attention logits (Gemma-2's ``attn_logit_softcapping``).
        sinks: the call has per-head attention sinks (GPT-OSS's ``sinks``, passed as ``s_aux``).
        flash_attn_installed: whether flash-attn imports; detected when ``None``.
        torch_varlen_installed: whether ``torch.nn.attention.varlen.varlen_attn`` exists; detected when ``None``.
        cuda_capability: ``(major, minor)`` of the CUDA device; detected when ``None`` and the device is CUDA.
        flash_attn_features: which of ``"softcap"`` and ``"sinks"`` the installed ``flash_attn_varlen_func``
            takes (:func:`flash_attn_features`); detected when ``None``.

    Returns:
        ``"flash_attn"``, ``"torch_varlen"`` or ``"sdpa_loop"``.

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
    return decide_backend(
        device,
        dtype,
        dropout=dropout,
        head_dim=head_dim,
        softcap=softcap,
        sinks=sinks,
        flash_attn_installed=flash_attn_installed,
        torch_varlen_installed=torch_varlen_installed,
        cuda_capability=cuda_capability,
        flash_attn_features=flash_attn_features,
    )[0]


def slow_cuda_reason(device: torch.device | str, dtype: torch.dtype, **options: Any) -> str | None:
    """Why a CUDA call gets the per-sequence loop rather than a varlen kernel, and what to change; else ``None``.

    Same arguments as :func:`select_backend`. The loop is exact, only slower; the ``"padfree"`` attention warns
    once with this text.

    >>> print(slow_cuda_reason("cuda", torch.bfloat16, flash_attn_installed=False, torch_varlen_installed=False,
    ...                        cuda_capability=(9, 0)))
    no varlen kernel: flash-attn is not installed and this PyTorch has no torch.nn.attention.varlen.varlen_attn \
with window_size (PyTorch 2.11+); pip install flash-attn, or upgrade torch
    >>> slow_cuda_reason("cpu", torch.float32) is None
    True
    """
    return decide_backend(device, dtype, **options)[1]


def decide_backend(
    device: torch.device | str,
    dtype: torch.dtype,
    *,
    dropout: float = 0.0,
    head_dim: int = 64,
    softcap: bool = False,
    sinks: bool = False,
    flash_attn_installed: bool | None = None,
    torch_varlen_installed: bool | None = None,
    cuda_capability: tuple[int, int] | None = None,
    flash_attn_features: frozenset[str] | None = None,
) -> tuple[Backend, str | None]:
    """:func:`select_backend` and :func:`slow_cuda_reason` in one decision (what the attention calls per call).

    >>> decide_backend("cpu", torch.float32)
    ('sdpa_loop', None)
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


def _window_left(sliding_window: int | None) -> int:
    """Left window of the flash kernels for transformers' ``sliding_window`` (``kv > q - sliding_window``)."""
    return -1 if sliding_window is None else sliding_window - 1


def _flash_attn(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_lens_q: torch.Tensor,
    cu_seq_lens_k: torch.Tensor,
    max_length_q: int,
    max_length_k: int,
    *,
    scale: float | None,
    causal: bool,
    sliding_window: int | None,
    dropout: float,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    from flash_attn import flash_attn_varlen_func

    left = _window_left(sliding_window)
    extra: dict[str, Any] = {}
    if softcap is not None:
        extra["softcap"] = softcap
    if sinks is not None:
        parameters = inspect.signature(flash_attn_varlen_func).parameters
        name = next(n for n in _SINK_ARGUMENTS if n in parameters)
        extra[name] = sinks.to(query.dtype)  # as transformers' flash_attention_forward passes s_aux
    return flash_attn_varlen_func(
        query,
        key,
        value,
        cu_seq_lens_q,
        cu_seq_lens_k,
        max_length_q,
        max_length_k,
        dropout_p=dropout,
        softmax_scale=scale,
        causal=causal,
        window_size=(left, 0 if causal else left),
        **extra,
    )


def _torch_varlen(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_lens_q: torch.Tensor,
    cu_seq_lens_k: torch.Tensor,
    max_length_q: int,
    max_length_k: int,
    *,
    scale: float | None,
    causal: bool,
    sliding_window: int | None,
) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn

    left = _window_left(sliding_window)
    # A tuple, not a list: varlen_attn recognises plain causal attention by `window_size == (-1, 0)`.
    window = (left, 0) if causal else (left, left)
    kwargs: dict = {"scale": scale, "window_size": window}
    if key.shape[1] != query.shape[1]:
        if _torch_varlen_supports_gqa():
            kwargs["enable_gqa"] = True
        else:
            groups = query.shape[1] // key.shape[1]
            key = key.repeat_interleave(groups, dim=1)
            value = value.repeat_interleave(groups, dim=1)
    return varlen_attn(
        query, key, value, cu_seq_lens_q.int(), cu_seq_lens_k.int(), max_length_q, max_length_k, **kwargs
    )


def window_mask(
    q_length: int, k_length: int, sliding_window: int | None, causal: bool, device
) -> torch.Tensor:
    """Boolean ``(q_length, k_length)`` mask (True = attend), bottom-right aligned like transformers' masks.

    >>> window_mask(4, 4, 2, True, "cpu").int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    """
    q_pos = torch.arange(k_length - q_length, k_length, device=device)[:, None]
    k_pos = torch.arange(k_length, device=device)[None, :]
    distance = q_pos - k_pos
    mask = torch.ones(q_length, k_length, dtype=torch.bool, device=device)
    if causal:
        mask &= distance >= 0
    if sliding_window is not None:
        mask &= distance < sliding_window
        if not causal:
            mask &= distance > -sliding_window
    return mask


def _sdpa_loop(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_lens_q: torch.Tensor,
    cu_seq_lens_k: torch.Tensor,
    *,
    scale: float | None,
    causal: bool,
    sliding_window: int | None,
    dropout: float,
) -> torch.Tensor:
    """Per-sequence SDPA over token-major ``(T, H, D)`` tensors (see the module docstring)."""
    starts_q = cu_seq_lens_q.tolist()
    starts_k = starts_q if cu_seq_lens_k is cu_seq_lens_q else cu_seq_lens_k.tolist()
    lengths_q = [b - a for a, b in pairwise(starts_q)]
    lengths_k = [b - a for a, b in pairwise(starts_k)]
    gqa = key.shape[1] != query.shape[1]
    # One split per tensor into head-major views: its backward is a single concatenation, whereas slicing each
    # sequence out would allocate and add a zero-filled full-size gradient per sequence.
    q_seqs = query.transpose(0, 1).split(lengths_q, dim=1)
    k_seqs = key.transpose(0, 1).split(lengths_k, dim=1)
    v_seqs = value.transpose(0, 1).split(lengths_k, dim=1)
    outputs = [
        _sdpa(q[None], k[None], v[None], scale, causal, sliding_window, dropout, gqa)[0].transpose(0, 1)
        for q, k, v in zip(q_seqs, k_seqs, v_seqs, strict=True)
    ]
    # SDPA's CPU kernel writes (1, H, L, D) outputs with a (1, L, H, D) memory layout: the transposes are free.
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=0)


def scores_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
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


def _scores_loop(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_lens_q: torch.Tensor,
    cu_seq_lens_k: torch.Tensor,
    *,
    scale: float | None,
    causal: bool,
    sliding_window: int | None,
    dropout: float,
    softcap: float | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """:func:`scores_attention` per sequence over token-major tensors: memory of one sequence's scores at a time."""
    starts_q = cu_seq_lens_q.tolist()
    starts_k = starts_q if cu_seq_lens_k is cu_seq_lens_q else cu_seq_lens_k.tolist()
    lengths_q = [b - a for a, b in pairwise(starts_q)]
    lengths_k = [b - a for a, b in pairwise(starts_k)]
    q_seqs = query.transpose(0, 1).split(lengths_q, dim=1)
    k_seqs = key.transpose(0, 1).split(lengths_k, dim=1)
    v_seqs = value.transpose(0, 1).split(lengths_k, dim=1)
    outputs = []
    for q, k, v in zip(q_seqs, k_seqs, v_seqs, strict=True):
        q_length, k_length = q.shape[1], k.shape[1]
        mask = None
        if causal or (sliding_window is not None and max(q_length, k_length) > sliding_window):
            mask = window_mask(q_length, k_length, sliding_window, causal, q.device)
        out = scores_attention(
            q[None], k[None], v[None], mask, scale=scale, softcap=softcap, sinks=sinks, dropout=dropout
        )
        outputs.append(out[0].transpose(0, 1))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=0)


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None,
    causal: bool,
    sliding_window: int | None,
    dropout: float,
    gqa: bool,
) -> torch.Tensor:
    q_length, k_length = q.shape[-2], k.shape[-2]
    mask = None
    if sliding_window is not None and max(q_length, k_length) > sliding_window:
        mask = window_mask(q_length, k_length, sliding_window, causal, q.device)
    elif causal and q_length != k_length:
        mask = window_mask(q_length, k_length, None, True, q.device)
    return F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        dropout_p=dropout,
        is_causal=causal and mask is None,
        scale=scale,
        enable_gqa=gqa,
    )


def run_varlen_attention(
    backend: Backend,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_lens_q: torch.Tensor,
    cu_seq_lens_k: torch.Tensor,
    max_length_q: int,
    max_length_k: int,
    *,
    scale: float | None = None,
    causal: bool = True,
    sliding_window: int | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of every sequence to itself only, on token-major tensors.

    Args:
        backend: one of :data:`BACKENDS` (see :func:`select_backend`).
        query: ``(total_q, H, D)``.
        key, value: ``(total_k, H_kv, D)`` and ``(total_k, H_kv, D_v)``; ``H`` must be a multiple of ``H_kv``.
        cu_seq_lens_q, cu_seq_lens_k: int32 ``(N + 1,)`` cumulative lengths starting at 0.
        max_length_q, max_length_k: longest query / key sequence (Python ints).
        scale: softmax scale (``None``: ``1/sqrt(D)``).
        causal: causal attention inside each sequence (bottom-right aligned when query and key lengths differ).
        sliding_window: transformers' ``sliding_window`` (a query sees itself and ``sliding_window - 1`` keys
            before it), or ``None``.
        dropout: attention dropout probability.
        softcap: attention logit soft-capping (``tanh(x / softcap) * softcap``), or ``None``.
        sinks: per-head sink logits ``(H,)`` (GPT-OSS), or ``None``. With either, ``"sdpa_loop"`` computes the
            scores of each sequence explicitly (:func:`scores_attention`); ``"torch_varlen"`` refuses them.

    Returns:
        ``(total_q, H, D_v)``.

    >>> q = torch.randn(5, 2, 4); kv = torch.randn(5, 1, 4)
    >>> cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    >>> out = run_varlen_attention("sdpa_loop", q, kv, kv, cu, cu, 3, 3)
    >>> out.shape
    torch.Size([5, 2, 4])
    >>> torch.allclose(out[0], kv[0].expand(2, 4))  # the first token of a sequence only sees itself
    True
    """
    if backend == "sdpa_loop" and (softcap is not None or sinks is not None):
        return _scores_loop(
            query,
            key,
            value,
            cu_seq_lens_q,
            cu_seq_lens_k,
            scale=scale,
            causal=causal,
            sliding_window=sliding_window,
            dropout=dropout,
            softcap=softcap,
            sinks=sinks,
        )
    if backend == "sdpa_loop":
        return _sdpa_loop(
            query,
            key,
            value,
            cu_seq_lens_q,
            cu_seq_lens_k,
            scale=scale,
            causal=causal,
            sliding_window=sliding_window,
            dropout=dropout,
        )
    common = {"scale": scale, "causal": causal, "sliding_window": sliding_window}
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
