"""Small per-family patches that make ``attn_implementation="padfree"`` exact on packed rows.

Some modeling code computes something across the whole row before the attention function is called, where a
packed row's sequence boundaries are invisible. Each patch below wraps one method of one transformers class, and
changes nothing unless the model runs with ``"padfree"`` and without a cache (training and scoring; generation
keeps the original code):

* **Llama-4** (``Llama4TextDecoderLayer.forward``, transformers ``models/llama4/modeling_llama4.py``): the
  attention-temperature scale of the NoPE layers (``attn_temperature_tuning``, ``floor_scale``, ``attn_scale``;
  https://huggingface.co/papers/2501.19399) is computed from ``torch.arange`` over the row, and the decoder layer
  does not forward ``position_ids`` to the attention. The wrapper forwards them (``padfree_position_ids``) and
  switches the row-based scale off for the call; the attention function applies the same formula to
  ``position_ids`` and cuts chunked-attention layers (``attention_chunk_size``) into chunks that restart with each
  example's positions.
* **Gemma-4** (``Gemma4TextModel._maybe_slice_kv_shared_inputs``, ``models/gemma4/modeling_gemma4.py``): before the
  KV-sharing layers (``num_kv_shared_layers``) it slices every layer mask as a 4-D tensor; ``"padfree"``'s mask for
  a packed row is 1-D ``cu_seq_lens``. The wrapper keeps the inputs unsliced there, as it does for
  ``flash_attention_2`` (logits are still cut to ``logits_to_keep`` by the head).
* **DeepSeek-V4** (``DeepseekV4Attention.forward``, ``models/deepseek_v4/modeling_deepseek_v4.py``): the CSA/HCA
  compressors group the row into windows of ``compress_rate`` tokens from the row's first position, and their
  indexer picks top-k windows over the whole row. On a packed row the wrapper runs the attention block of a
  compressing layer once per sequence (its own windows, indexer and mask, exactly as for the sequence alone);
  sliding-only layers stay one varlen call, with the boundaries passed as ``cu_seq_lens_q/k`` (the module would
  zero-pad the 1-D mask to the key length). A compressing layer gets eager's additive mask in every case (one
  sequence per row too), because the module appends its compressor's causal block bias (query ``t`` sees
  compressed window ``w`` only once ``t + 1 >= (w + 1) * compress_rate``) only to a tensor mask: without one
  every query would see every compressed window, future ones included, and a boolean mask would take the bias
  cast to bool, i.e. inverted.

:func:`apply_patches` is called by the ``"padfree"`` mask builder with the model's config, i.e. at the start of
every forward pass, before any decoder layer runs; it imports and patches only the family of that config, once.

>>> from transformers import AutoConfig
>>> apply_patches(AutoConfig.for_model("llama"))  # no patch for this family
[]
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import torch

__all__ = ["KV_INDEX", "PATCHED_FAMILIES", "PadfreeAttentionError", "apply_patches", "padfree_active"]

ATTN_IMPLEMENTATION = "padfree"
KV_INDEX = "padfree_kv_index"
"""Keyword argument (a 1-D int64 tensor over the flattened tokens) that lays out the keys/values of a packed row.

When a forward passes it, key and value tokens are gathered with it before the varlen kernel runs, and
``cu_seq_lens_k`` / ``max_length_k`` describe the gathered keys. A token can so serve as a key of several query
segments: a prompt computed once is attended to by the chosen and by the rejected response of a preference pair
(:mod:`trl_padfree.preference`). Only ``"padfree"`` reads it; other implementations would ignore it, so callers
must refuse them (:func:`~trl_padfree.trainer.require_padfree_attention`).
"""


class PadfreeAttentionError(ValueError):
    """A model feature that the ``"padfree"`` attention implementation cannot compute exactly."""


POSITION_IDS = "padfree_position_ids"
"""Keyword argument by which the Llama-4 patch hands ``position_ids`` to the attention function."""
TEMPERATURE = "padfree_temperature"
"""Keyword argument ``(floor_scale, attn_scale)``: the attention function applies Llama-4's temperature scale."""


def padfree_active(config: Any, cache: Any = None) -> bool:
    """Whether a patched method should take its ``"padfree"`` route: the config uses it and there is no cache.

    >>> from transformers import AutoConfig
    >>> padfree_active(AutoConfig.for_model("llama"))
    False
    """
    return cache is None and getattr(config, "_attn_implementation", None) == ATTN_IMPLEMENTATION


def _wrap(cls: type | None, name: str, make: Callable[[Callable], Callable]) -> bool:
    """Wrap ``cls.name`` once; nothing when this transformers has no such class or method."""
    original = getattr(cls, name, None)
    if original is None or getattr(original, "_padfree_patch", False):
        return False
    wrapped = functools.wraps(original)(make(original))
    wrapped._padfree_patch = True
    setattr(cls, name, wrapped)
    return True


def _cache_argument(args: tuple, kwargs: dict[str, Any], index: int) -> Any:
    """The ``cache`` (or older ``past_key_values``) argument of a call, positional at ``index`` or by keyword."""
    if "cache" in kwargs:
        return kwargs["cache"]
    if "past_key_values" in kwargs:
        return kwargs["past_key_values"]
    return args[index] if len(args) > index else None


def _patch_llama4(module: Any) -> None:
    def make(original: Callable) -> Callable:
        def forward(self, hidden_states, *args, **kwargs):
            attn = self.self_attn
            # decoder layer signature: (hidden_states, attention_mask, position_ids, cache, ...)
            if not padfree_active(attn.config, _cache_argument(args, kwargs, 2)):
                return original(self, hidden_states, *args, **kwargs)
            position_ids = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
            kwargs[POSITION_IDS] = position_ids
            if not (attn.attn_temperature_tuning and not attn.use_rope):
                return original(self, hidden_states, *args, **kwargs)
            kwargs[TEMPERATURE] = (attn.floor_scale, attn.attn_scale)
            attn.attn_temperature_tuning = False  # the attention function scales by position_ids instead
            try:
                return original(self, hidden_states, *args, **kwargs)
            finally:
                attn.attn_temperature_tuning = True

        return forward

    _wrap(getattr(module, "Llama4TextDecoderLayer", None), "forward", make)


def _patch_gemma4(module: Any) -> None:
    def make(original: Callable) -> Callable:
        def slice_inputs(self, hidden_states, per_layer_inputs, position_embeddings, causal_mask_mapping, *args,
                         **kwargs):
            packed = any(isinstance(mask, torch.Tensor) and mask.ndim == 1 for mask in causal_mask_mapping.values())
            if packed and self.config._attn_implementation == ATTN_IMPLEMENTATION:
                return hidden_states, per_layer_inputs, position_embeddings, causal_mask_mapping
            return original(self, hidden_states, per_layer_inputs, position_embeddings, causal_mask_mapping, *args,
                            **kwargs)

        return slice_inputs

    _wrap(getattr(module, "Gemma4TextModel", None), "_maybe_slice_kv_shared_inputs", make)


_BOUNDARY_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")


def _sequence_starts(position_ids: torch.Tensor | None, batch: int) -> list[list[int]] | None:
    """Per row, the starts of its sequences plus the row length; ``None`` when no row packs several sequences.

    >>> _sequence_starts(torch.tensor([[0, 1, 0, 1, 2]]), 1)
    [[0, 2, 5]]
    >>> _sequence_starts(torch.tensor([[0, 1, 2]]), 2) is None
    True
    """
    if position_ids is None or position_ids.ndim != 2 or position_ids.shape[1] < 2:
        return None
    positions = position_ids.expand(batch, -1)
    new = torch.ones_like(positions, dtype=torch.bool)
    new[:, 1:] = positions[:, 1:] - positions[:, :-1] != 1
    if not bool(new[:, 1:].any()):
        return None
    length = positions.shape[1]
    return [row.nonzero().reshape(-1).tolist() + [length] for row in new]


def _additive_mask(attention_mask: torch.Tensor | None, hidden_states: torch.Tensor, sliding_window: int | None
                   ) -> torch.Tensor:
    """The additive ``(B or 1, 1, S, S)`` mask eager attention gets (0 = attend, the dtype's minimum = not).

    ``None`` stands for the sliding-window causal mask of one sequence per row; a boolean mask (``sdpa``'s, True =
    attend) is converted; an additive one is returned as is.

    >>> _additive_mask(None, torch.zeros(1, 3, 2), 2)[0, 0].eq(0).int().tolist()
    [[1, 0, 0], [1, 1, 0], [0, 1, 1]]
    """
    from .attention_backends import window_mask

    dtype, device = hidden_states.dtype, hidden_states.device
    if attention_mask is None:
        length = hidden_states.shape[1]
        attention_mask = window_mask(length, length, sliding_window, True, device)[None, None]
    if attention_mask.dtype != torch.bool:
        return attention_mask
    mask = torch.zeros(attention_mask.shape, dtype=dtype, device=device)
    return mask.masked_fill(~attention_mask, torch.finfo(dtype).min)


def _patch_deepseek_v4(module: Any) -> None:
    def make(original: Callable) -> Callable:
        def forward(self, hidden_states, position_embeddings, position_ids, attention_mask, *args, **kwargs):
            cache = _cache_argument(args, kwargs, 0)
            starts = None
            packed_mask = isinstance(attention_mask, torch.Tensor) and attention_mask.ndim == 1
            if self.compressor is not None and padfree_active(self.config, cache):
                compiling = torch.compiler.is_compiling()
                if not compiling:
                    # compressing layers run once per sequence (see the module docstring)
                    starts = _sequence_starts(position_ids, hidden_states.shape[0])
                if compiling or (packed_mask and starts is None):
                    # Under torch.compile the row cannot be split on the host (and the mask does not say whether
                    # it packs several sequences): refuse rather than pool windows across sequences.
                    raise PadfreeAttentionError(
                        f"attn_implementation='padfree' cannot split rows into their sequences for DeepSeek-V4's "
                        f"compressed-attention layer {self.layer_idx} ({self.layer_type}) under torch.compile; "
                        "train it without torch.compile, or with attn_implementation='eager' and padding."
                    )
                if starts is None:
                    # One sequence per row: the module extends only a tensor mask with its compressor's block bias,
                    # so hand it eager's additive mask (the padfree mask is None here, or sdpa's boolean one).
                    call = {k: v for k, v in kwargs.items() if k not in _BOUNDARY_KWARGS}
                    mask = _additive_mask(attention_mask, hidden_states, self.sliding_window)
                    return original(self, hidden_states, position_embeddings, position_ids, mask, *args, **call)
            if starts is None:
                if packed_mask and padfree_active(self.config, cache):
                    # The module zero-pads a tensor mask shorter than the keys, which would corrupt "padfree"'s 1-D
                    # cu_seq_lens: hand the boundaries over as keyword arguments instead.
                    if kwargs.get("cu_seq_lens_q") is None:
                        longest = getattr(attention_mask, "padfree_max_length", None)
                        kwargs.update(cu_seq_lens_q=attention_mask, cu_seq_lens_k=attention_mask,
                                      max_length_q=longest, max_length_k=longest)
                    attention_mask = None
                return original(self, hidden_states, position_embeddings, position_ids, attention_mask, *args,
                                **kwargs)

            if kwargs.get(KV_INDEX) is not None:
                raise PadfreeAttentionError(
                    "attn_implementation='padfree' cannot share prompt keys between responses (prompt_once) in "
                    "DeepSeek-V4's compressed-attention layers; hold each prompt once per response "
                    "(prompt_once=False)."
                )
            # the cache argument is ``cache`` in transformers 5.24 and ``past_key_values`` in 5.23: passed as None
            call = {k: v for k, v in kwargs.items() if k not in _BOUNDARY_KWARGS and k not in ("cache", "past_key_values")}
            positions = position_ids.expand(hidden_states.shape[0], -1)
            rows = []
            for r, row_starts in enumerate(starts):
                outputs = []
                for a, b in pairwise(row_starts):
                    # The sequence alone: its sliding-window causal mask as eager builds it (additive, the dtype's
                    # minimum), which the module extends with its compressor's per-query block bias.
                    mask = _additive_mask(None, hidden_states[r : r + 1, a:b], self.sliding_window)
                    embeddings = {
                        k: (cos.expand(len(starts), *cos.shape[1:])[r : r + 1, a:b],
                            sin.expand(len(starts), *sin.shape[1:])[r : r + 1, a:b])
                        for k, (cos, sin) in position_embeddings.items()
                    }
                    out, _ = original(self, hidden_states[r : r + 1, a:b], embeddings, positions[r : r + 1, a:b],
                                      mask, None, **call)
                    outputs.append(out)
                rows.append(torch.cat(outputs, dim=1))
            return torch.cat(rows, dim=0), None

        return forward

    _wrap(getattr(module, "DeepseekV4Attention", None), "forward", make)


PATCHED_FAMILIES: dict[str, tuple[str, Callable[[Any], None]]] = {
    "llama4_text": ("transformers.models.llama4.modeling_llama4", _patch_llama4),
    "llama4": ("transformers.models.llama4.modeling_llama4", _patch_llama4),
    "gemma4_text": ("transformers.models.gemma4.modeling_gemma4", _patch_gemma4),
    "gemma4": ("transformers.models.gemma4.modeling_gemma4", _patch_gemma4),
    "deepseek_v4": ("transformers.models.deepseek_v4.modeling_deepseek_v4", _patch_deepseek_v4),
}
"""model_type -> (modeling module, patch): the families whose modeling code :func:`apply_patches` wraps."""

_applied: set[str] = set()


def apply_patches(config: Any) -> list[str]:
    """Patch the modeling code of ``config``'s family (and its text config's) once; the modules patched now."""
    done = []
    text_config = getattr(config, "text_config", None)
    for model_type in (getattr(config, "model_type", None), getattr(text_config, "model_type", None)):
        entry = PATCHED_FAMILIES.get(model_type)
        if entry is None or entry[0] in _applied:
            continue
        try:
            module = importlib.import_module(entry[0])
        except ImportError:  # a transformers without this family
            continue
        entry[1](module)
        _applied.add(entry[0])
        done.append(entry[0])
    return done
