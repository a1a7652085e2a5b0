"""Finding response / instruction templates in a flattened batch.

A template is given either as a string or as a list of token ids (TRL 0.19.1 accepted both).

- **String templates are matched on text**, whatever tokenization context precedes them: the batch is decoded to
  bytes once (:class:`~trl_padfree.token_text.TokenText`) and the template's bytes are searched there. So
  ``"\\n### Answer:"`` is found even where a sentencepiece-style tokenizer merged the ``"\\n"`` with the characters
  before it, and no hand-slicing of token ids (``encode(...)[2:]``) is needed.
- **Token-id templates are matched on ids**, exactly as TRL 0.19.1 did.

Every match is reported in token coordinates of the flat row: ``start`` is the first token of the template and
``end`` the first token after it. For string templates a token belongs to the span in which its *first byte*
lies; so a token that straddles the template's end (``":P"`` in ``"### Answer:Paris"``) starts inside the
template and is treated as part of it (masked), and a token that straddles an instruction template's start
(``".\\n"`` before ``"\\n### Question:"``) starts in the answer and is trained.

Example:
    >>> t = Template.from_user([7, 8])
    >>> ids = np.array([1, 7, 8, 3, 7, 8, 4,   7, 5])
    >>> find_matches(t, ids, np.array([0, 7, 9]), None)  # two examples: tokens 0..6 and 7..8
    Matches(example=[0, 0], start=[1, 4], end=[3, 6])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .token_text import TokenText, decoder_kinds, tokenizer_steps


@dataclass(frozen=True)
class Template:
    """A response or instruction template: text (matched on decoded bytes) or token ids (matched exactly)."""

    text: str | None = None
    ids: tuple[int, ...] | None = None

    @classmethod
    def from_user(cls, value: str | Sequence[int]) -> Template:
        if isinstance(value, str):
            if not value:
                raise ValueError("a template string must not be empty")
            return cls(text=value)
        try:
            ids = tuple(int(i) for i in value)
        except (TypeError, ValueError):
            raise TypeError(
                f"a template must be a string or a list of token ids, got {type(value).__name__}: {value!r}"
            ) from None
        if not ids:
            raise ValueError("a template token-id list must not be empty")
        return cls(ids=ids)

    def __str__(self) -> str:
        return repr(self.text) if self.text is not None else f"token ids {list(self.ids or ())}"


@dataclass
class Matches:
    """Template occurrences in a flat row: example index, first template token, first token after it."""

    example: np.ndarray
    start: np.ndarray
    end: np.ndarray

    def __repr__(self) -> str:
        return f"Matches(example={self.example.tolist()}, start={self.start.tolist()}, end={self.end.tolist()})"


@dataclass
class RowText:
    """A flat row's token ids with the byte offset where each token starts (plus the total), for text search, and
    the leading bytes of each token that are not text (:meth:`TokenText.skips`), computed once per row."""

    text: TokenText
    ids: np.ndarray
    starts: np.ndarray
    skips: np.ndarray | int

    @classmethod
    def build(cls, text: TokenText, ids: np.ndarray) -> RowText:
        return cls(text, ids, *text.layout(ids))  # raises on an id outside the vocabulary


def _empty() -> Matches:
    e = np.zeros(0, dtype=np.int64)
    return Matches(e, e, e)


def _match_ids(ids_template: tuple[int, ...], ids: np.ndarray, cu: np.ndarray) -> Matches:
    n, length = ids.size, len(ids_template)
    if n < length:
        return _empty()
    cand = np.flatnonzero(ids[: n - length + 1] == ids_template[0])
    for j in range(1, length):
        cand = cand[ids[cand + j] == ids_template[j]]
    example = np.searchsorted(cu, cand, side="right") - 1
    keep = cand + length <= cu[example + 1]  # never across an example boundary
    cand, example = cand[keep], example[keep]
    return Matches(example, cand, cand + length)


def _match_text(pattern: bytes, row: RowText, cu: np.ndarray) -> Matches:
    s = row.text.find(pattern, row.ids, row.starts, row.skips)
    if not s.size:
        return _empty()
    e = s + len(pattern)
    example_bytes = row.starts[cu]
    example = np.searchsorted(example_bytes, s, side="right") - 1
    keep = e <= example_bytes[example + 1]  # never across an example boundary
    s, e, example = s[keep], e[keep], example[keep]
    start = np.searchsorted(row.starts, s, side="left")
    end = np.minimum(np.searchsorted(row.starts, e, side="left"), cu[example + 1])
    return Matches(example, start, end)


def find_matches(template: Template, ids: np.ndarray, cu: np.ndarray, row: RowText | None) -> Matches:
    """All occurrences of ``template`` in the flat row ``ids`` whose examples start at ``cu[:-1]``.

    ``row`` (the row's byte offsets, :class:`RowText`) is needed for string templates only.
    """
    if template.ids is not None:
        return _match_ids(template.ids, ids, cu)
    if row is None:
        raise ValueError(f"matching the string template {template} needs the tokenizer's text table")
    return _match_text(row.text.pattern(template.text), row, cu)


def concat_matches(parts: Sequence[Matches]) -> Matches:
    parts = [p for p in parts if p.example.size]
    if not parts:
        return _empty()
    return Matches(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("example", "start", "end")))


def _normalizer_steps(tokenizer) -> list[str]:
    """Names of the normalizer steps of a fast tokenizer that rewrite text (lower-casing, unicode forms ...)."""
    rewriting = ("Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents", "BertNormalizer", "Precompiled")
    return [s["type"] for s in tokenizer_steps(tokenizer, "normalizer") if s.get("type") in rewriting]


def verify_text_matching(template: Template, tokenizer, text: TokenText) -> None:
    """Check on real text that this tokenizer's tokens read back to the bytes the template is searched for.

    The template is searched the way its tokens read back (spaces the tokenizer inserts after added tokens and
    whitespace swallowed by ``rstrip``/``lstrip`` tokens are accounted for, see :mod:`trl_padfree.token_text`).
    Anything else that stops it being found raises a ``ValueError`` naming the cause and the fix.
    """
    assert template.text is not None
    pattern = text.pattern(template.text)
    probe = f"Some prompt text.{template.text} The answer."
    ids = tokenizer(probe, add_special_tokens=False)["input_ids"]
    data, _ = text.decode(np.asarray(ids))
    if pattern in data:
        return
    steps = _normalizer_steps(tokenizer)
    if steps:
        cause = (f"the tokenizer's normalizer ({', '.join(steps)}) rewrites the text before tokenizing, so the "
                 "template's exact characters are not in the tokens")
    elif data.lower() != probe.encode("utf-8").lower() and pattern.lower() in data.lower():
        cause = "the tokens read back with a different case"
    else:
        cause = (f"this tokenizer's tokens do not read back to the text they came from (decoder steps: "
                 f"{', '.join(sorted(k for k in decoder_kinds(tokenizer) if k)) or 'unknown'})")
    raise ValueError(
        f"The template {template} cannot be located in text tokenized by {type(tokenizer).__name__}: in the probe "
        f"{probe!r} its tokens read back as {data.decode('utf-8', 'replace')!r}, which does not contain "
        f"{pattern.decode('utf-8', 'replace')!r}. Cause: {cause}. Fix: pass the template as the exact token ids it "
        "has inside your formatted examples, e.g. `tokenizer.encode(text_with_template)[i:j]`."
    )
