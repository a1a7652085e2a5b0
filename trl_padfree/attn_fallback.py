"""``attn_implementation`` auto's fall-back: a model that cannot use ``"padfree"`` is loaded with its own default.

``trl-padfree train`` and ``trl-padfree check`` resolve ``auto`` alike (:func:`~.attention.pick_attn_implementation`);
when that picks ``"padfree"``, a model whose modeling code cannot be built with it (Falcon keeps a table of its own
attention classes) or never calls it (MPT, BLOOM, XGLM compute attention in their own code) is loaded again with
its default attention (sdpa, else eager), whose packed-sequence mask the packing probe then judges.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from .attention import ATTN_IMPLEMENTATION, load_error_reason
from .probe import uses_padfree_attention

__all__ = ["ModelLoadError", "load_with_fallback"]

Model = TypeVar("Model")


class ModelLoadError(Exception):
    """The model did not load; the message is the reason, on one line (:func:`~.attention.load_error_reason`)."""


def _load(load: Callable[[str | None], Model], attn_implementation: str | None) -> Model:
    try:
        return load(attn_implementation)
    except Exception as exc:
        raise ModelLoadError(load_error_reason(exc, attn_implementation)) from exc


def load_with_fallback(
    load: Callable[[str | None], Model], attn_implementation: str | None, *, auto: bool,
    on_fallback: Callable[[str], Any], inspect: Callable[[Model], bool] = lambda model: True,
) -> Model:
    """``load(attn_implementation)``; when ``auto`` picked ``"padfree"`` and the model cannot use it, ``load(None)``.

    ``load(name)`` loads the model with ``attn_implementation=name`` (None: the model's own default). The model
    cannot use ``"padfree"`` when it fails to load with it, or when its attention code never calls it (looked at
    only where ``inspect(model)`` is true: a process that holds no real weights cannot run it). ``on_fallback(why)``
    hears why before the second load. Whatever ``load`` raises becomes :class:`ModelLoadError`.

    >>> calls = []
    >>> def load(name):
    ...     calls.append(name)
    ...     if name == "padfree":
    ...         raise KeyError("padfree")
    ...     return "model"
    >>> load_with_fallback(load, "padfree", auto=True, on_fallback=lambda why: calls.append(why[:26]))
    'model'
    >>> calls
    ['padfree', 'it fails to load with it (', None]
    >>> load_with_fallback(load, "padfree", auto=False, on_fallback=print)
    Traceback (most recent call last):
    ...
    trl_padfree.attn_fallback.ModelLoadError: its modeling code has no attention class for attn_implementation='padfree' (it keeps a table of its own); use 'sdpa' or 'eager' for this model
    """
    if not (auto and attn_implementation == ATTN_IMPLEMENTATION):
        return _load(load, attn_implementation)
    try:
        model = _load(load, attn_implementation)
    except ModelLoadError as exc:
        why = f"it fails to load with it ({exc})"
    else:
        if not inspect(model) or uses_padfree_attention(model):
            return model
        del model  # one copy of the weights at a time
        why = "its attention code does not go through transformers' AttentionInterface"
    on_fallback(why)
    return _load(load, None)
