"""Names that ``"padfree"``'s attention function (:mod:`trl_padfree.attention`) and its per-family patches
(:mod:`trl_padfree.attention_patches`) both use; :mod:`trl_padfree.attention` exports them."""

from __future__ import annotations

__all__ = ["KV_INDEX", "PadfreeAttentionError"]

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
