"""The ``"padfree"`` attention implementation: varlen attention for padding-free batches on every device.

Importing this module registers ``"padfree"`` with transformers' ``AttentionInterface`` and
``AttentionMaskInterface``, so ``from_pretrained(..., attn_implementation="padfree")`` works. A padding-free batch is
one row of concatenated examples with ``position_ids`` restarting at 0 (and, from this package's collator,
``cu_seq_lens_q/k`` + ``max_length_q/k``); transformers' ``sdpa`` builds a dense ``(1, 1, T, T)`` block mask for it,
``flash_attention_2`` needs flash-attn and a GPU; ``"padfree"`` runs varlen attention, each example to itself.

**Mask builder** (:func:`padfree_mask`): with no padding mask, cache offset or overlay it probes the mask pattern on
the two diagonals next to the main one (``O(T)``) and returns None (plain causal) or, when examples are packed, a
1-D int32 ``cu_seq_lens`` over the ``B*T`` tokens; otherwise exactly ``sdpa``'s mask (``sdpa_mask``).

**Attention function** (:func:`padfree_attention_forward`): boundaries from the ``cu_seq_lens_q/k`` keywords, else
the mask builder's ``cu_seq_lens``, else restarting ``position_ids`` (batch 1, no cache; transformers 5.x decoder
layers pass them on). With boundaries the fastest correct kernel runs
(:func:`~trl_padfree.attention_backends.decide_backend`: flash-attn, torch's ``varlen_attn``, or an exact
per-sequence SDPA loop, warned once on CUDA); without them (padded batch, decode step) transformers'
``sdpa_attention_forward`` with the same arguments, or, for a mask-free batch whose sliding window is shorter than
its rows, each row as one sequence.

Exact on packed rows (loss and every gradient equal to each example alone with ``eager``): GQA/MQA, sliding windows,
dropout, non-causal modules, soft-capping (``softcap``) and sinks (``s_aux``: GPT-OSS, Granite-SWA, DeepSeek-V4;
their scores computed explicitly, :func:`~trl_padfree.attention_backends.scores_attention`), Llama-4's chunked
attention (also with shared prompt keys, :data:`KV_INDEX`) and temperature scale, Gemma-4's KV sharing and
DeepSeek-V4's compressed layers (the last three through per-family wrappers applied by the mask builder,
:mod:`trl_padfree.attention_patches`).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, causal_mask_function, sdpa_mask
from transformers.utils import is_flash_attn_2_available

from .attention_backends import (
    BACKENDS,
    decide_backend,
    flash_attn_available,
    run_varlen_attention,
    scores_attention,
    select_backend,
    torch_varlen_available,
    window_mask,
)
from .attention_patches import KV_INDEX, POSITION_IDS, TEMPERATURE, PadfreeAttentionError, apply_patches
from .exception_text import one_line
from .recurrent import note_mask, prepare_packed_config

__all__ = [
    "ATTN_IMPLEMENTATION", "KV_INDEX", "BACKENDS", "PadfreeAttentionError", "counting_calls",
    "cu_seq_lens_from_position_ids", "flash_attn_available", "load_error_reason", "padfree_attention_forward",
    "padfree_mask", "pick_attn_implementation", "register", "select_backend", "torch_varlen_available",
]  # fmt: skip

ATTN_IMPLEMENTATION = "padfree"


def pick_attn_implementation(device: str | torch.device | None = None) -> str:
    """Best attention implementation for padding-free training on ``device``.

    ``"flash_attention_2"`` where flash-attn is really usable (the package imports, CUDA is available and the
    device is a CUDA device or unspecified), else ``"padfree"``.

    >>> pick_attn_implementation("cpu")
    'padfree'
    """
    if device is not None and torch.device(device).type != "cuda":
        return ATTN_IMPLEMENTATION
    if torch.cuda.is_available() and flash_attn_available() and is_flash_attn_2_available():
        return "flash_attention_2"
    return ATTN_IMPLEMENTATION


def load_error_reason(exc: BaseException, attn_implementation: str | None) -> str:
    """Why a model failed to load, in one line; names the fix when it cannot be built with ``attn_implementation``.

    Some modeling code (Falcon's, for one) picks its attention class from a table of its own, so a registered
    implementation such as ``"padfree"`` fails there with a bare ``KeyError``.

    >>> load_error_reason(KeyError("padfree"), "padfree")[:74]
    "its modeling code has no attention class for attn_implementation='padfree'"
    >>> load_error_reason(OSError("no  config.json   in dir"), "sdpa")
    'no config.json in dir'
    """
    if isinstance(exc, KeyError) and attn_implementation and exc.args and exc.args[0] == attn_implementation:
        return (
            f"its modeling code has no attention class for attn_implementation={attn_implementation!r} (it keeps "
            "a table of its own); use 'sdpa' or 'eager' for this model"
        )
    return one_line(exc, limit=None)


def cu_seq_lens_from_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Cumulative sequence lengths (int32) over the flattened tokens of ``position_ids`` ``(B, T)``.

    A new sequence starts at every row start and wherever the position does not follow the previous one
    (the rule transformers uses for its packed-sequence masks).

    >>> cu_seq_lens_from_position_ids(torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])).tolist()
    [0, 3, 5, 9]
    >>> cu_seq_lens_from_position_ids(torch.tensor([[0, 1], [0, 1]])).tolist()
    [0, 2, 4]
    """
    batch, length = position_ids.shape
    new_sequence = torch.ones(batch, length, dtype=torch.bool, device=position_ids.device)
    new_sequence[:, 1:] = position_ids[:, 1:] - position_ids[:, :-1] != 1
    starts = new_sequence.reshape(-1).nonzero().reshape(-1)
    end = torch.tensor([batch * length], device=position_ids.device, dtype=starts.dtype)
    return torch.cat([starts, end]).to(torch.int32)


def _is_tracing() -> bool:
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def padfree_mask(
    batch_size: int, q_length: int, kv_length: int, q_offset: int | torch.Tensor = 0, kv_offset: int = 0,
    mask_function=causal_mask_function, attention_mask: torch.Tensor | None = None, use_vmap: bool = False,
    device: torch.device | str = "cpu", config: Any = None, **kwargs: Any,
) -> torch.Tensor | None:
    """Mask builder registered for ``"padfree"`` in ``AttentionMaskInterface`` (see the module docstring).

    Returns ``None`` for plain causal attention without padding, a 1-D int32 ``cu_seq_lens`` tensor (attribute
    ``padfree_max_length``) over the ``batch_size * q_length`` tokens when the pattern packs several sequences
    per row, and otherwise exactly what ``sdpa`` gets from ``transformers.masking_utils.sdpa_mask``.

    >>> padfree_mask(batch_size=2, q_length=5, kv_length=5) is None  # causal, no padding, no cache
    True
    >>> padfree_mask(batch_size=1, q_length=3, kv_length=3, attention_mask=torch.tensor([[True, True, False]])).shape
    torch.Size([1, 1, 3, 3])
    """
    # Recurrent layers of the model (short convolutions, linear attention): varlen kernels from this forward on
    prepare_packed_config(config)
    note_mask(None)
    sdpa_kwargs = dict(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                       kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                       use_vmap=use_vmap, device=device, **kwargs)
    if config is not None:
        sdpa_kwargs["config"] = config
    # Qwen4-Exp's token indexer reads the dense mask itself (modeling_qwen4_exp.py: "the mask is never None here")
    dense = "indexed_attention" in (getattr(config, "layer_types", None) or ())
    if dense:
        sdpa_kwargs["allow_is_causal_skip"] = False
    plain = (attention_mask is None and not use_vmap and isinstance(q_offset, int) and q_offset == 0
             and kv_offset == 0 and kv_length == q_length and not _is_tracing())
    if config is not None:
        apply_patches(config)  # before any decoder layer of this forward runs (see attention_patches)
    if not plain:
        return sdpa_mask(**sdpa_kwargs)
    if q_length == 1 and not dense:
        return None
    # Probe the pattern next to the diagonal: (q=i, kv=i-1) is False exactly where a new sequence starts, and
    # (q=i-1, kv=i) is True only for non-causal overlays (bidirectional blocks), which we leave to sdpa.
    rows = torch.arange(batch_size, device=device)[:, None]
    cols = torch.arange(1, q_length, device=device)[None, :]
    head = torch.zeros((), dtype=torch.long, device=device)
    shape = (batch_size, q_length - 1)
    previous = torch.as_tensor(mask_function(rows, head, cols, cols - 1), device=device).expand(shape)
    future = torch.as_tensor(mask_function(rows, head, cols - 1, cols), device=device).expand(shape)
    sees_future, has_starts = torch.stack([future.any(), (~previous).any()]).tolist()
    if sees_future or dense:
        note_mask(batch_size * q_length, packed=has_starts, dense=True)
        return sdpa_mask(**sdpa_kwargs)
    if not has_starts:
        return None
    new_sequence = torch.ones(batch_size, q_length, dtype=torch.bool, device=device)
    new_sequence[:, 1:] = ~previous
    starts = new_sequence.reshape(-1).nonzero().reshape(-1).tolist()
    cu = starts + [batch_size * q_length]
    cu_seq_lens = torch.tensor(cu, dtype=torch.int32, device=device)
    cu_seq_lens.padfree_max_length = max(b - a for a, b in pairwise(cu))
    note_mask(batch_size * q_length, packed=True)
    return cu_seq_lens


def _boundaries(
    query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None, kwargs: dict[str, Any]
) -> tuple[torch.Tensor, torch.Tensor, int, int] | None:
    """``(cu_q, cu_k, max_q, max_k)`` over the flattened tokens, or ``None`` when there are no boundaries."""
    batch, q_length, k_length = query.shape[0], query.shape[2], key.shape[2]
    cu_q = kwargs.get("cu_seq_lens_q")
    if cu_q is not None and (attention_mask is None or attention_mask.ndim == 1):
        cu_k = kwargs.get("cu_seq_lens_k")
        cu_k = cu_q if cu_k is None else cu_k
        max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
        if cu_q.ndim != 1 or cu_k.ndim != 1:
            raise ValueError(
                f"cu_seq_lens_q/k must be 1-D (N+1,) tensors, got shapes {tuple(cu_q.shape)} and "
                f"{tuple(cu_k.shape)}; flatten them (e.g. cu_seq_lens_q.view(-1)) in the collator."
            )
        max_q = _as_int(max_q, cu_q)
        max_k = max_q if max_k is None and cu_k is cu_q else _as_int(max_k, cu_k)
        kv_index = kwargs.get(KV_INDEX)
        if query.device.type == "cpu":
            total_q, total_k = int(cu_q[-1]), int(cu_k[-1])
            keys = batch * k_length if kv_index is None else kv_index.numel()
            if total_q != batch * q_length or total_k != keys:
                raise ValueError(
                    f"cu_seq_lens_q/k cover {total_q}/{total_k} tokens but the batch has {batch}x{q_length} "
                    f"query and {keys} key tokens; pass cu_seq_lens that describe exactly this batch."
                )
        return cu_q, cu_k, max_q, max_k
    if attention_mask is not None and attention_mask.ndim == 1:
        if q_length != k_length:
            raise ValueError(
                "A padfree sequence-boundary mask cannot be used with a cache (query length "
                f"{q_length} != key length {k_length}); pass use_cache=False for packed batches."
            )
        max_length = getattr(attention_mask, "padfree_max_length", None)
        if max_length is None:
            max_length = int((attention_mask[1:] - attention_mask[:-1]).max())
        return attention_mask, attention_mask, max_length, max_length
    position_ids = kwargs.get("position_ids")
    if (attention_mask is None and position_ids is not None and batch == 1 and q_length == k_length > 1
            and position_ids.shape[-1] == q_length and not _is_tracing()):
        position_ids = position_ids.reshape(1, -1)
        if bool((position_ids[:, 1:] - position_ids[:, :-1] != 1).any()):
            cu = cu_seq_lens_from_position_ids(position_ids)
            max_length = max(b - a for a, b in pairwise(cu.tolist()))
            return cu, cu, max_length, max_length
    return None


_call_counter: list[int] | None = None


@contextlib.contextmanager
def counting_calls() -> Iterator[list[int]]:
    """Count the calls of :func:`padfree_attention_forward` inside the block (``counter[0]``).

    A model whose attention code does not go through transformers' ``AttentionInterface`` never calls it, so
    ``attn_implementation="padfree"`` has no effect there; the packing probe uses this to say so.

    >>> with counting_calls() as counter:
    ...     pass
    >>> counter[0]
    0
    """
    global _call_counter
    previous, _call_counter = _call_counter, [0]
    try:
        yield _call_counter
    finally:
        _call_counter = previous


@functools.cache
def _warn_slow_cuda(reason: str) -> None:
    """Say once per reason that a CUDA call runs the exact but slower per-sequence loop, and what to change."""
    warnings.warn(f'attn_implementation="padfree" runs a per-sequence sdpa loop on this GPU (exact, but slower '
                  f"than a varlen kernel): {reason}.", stacklevel=4)


def _as_int(value: Any, cu: torch.Tensor) -> int:
    return int((cu[1:] - cu[:-1]).max() if value is None else value.max() if isinstance(value, torch.Tensor) else value)


def padfree_attention_forward(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
    sliding_window: int | None = None, softcap: float | None = None, is_causal: bool | None = None,
    s_aux: torch.Tensor | None = None, **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention function registered as ``"padfree"`` (see the module docstring).

    Takes transformers' attention-function arguments (``query`` ``(B, H, Tq, D)``, ``key``/``value``
    ``(B, H_kv, Tk, D)``) and returns ``((B, Tq, H, D_v), None)`` like ``sdpa_attention_forward``.
    """
    if _call_counter is not None:
        _call_counter[0] += 1
    position_ids = kwargs.pop(POSITION_IDS, None)  # from the Llama-4 patch (attention_patches)
    temperature = kwargs.pop(TEMPERATURE, None)
    batch, heads, q_length, _ = query.shape
    k_length = key.shape[2]
    if temperature is not None:
        query = _temperature_scaled(query, position_ids, *temperature)
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    features = softcap is not None or s_aux is not None
    bounds = _boundaries(query, key, attention_mask, kwargs)
    chunk = _attention_chunk(module)
    if chunk is not None and kwargs.get(KV_INDEX) is not None:
        if bounds is None or bounds[0] is bounds[1]:
            model_type = getattr(getattr(module, "config", None), "model_type", None) or type(module).__name__
            raise PadfreeAttentionError(
                f"attn_implementation='padfree' does not support chunked attention (attention_chunk_size={chunk}) "
                f"with prompt keys shared by several responses ({KV_INDEX}) but no cu_seq_lens_q/k of the shared "
                f"layout, which model type {model_type!r} uses. Pass the collator's batch as it is, or hold each "
                "prompt once per response (prompt_once=False)."
            )
        *bounds, keep = _chunked_shared(bounds, chunk)
        kwargs[KV_INDEX] = kwargs[KV_INDEX].to(keep.device)[keep]
    elif chunk is not None and q_length == k_length and (attention_mask is None or attention_mask.ndim == 1):
        bounds = _chunked(bounds, chunk, position_ids, batch, q_length, query.device)
    if bounds is None:
        window_binds = sliding_window is not None and max(q_length, k_length) > sliding_window
        if attention_mask is None and window_binds and q_length == k_length:
            # No dense mask was built (see padfree_mask): every row is one sequence with a binding window.
            cu = torch.arange(0, (batch + 1) * q_length, q_length, dtype=torch.int32, device=query.device)
            bounds = (cu, cu, q_length, k_length)
        elif features:
            # A dense mask (padded batch, cache) or none (one causal sequence per row): the scores computed
            # explicitly, which sdpa cannot do with soft-capping or sinks.
            mask = attention_mask
            if mask is None and (causal or window_binds):
                mask = window_mask(q_length, k_length, sliding_window, causal, query.device)
            out = scores_attention(
                query, key, value, mask, scale=scaling, softcap=softcap, sinks=s_aux, dropout=dropout
            )
            return out.transpose(1, 2), None
        else:
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, is_causal=is_causal, **kwargs)
    cu_q, cu_k, max_q, max_k = bounds
    cu_q = cu_q.to(device=query.device, dtype=torch.int32)
    cu_k = cu_q if cu_k is bounds[0] else cu_k.to(device=query.device, dtype=torch.int32)
    head_dim = max(query.shape[-1], value.shape[-1])
    backend, slow_reason = decide_backend(
        query.device, query.dtype, dropout=dropout, head_dim=head_dim, softcap=softcap is not None,
        sinks=s_aux is not None,
    )
    if backend == "torch_varlen" and kwargs.get(KV_INDEX) is not None and cu_q is not cu_k:
        # Shared keys give query segments shorter than their keys; whether torch's varlen_attn aligns the causal
        # mask bottom-right there (as flash-attn >= 2.1 does) has not been checked on a GPU: take the exact loop.
        backend, slow_reason = "sdpa_loop", (
            "shared prompt keys (prompt_once) on torch's varlen_attn are unverified; pip install flash-attn for a "
            "varlen kernel with bottom-right causal alignment"
        )
    if slow_reason is not None:  # a CUDA call that falls back to the loop
        _warn_slow_cuda(slow_reason)
    # (B, H, T, D) -> token-major (B*T, H, D); a view when B == 1.
    q = query.transpose(1, 2).reshape(batch * q_length, heads, query.shape[-1])
    k = key.transpose(1, 2).reshape(batch * k_length, key.shape[1], key.shape[-1])
    v = value.transpose(1, 2).reshape(batch * k_length, value.shape[1], value.shape[-1])
    kv_index = kwargs.get(KV_INDEX)
    if kv_index is not None and cu_q is not cu_k:  # keys shared by several query segments (see KV_INDEX)
        kv_index = kv_index.to(k.device)
        k, v = k.index_select(0, kv_index), v.index_select(0, kv_index)
    out = run_varlen_attention(backend, q, k, v, cu_q, cu_k, max_q, max_k, scale=scaling, causal=causal,
                               sliding_window=sliding_window, dropout=dropout, softcap=softcap, sinks=s_aux)
    return out.reshape(batch, q_length, heads, value.shape[-1]), None


def _temperature_scaled(
    query: torch.Tensor, position_ids: torch.Tensor | None, floor_scale: float, attn_scale: float
) -> torch.Tensor:
    """Llama-4's attention-temperature scale of the NoPE layers, from ``position_ids`` (not the row's positions).

    The formula of ``Llama4TextAttention.forward`` (transformers ``models/llama4/modeling_llama4.py``), applied to
    ``query`` ``(B, H, T, D)``.
    """
    if position_ids is None:
        raise ValueError("Llama-4 attention temperature tuning under 'padfree' needs position_ids; pass them.")
    positions = position_ids.reshape(-1, 1, query.shape[2], 1).to(query.device)
    scales = torch.log1p(torch.floor((positions.float() + 1.0) / floor_scale)) * attn_scale + 1.0
    return (query * scales).to(query.dtype)


def _attention_chunk(module: torch.nn.Module) -> int | None:
    """``attention_chunk_size`` of a chunked-attention layer (Llama-4's ``"chunked_attention"``), else ``None``."""
    config = getattr(module, "config", None)
    chunk = getattr(config, "attention_chunk_size", None)
    layer_types = getattr(config, "layer_types", None)
    layer_idx = getattr(module, "layer_idx", None)
    if chunk is None or layer_types is None or layer_idx is None or layer_idx >= len(layer_types):
        return None
    return int(chunk) if layer_types[layer_idx] == "chunked_attention" else None


def _chunked(bounds: tuple | None, chunk: int, position_ids: torch.Tensor | None, batch: int, length: int,
             device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int, int] | None:
    """Sequence boundaries cut into attention chunks that restart with every sequence's positions.

    From ``position_ids`` where the Llama-4 patch forwards them (a new piece where the position does not follow
    the previous one or is a multiple of ``chunk``), else by offset from each sequence start of ``bounds`` (or of
    each row). ``None`` when nothing is cut (one piece per row, no packing).
    """
    if position_ids is not None and position_ids.shape[-1] == length and not _is_tracing():
        positions = position_ids.reshape(-1, length).expand(batch, length).to(device)
        new = torch.ones(batch, length, dtype=torch.bool, device=device)
        new[:, 1:] = (positions[:, 1:] - positions[:, :-1] != 1) | (positions[:, 1:] % chunk == 0)
        starts = new.reshape(-1).nonzero().reshape(-1).tolist() + [batch * length]
    else:
        rows = list(range(0, (batch + 1) * length, length)) if bounds is None else bounds[0].tolist()
        starts = [p for a, b in pairwise(rows) for p in range(a, b, chunk)] + [rows[-1]]
    if bounds is None and len(starts) == batch + 1:
        return None
    cu = torch.tensor(starts, dtype=torch.int32, device=device)
    longest = max(b - a for a, b in pairwise(starts))
    return cu, cu, longest, longest


def _chunked_shared(
    bounds: tuple[torch.Tensor, torch.Tensor, int, int] | list, chunk: int
) -> tuple[torch.Tensor, torch.Tensor, int, int, torch.Tensor]:
    """Segments of shared prompt keys (:data:`KV_INDEX`) cut into attention chunks.

    Each key segment is one sequence (the prompt's keys, then the response's) at positions ``0 .. Lk-1``; its query
    segment is the sequence's last ``Lq`` tokens (bottom-right causal alignment). Chunk ``c`` holds positions
    ``[c*chunk, (c+1)*chunk)``: its queries attend to its keys up to themselves. Returns the pieces' ``cu_seq_lens_q``,
    ``cu_seq_lens_k``, their longest, and which of the gathered keys the pieces use, in order (keys of chunks no
    query of the segment is in are left out).

    >>> cu_q, cu_k, mq, mk, keep = _chunked_shared((torch.tensor([0, 6, 9]), torch.tensor([0, 6, 13]), 6, 7), 4)
    >>> cu_q.tolist(), cu_k.tolist(), keep.tolist()
    ([0, 4, 6, 9], [0, 4, 6, 9], [0, 1, 2, 3, 4, 5, 10, 11, 12])
    """
    cu_q, cu_k = bounds[0].tolist(), bounds[1].tolist()
    new_q, new_k, keep = [0], [0], []
    for (q0, q1), (k0, k1) in zip(pairwise(cu_q), pairwise(cu_k), strict=True):
        n_q, n_k = q1 - q0, k1 - k0
        if n_q > n_k:
            raise ValueError(f"a query segment of {n_q} tokens has only {n_k} keys: not a shared-prompt layout")
        first = n_k - n_q  # position of the segment's first query
        for start in range(first - first % chunk, n_k, chunk):
            end = min(start + chunk, n_k)
            new_q.append(new_q[-1] + end - max(start, first))
            new_k.append(new_k[-1] + end - start)
            keep.extend(range(k0 + start, k0 + end))
    device = bounds[0].device
    return (*(torch.tensor(cu, dtype=torch.int32, device=device) for cu in (new_q, new_k)),
            *(max(b - a for a, b in pairwise(cu)) for cu in (new_q, new_k)),
            torch.tensor(keep, dtype=torch.long, device=device))


def register() -> None:
    """Register ``"padfree"`` in transformers' attention and mask interfaces (idempotent; done on import)."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, padfree_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, padfree_mask)


register()
