"""Which tokens of a flat row are trained: pure functions over template matches.

Single-turn (no instruction template), as TRL 0.19.1: everything up to the end of the **last** response template
is masked; the rest of the example is trained.

Multi-turn (one or more instruction templates): every assistant turn is trained, every other turn masked,
whatever the order of turns. Walking through an example, the end of a response template switches training on;
the start of any instruction template (user, system, tool ...) or of another response template switches it off.
So repeated roles, a leading system turn, tool turns and text cut mid-turn by truncation (the last assistant turn
runs to the end of the example) all come out right.

Example (two examples: tokens 0..5 and 6..9; response template at 1..2 and 7..8, an instruction at 4):
    >>> from trl_padfree.templates import Matches
    >>> resp = Matches(np.array([0, 1]), np.array([1, 7]), np.array([2, 8]))
    >>> instr = Matches(np.array([0]), np.array([4]), np.array([5]))
    >>> mask, found = trained_mask(10, np.array([0, 6, 10]), resp, instr)
    >>> mask.astype(int).tolist(), found.tolist()
    ([0, 0, 1, 1, 0, 0, 0, 0, 1, 1], [True, True])
"""

from __future__ import annotations

import numpy as np

from .templates import Matches


def _fill(n: int, begin: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Boolean mask of length ``n`` that is True on every ``[begin[i], end[i])``."""
    keep = end > begin
    diff = np.bincount(begin[keep], minlength=n + 1) - np.bincount(end[keep], minlength=n + 1)
    return np.cumsum(diff[:n]) > 0


_NEVER = np.iinfo(np.int64).max


def _single_turn(n: int, cu: np.ndarray, resp: Matches, seq_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    threshold = np.full(cu.size - 1, _NEVER, dtype=np.int64)  # first trained token of each example
    # matches come in row order, so assigning in order leaves the last occurrence of each example in place
    order = np.argsort(resp.start, kind="stable")
    threshold[resp.example[order]] = resp.end[order]
    found = threshold != _NEVER
    return np.arange(n, dtype=np.int64) >= threshold[seq_idx], found


def _multi_turn(n: int, cu: np.ndarray, resp: Matches, instr: Matches) -> tuple[np.ndarray, np.ndarray]:
    num = cu.size - 1
    # events: (example, position, priority, switches training on?); at one position "on" is applied before "off",
    # so an empty assistant turn trains nothing.
    ex = np.concatenate([resp.example, resp.example, instr.example])
    pos = np.concatenate([resp.end, resp.start, instr.start])
    on = np.concatenate([np.ones(resp.end.size, bool), np.zeros(resp.start.size + instr.start.size, bool)])
    order = np.lexsort((on == 0, pos, ex))
    begins: list[int] = []
    ends: list[int] = []
    current_ex, training, begin = -1, False, 0
    events = zip(ex[order].tolist(), pos[order].tolist(), on[order].tolist(), strict=True)
    for e, p, o in [*events, (-1, 0, False)]:  # the last event closes the last example's turn
        if e != current_ex:
            if training:
                begins.append(begin)
                ends.append(int(cu[current_ex + 1]))
            current_ex, training = e, False
        if o and not training:
            training, begin = True, p
        elif not o and training:
            training = False
            begins.append(begin)
            ends.append(p)
    found = np.zeros(num, dtype=bool)
    found[resp.example] = True
    return _fill(n, np.array(begins, dtype=np.int64), np.array(ends, dtype=np.int64)), found


def trained_mask(
    n_tokens: int, cu: np.ndarray, responses: Matches, instructions: Matches | None = None,
    seq_idx: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Tokens to train in a flat row of ``n_tokens`` whose examples start at ``cu[:-1]``.

    Returns ``(mask, found)``: ``mask[t]`` is True where token ``t`` is part of a completion, ``found[i]`` is True
    where example ``i`` contains the response template at least once (examples without it are fully masked).
    ``seq_idx`` (the example of every token) is computed when not given.
    """
    if instructions is None:
        if seq_idx is None:
            seq_idx = np.repeat(np.arange(cu.size - 1), np.diff(cu))
        return _single_turn(n_tokens, cu, responses, seq_idx)
    return _multi_turn(n_tokens, cu, responses, instructions)
