"""Reading the examples a collator receives: the forms it accepts, and token ids checked before they are used.

An example is either a mapping with ``input_ids`` (and optionally ``labels`` and ``seq_lengths``), as ``datasets``
and SFTTrainer give them, or the token ids themselves, as TRL 0.19.1 and transformers'
``DataCollatorForLanguageModeling`` accepted: a list or tuple of ints, or a 1-D integer ``torch`` tensor or
``numpy`` array. Inside a mapping, ``input_ids`` and ``labels`` may take any of these forms too.

Every id is checked, and a bad one is refused with the example's index in the batch and what to pass instead:

- ids are integers: floats (integral ones such as ``3.0`` too: a float means the ids went through a float column or
  array, where large ids are rounded and missing values become NaN), strings (also numeric ones), nested lists and
  float, bool or string arrays are refused with a :class:`TypeError`;
- ``input_ids`` are ``>= 0`` and, when the vocabulary size is known, below it (numpy would otherwise wrap negative ids
  round the vocabulary); ``-100`` belongs in ``labels``, not in ``input_ids``;
- ``labels`` are token ids or ``ignore_index`` (-100).

Python ints are read with ``array.array("q").fromlist``, which refuses anything that is not an integer in the same
C loop that copies the values (as fast as ``np.fromiter``, which would silently truncate ``2.7`` and parse ``"5"``).

Example:
    >>> ex = read_examples([[5, 6, 7], {"input_ids": (8, 9), "labels": [-100, 4]}], vocab_size=10)
    >>> ex.ids.tolist(), ex.labels.tolist(), ex.sizes
    ([5, 6, 7, 8, 9], [5, 6, 7, -100, 4], [3, 2])
    >>> read_examples([[5, 6], [7, -100]])
    Traceback (most recent call last):
    ...
    ValueError: example 1 of this batch: input_ids[1] is -100; token ids are >= 0. -100 marks ignored 'labels' positions, never input_ids: keep the real token ids in 'input_ids' and put -100 in 'labels'.
"""

from __future__ import annotations

import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["Examples", "VocabularyError", "read_examples", "vocabulary_size"]

_INT64 = "q"
assert array.array(_INT64).itemsize == 8
_TORCH_INTEGER = {torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8}
_WHAT_TO_PASS = "pass a dict with 'input_ids' (a list of token ids), or the list of token ids itself"


class VocabularyError(ValueError):
    """A token id at or beyond the vocabulary size the collator knows."""


@dataclass
class Examples:
    """The examples of one batch, read: ``ids`` and ``labels`` (``None`` when no example brought labels) as flat
    int64 arrays, the number of tokens of every example, and its ``seq_lengths`` (``None`` where not given)."""

    ids: np.ndarray
    labels: np.ndarray | None
    sizes: list[int]
    seq_lengths: list[Any] | None


def vocabulary_size(tokenizer: Any) -> int | None:
    """``len(tokenizer)`` (added tokens included), or None when there is no tokenizer to ask."""
    try:
        return int(len(tokenizer)) if tokenizer is not None else None
    except TypeError:
        return None


def _where(i: int) -> str:
    return f"example {i} of this batch"


def _element_error(values: Sequence[Any], i: int, name: str) -> Exception:
    """The error for the first element of ``values`` that is not a 64-bit integer."""
    for p, x in enumerate(values):
        if isinstance(x, int | np.integer):
            if not -(2**63) <= x < 2**63:
                return ValueError(
                    f"{_where(i)}: {name}[{p}] is {x}; token ids are integers from 0 to the vocabulary size - 1, "
                    "this one is outside any vocabulary. Pass the ids the tokenizer returned."
                )
            continue
        kind = type(x).__name__
        head = f"{_where(i)}: {name}[{p}] is {x!r} (of type {kind}), not a token id."
        if isinstance(x, float | np.floating):
            hint = (
                "Token ids are integers; even integral floats such as 3.0 are refused, because floats mean the ids "
                "went through a float column or array (where large ids are rounded and missing values become NaN). "
                "Pass the ids the tokenizer returned (tokenizer(text)['input_ids']), or convert a column you have "
                "checked with int()."
            )
        elif isinstance(x, str | bytes):
            hint = (
                "Token ids are integers, not text or numeric strings: tokenize the text "
                "(tokenizer(text)['input_ids']) or convert the column with int()."
            )
        elif isinstance(x, Sequence | np.ndarray | torch.Tensor):
            hint = f"Each example's {name} must be a flat list of token ids: pass one list per example."
        else:
            hint = "Token ids are integers: pass the ids the tokenizer returned (tokenizer(text)['input_ids'])."
        return TypeError(f"{head} {hint}")
    return TypeError(f"{_where(i)}: {name} could not be read as token ids; pass a list of ints")


def _append(buf: array.array, value: Any, i: int, name: str) -> int:
    """Append the token ids ``value`` of example ``i`` to ``buf``; return how many there were."""
    if type(value) is list:  # the common case: lists from `datasets`
        try:
            buf.fromlist(value)
        except (TypeError, OverflowError):
            raise _element_error(value, i, name) from None
        return len(value)
    if isinstance(value, torch.Tensor):
        if value.dtype not in _TORCH_INTEGER:
            raise TypeError(
                f"{_where(i)}: {name} has dtype {value.dtype}; token ids are integers: pass an integer tensor "
                "(torch.long, as tokenizer(..., return_tensors='pt') gives) or a list of ints."
            )
        arr = value.detach().cpu().numpy()
    elif isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu":
            raise TypeError(
                f"{_where(i)}: {name} has dtype {value.dtype}; token ids are integers: pass an integer array "
                "(np.int64) or a list of ints."
            )
        arr = value
    elif isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return _append(buf, list(value), i, name)
    else:
        hint = " (tokenize the text first: tokenizer(text)['input_ids'])" if isinstance(value, str) else ""
        raise TypeError(f"{_where(i)}: {name} is of type {type(value).__name__}; pass a list of token ids{hint}.")
    if arr.ndim != 1:
        raise TypeError(
            f"{_where(i)}: {name} has shape {tuple(arr.shape)}; pass a 1-D sequence of token ids per example "
            "(for the (1, n) tensor of tokenizer(text, return_tensors='pt'), pass its row [0])."
        )
    buf.frombytes(np.ascontiguousarray(arr, dtype=np.int64).tobytes())
    return int(arr.shape[0])


def _unpack(features: Sequence[Any]) -> tuple[list[Any], list[Any] | None, list[Any] | None]:
    """``input_ids``, ``labels`` and ``seq_lengths`` of every example (None lists where no example has them)."""
    ids: list[Any] = []
    labels: list[Any] = []
    seq_lengths: list[Any] = []
    for i, f in enumerate(features):
        if type(f) is dict or isinstance(f, Mapping):
            try:
                ids.append(f["input_ids"])
            except KeyError:
                raise KeyError(
                    f"example {i} has no 'input_ids' (keys: {sorted(f)}); tokenize the dataset first, or let "
                    "SFTTrainer prepare it (do not set dataset_kwargs={'skip_prepare_dataset': True})."
                ) from None
            labels.append(f.get("labels"))
            seq_lengths.append(f.get("seq_lengths"))
        elif isinstance(f, list | tuple | np.ndarray | torch.Tensor):
            ids.append(f)
            labels.append(None)
            seq_lengths.append(None)
        else:
            hint = "; tokenize the text first" if isinstance(f, str) else ""
            raise TypeError(f"{_where(i)} is of type {type(f).__name__}; {_WHAT_TO_PASS}{hint}.")
    has_labels = any(v is not None for v in labels)  # (not list.count(None): arrays compare elementwise)
    has_seq = any(v is not None for v in seq_lengths)
    return ids, (labels if has_labels else None), (seq_lengths if has_seq else None)


def _locate(sizes: list[int], flat_index: int) -> tuple[int, int]:
    """(example, position in the example) of a token of the flat row."""
    starts = np.cumsum([0, *sizes])
    i = int(np.searchsorted(starts, flat_index, side="right") - 1)
    return i, flat_index - int(starts[i])


def _check_ids(ids: np.ndarray, sizes: list[int], vocab_size: int | None) -> None:
    if not ids.size:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0:
        t = int(np.flatnonzero(ids < 0)[0])
        i, p = _locate(sizes, t)
        v = int(ids[t])
        advice = (
            " -100 marks ignored 'labels' positions, never input_ids: keep the real token ids in 'input_ids' and put "
            "-100 in 'labels'."
            if v == -100
            else " Pass the ids the tokenizer returned."
        )
        raise ValueError(f"{_where(i)}: input_ids[{p}] is {v}; token ids are >= 0.{advice}")
    if vocab_size is not None and high >= vocab_size:
        t = int(np.flatnonzero(ids >= vocab_size)[0])
        i, p = _locate(sizes, t)
        raise VocabularyError(
            f"{_where(i)}: token id {int(ids[t])} is outside the tokenizer's vocabulary (size {vocab_size}) at "
            f"input_ids[{p}]; the collator's tokenizer must be the one that tokenized the dataset (pass the same "
            "tokenizer, with any tokens you added)."
        )


def _check_labels(labels: np.ndarray, sizes: list[int], vocab_size: int | None, ignore_index: int) -> None:
    if not labels.size:
        return
    low, high = int(labels.min()), int(labels.max())
    too_high = vocab_size is not None and high >= vocab_size
    negative = low < 0 and (low != ignore_index or bool(((labels < 0) & (labels != ignore_index)).any()))
    if not (too_high or negative):
        return
    bad = (labels != ignore_index) & ((labels < 0) | (labels >= (vocab_size if vocab_size is not None else 2**63 - 1)))
    t = int(np.flatnonzero(bad)[0])
    i, p = _locate(sizes, t)
    v = int(labels[t])
    if v < 0:
        raise ValueError(
            f"{_where(i)}: labels[{p}] is {v}; labels are token ids or {ignore_index} (ignore_index: not trained). "
            f"Put {ignore_index} on the positions not to train."
        )
    raise VocabularyError(
        f"{_where(i)}: labels[{p}] is {v}, outside the tokenizer's vocabulary (size {vocab_size}); labels are token "
        f"ids or {ignore_index} (not trained)."
    )


def read_examples(features: Sequence[Any], *, vocab_size: int | None = None, ignore_index: int = -100) -> Examples:
    """Read and check a batch of examples (see the module docstring for the forms accepted).

    An example without ``labels`` in a batch where others have them gets its ``input_ids`` as labels, as TRL's
    ``DataCollatorForLanguageModeling`` does; the labels that were given are kept as they are.
    """
    if isinstance(features, Mapping):
        raise TypeError(
            f"the collator takes a list of examples, got a dict of columns (keys {sorted(features)[:8]}), as a "
            "dataset slice ds[a:b] gives; pass a list of examples, e.g. [ds[i] for i in range(a, b)]."
        )
    if not isinstance(features, list | tuple):
        features = list(features)  # any iterable of examples
    if not features:
        raise ValueError("the collator received an empty list of examples")
    id_values, label_values, seq_lengths = _unpack(features)
    buf = array.array(_INT64)
    sizes = [_append(buf, v, i, "input_ids") for i, v in enumerate(id_values)]
    ids = np.frombuffer(buf, dtype=np.int64) if len(buf) else np.zeros(0, dtype=np.int64)
    _check_ids(ids, sizes, vocab_size)
    labels = None
    if label_values is not None:
        label_buf = array.array(_INT64)
        offset = 0
        for i, (v, size) in enumerate(zip(label_values, sizes, strict=True)):
            if v is None:
                label_buf.frombytes(ids[offset : offset + size].tobytes())
            else:
                n = _append(label_buf, v, i, "labels")
                if n != size:
                    raise ValueError(f"example {i}: 'labels' has {n} entries but 'input_ids' has {size}")
            offset += size
        labels = np.frombuffer(label_buf, dtype=np.int64)
        _check_labels(labels, sizes, vocab_size, ignore_index)
    return Examples(ids, labels, sizes, seq_lengths)
