"""Verifiable rewards for GRPO / RLOO on answers known in advance (the demo's counting, capitals, repetition).

Each function has TRL's reward signature: ``completions`` (strings, or chat message lists) plus the dataset's
columns as keyword arguments; the known answer is the ``answer`` column (or ``chosen``, as in the preference demo
data). Rewards are in [0, 1].

>>> answer_prefix(["1 2 3 9", "7"], answer=["1 2 3 4", "1 2"])
[0.75, 0.0]
>>> exact_match([" BLUE RED", "BLUE"], answer=["BLUE RED", "BLUE RED"])
[1.0, 0.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["ANSWER_COLUMNS", "REWARDS", "answer_chars", "answer_overlap", "answer_prefix", "exact_match"]


def _text(completion: Any) -> str:
    """A completion's text: a string, or the content of the last message of a chat completion."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise TypeError(f"a completion is a string or a list of chat messages, got {type(completion).__name__}")


#: The columns a reward of this module reads the known answer from (the first present): every reward here needs one.
ANSWER_COLUMNS = ("answer", "chosen")


def _answers(n: int, kwargs: dict[str, Any]) -> Sequence[str]:
    answers = kwargs.get("answer", kwargs.get("chosen"))
    if answers is None:
        raise ValueError("these rewards need the known answer: an 'answer' (or 'chosen') column in the prompt records")
    if len(answers) != n:
        raise ValueError(f"{n} completions but {len(answers)} answers")
    return [_text(a) for a in answers]


def answer_prefix(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """Partial credit: the share of the answer's words that the completion reproduces in order from its start,
    up to its first wrong word (``"1 2 3 9"`` for ``"1 2 3 4"``: 0.75); words past the answer's end cost a share
    each, so stopping on time is rewarded too."""
    out = []
    for completion, answer in zip(completions, _answers(len(completions), kwargs), strict=True):
        want, got = answer.split(), _text(completion).split()
        right = 0
        for a, b in zip(want, got, strict=False):
            if a != b:
                break
            right += 1
        extra = max(len(got) - len(want), 0) if right == len(want) else 0
        out.append(max(right - extra, 0) / max(len(want), 1))
    return out


def answer_overlap(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """Partial credit: the share of the answer's words found anywhere in the completion.

    >>> answer_overlap(["b a x"], answer=["a b c d"])
    [0.5]
    """
    out = []
    for completion, answer in zip(completions, _answers(len(completions), kwargs), strict=True):
        want, got = answer.split(), set(_text(completion).split())
        out.append(sum(word in got for word in want) / max(len(want), 1))
    return out


def answer_chars(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """Partial credit a barely trained model can move: the share of the completion's non-space characters that
    occur in the answer (digits for counting, capitals for upper-casing, the word's letters for repetition); an
    empty completion gets 0.

    >>> answer_chars(["12 ab", "", "3 3"], answer=["1 2 3", "1", "3"])
    [0.5, 0.0, 1.0]
    """
    out = []
    for completion, answer in zip(completions, _answers(len(completions), kwargs), strict=True):
        allowed = set(answer) - {" "}
        got = [ch for ch in _text(completion) if not ch.isspace()]
        out.append(sum(ch in allowed for ch in got) / len(got) if got else 0.0)
    return out


def exact_match(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """1.0 when the completion's words are the answer's, else 0.0 (whitespace ignored)."""
    return [float(_text(c).split() == a.split()) for c, a in zip(completions, _answers(len(completions), kwargs),
                                                                    strict=True)]


#: The rewards ``trl-padfree grpo`` / ``rloo`` accept by name (``reward_funcs: [answer_prefix]``).
REWARDS = {"answer_chars": answer_chars, "answer_prefix": answer_prefix, "answer_overlap": answer_overlap, "exact_match": exact_match}
