"""How an exception reaches the user in a one-line message: its text on one line, cut to a length."""

from __future__ import annotations

__all__ = ["one_line"]


def one_line(exc: BaseException, limit: int | None = 300) -> str:
    """``exc``'s message with its white space folded, cut to ``limit`` characters (``...`` marks a cut; None: no cut).

    An exception without a message gives its type's name.

    >>> one_line(ValueError("a\\n  b"))
    'a b'
    >>> one_line(ValueError("x" * 10), limit=4)
    'xxxx...'
    >>> one_line(StopIteration())
    'StopIteration'
    """
    text = " ".join(str(exc).split()) or type(exc).__name__
    if limit is not None and len(text) > limit:
        return text[:limit] + "..."
    return text
