"""``formatting_func`` written either way: per example (TRL >= 0.13, 1.x) or for batches (TRL 0.10).

TRL 1.x calls ``SFTTrainer(formatting_func=f)`` with one example at a time (a dict of values) and expects one
string. Up to 0.12 it called ``f`` with a batch (a dict of lists) and expected a list of strings, one per record:
the convention of the blog post this package starts from, whose function
``for i in range(len(example['instruction'])): ... example['instruction'][i]`` fails (or silently iterates over
characters) when handed one example. :func:`formatting_convention` tells the two apart on the first record;
:class:`FormattingFunc` applies the function the way it was written (a batched one to one-record batches) and
refuses, naming both conventions, what returns anything else.

>>> def per_example(example):
...     return f"### Question: {example['q']}\\n ### Answer: {example['a']}"
>>> def batched(batch):
...     return [f"### Question: {q}\\n ### Answer: {a}" for q, a in zip(batch["q"], batch["a"])]
>>> record = {"q": "Count to 3.", "a": "1 2 3"}
>>> formatting_convention(per_example, record), formatting_convention(batched, record)
('example', 'batch')
>>> FormattingFunc(batched, announce=False)(record) == per_example(record)
True
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

PER_EXAMPLE = "example"
BATCHED = "batch"

CONVENTIONS = (
    "TRL >= 0.13 (1.x) calls formatting_func with one example (a dict of values, e.g. example['instruction'] is a "
    "string) and expects one string; TRL 0.10 called it with a batch (a dict of lists, e.g. "
    "example['instruction'][i]) and expected a list of strings, one per record"
)
BATCHED_LINE = (
    "[trl-padfree] formatting_func is written for batches (TRL 0.10's convention: a dict of lists in, a list of "
    "strings out); TRL 1.x calls it per example, so it is applied to one-record batches"
)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _outcome(func: Callable[[Any], Any], argument: dict[str, Any]) -> tuple[Any, BaseException | None]:
    try:
        return func(argument), None
    except Exception as error:  # the user's function may fail in any way on the convention it was not written for
        return None, error


def _said(result: Any, error: BaseException | None) -> str:
    return f"raised {type(error).__name__}: {error}" if error is not None else f"returned {_shown(result)}"


def formatting_convention(func: Callable[[Any], Any], record: Mapping[str, Any]) -> str:
    """``"example"`` or ``"batch"``: how ``func`` is written, told on one ``record`` (a dict of values).

    Per example when ``func(record)`` returns a string. For batches when ``func`` returns a list with one string for
    the one-record batch ``{key: [value]}`` and, given the record itself, fails or returns anything but a
    one-string list (a batched function handed one example iterates over the characters of its strings). Anything
    else raises a ``TypeError`` (a ``ValueError`` when it fails both ways) naming both conventions.

    >>> formatting_convention(lambda ex: [ex["q"]], {"q": "x"})  # a list of one string either way: cannot tell
    Traceback (most recent call last):
    ...
    TypeError: formatting_func: cannot tell how it is written (...
    >>> formatting_convention(lambda ex: len(ex), {"q": "x"})
    Traceback (most recent call last):
    ...
    TypeError: formatting_func: cannot tell how it is written (...
    """
    record = dict(record)
    one, one_error = _outcome(func, dict(record))
    if one_error is None and isinstance(one, str):
        return PER_EXAMPLE
    batch, batch_error = _outcome(func, {key: [value] for key, value in record.items()})
    one_string_list = isinstance(batch, list) and len(batch) == 1 and isinstance(batch[0], str)
    one_looks_batched = isinstance(one, list) and len(one) == 1 and all(isinstance(text, str) for text in one)
    if batch_error is None and one_string_list and not one_looks_batched:
        return BATCHED
    message = (
        f"formatting_func: cannot tell how it is written ({CONVENTIONS}). On the first record it "
        f"{_said(one, one_error)} when called with one example, and {_said(batch, batch_error)} when called with a "
        "batch of that one record. Make it return one string for one example (or a list of strings, one per "
        "record, for a batch)"
    )
    if one_error is not None and batch_error is not None:
        raise ValueError(message) from one_error
    raise TypeError(message)


def first_record(dataset: Any) -> dict[str, Any] | None:
    """The first record of a ``datasets.Dataset`` / ``IterableDataset`` / list of dicts (the first of a dict of
    datasets), or None when there is none to look at."""
    if isinstance(dataset, Mapping) and not hasattr(dataset, "column_names"):
        dataset = next(iter(dataset.values()), None)
    if dataset is None:
        return None
    try:
        record = dataset[0] if hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__") else next(iter(dataset))
    except (IndexError, StopIteration, KeyError, TypeError):
        return None
    return dict(record) if isinstance(record, Mapping) else None


class FormattingFunc:
    """A user's ``formatting_func`` called per example, as TRL 1.x calls it, whichever way it was written.

    ``convention``: ``"example"``, ``"batch"`` or None (told on the first call, by :func:`formatting_convention`).
    A batched function is called with one-record batches and its one string taken. A result that is not one string
    (per example) or a list of one string (a batch of one) raises a ``TypeError`` naming both conventions.
    ``announce``: print :data:`BATCHED_LINE` once (on the main process) when the function is written for batches.
    """

    def __init__(self, func: Callable[[Any], Any], convention: str | None = None, announce: bool = True):
        if isinstance(func, FormattingFunc):
            convention, func = convention or func.convention, func.func
        if not callable(func):
            raise TypeError(f"formatting_func must be a function of one example (or of a batch), got {_shown(func)}")
        self.func = func
        self.convention = convention
        self.announce = announce

    def tell(self, record: Mapping[str, Any]) -> str:
        """Tell (once) how the function is written, on ``record``; says so in one line when it is for batches."""
        if self.convention is None:
            self.convention = formatting_convention(self.func, record)
            if self.convention == BATCHED and self.announce and os.environ.get("RANK", "0") == "0":
                print(BATCHED_LINE, flush=True)
        return self.convention

    def __call__(self, example: Mapping[str, Any]) -> str:
        if self.tell(example) == PER_EXAMPLE:
            text = self.func(example)
            if not isinstance(text, str):
                raise TypeError(f"formatting_func returned {_shown(text)} for one example; it must return one string "
                                f"({CONVENTIONS})")
            return text
        texts = self.func({key: [value] for key, value in example.items()})
        if not (isinstance(texts, list) and len(texts) == 1 and isinstance(texts[0], str)):
            raise TypeError(f"formatting_func (written for batches) returned {_shown(texts)} for a batch of one "
                            f"record; it must return a list with one string per record ({CONVENTIONS})")
        return texts[0]
