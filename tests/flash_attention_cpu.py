"""transformers' real ``flash_attention_2`` code path on a CPU, for tests: flash-attn's varlen kernel replaced by a
plain-PyTorch reference that records every call (the ``flash_attention_2_on_cpu`` fixture of tests/conftest.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import transformers.modeling_flash_attention_utils as fa_utils


def reference_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                     softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, deterministic=False):
    """flash-attn's ``flash_attn_varlen_func`` contract in plain PyTorch, checked; records each call."""
    reference_varlen.calls.append((cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))
    assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32
    assert type(max_seqlen_q) is int and type(max_seqlen_k) is int
    bounds = cu_seqlens_q.tolist()
    assert max(b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)) == max_seqlen_q
    out = torch.empty_like(q)
    groups = q.shape[1] // k.shape[1]
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        qs, ks, vs = (x[a:b].transpose(0, 1) for x in (q, k, v))
        ks, vs = ks.repeat_interleave(groups, 0), vs.repeat_interleave(groups, 0)
        out[a:b] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=softmax_scale).transpose(0, 1)
    return out


def _no_other_path(*args, **kwargs):
    raise AssertionError("transformers took a flash-attention path other than varlen with the collator's kwargs")


def use_reference_varlen(monkeypatch) -> list:
    """transformers' flash_attention_2 dispatch on :func:`reference_varlen`; returns its calls."""
    reference_varlen.calls = []
    monkeypatch.setattr(fa_utils, "_loaded_implementation", "flash_attention_2")
    monkeypatch.setattr(fa_utils, "_flash_fn", _no_other_path)
    monkeypatch.setattr(fa_utils, "_flash_varlen_fn", reference_varlen)
    monkeypatch.setattr(fa_utils, "_flash_with_kvcache_fn", None)
    monkeypatch.setattr(fa_utils, "_pad_fn", _no_other_path)
    monkeypatch.setattr(fa_utils, "_unpad_fn", _no_other_path)
    monkeypatch.setattr(fa_utils, "_process_flash_kwargs_fn", fa_utils._lazy_define_process_function(reference_varlen))
    monkeypatch.setattr(fa_utils, "_process_with_kvcache_kwargs_fn", dict)
    monkeypatch.setattr(fa_utils, "_is_packed_sequence", _no_other_path)  # no inference from position_ids
    return reference_varlen.calls
