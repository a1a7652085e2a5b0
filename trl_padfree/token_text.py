"""Token ids -> the exact text bytes they stand for, vectorised.

Template matching works on text, not on token ids: ``"\\n### Answer:"`` is tokenized differently depending on
the characters before it (TRL #1820, #1550), but the *bytes* it occupies in the decoded text are always the same.
:class:`TokenText` maps every vocabulary entry to its bytes once, so decoding a whole batch is one numpy gather,
and byte offsets map back to token indices with ``searchsorted``.

Supported tokenizer families (read from the tokenizer's own decoder, then verified on real text):

- byte-level BPE (GPT-2, Llama-3, Qwen, Mistral-Nemo ...): the GPT-2 byte <-> unicode table is inverted;
- metaspace / sentencepiece-style (Llama-2, Mistral-7B, Gemma ...): ``"▁"`` is a space and ``<0xNN>`` byte-fallback
  tokens are the byte ``NN``;
- WordPiece-style ``"##"`` continuations, and plain vocabularies whose tokens are their own text.

Added/special tokens (``<|im_start|>``, ``</s>``) are their literal content.

Two things tokenizers do around added tokens put bytes in the token stream that are not in the text, or drop
bytes that are; both are measured on the tokenizer itself (no model names), see :class:`TextQuirks`:

- **a prefix space that is not in the text**: sentencepiece-style tokenizers with the legacy pre-processing
  (``Prepend("▁")``, Llama-2, Mistral v0.1) or ``prepend_scheme="always"`` start every piece of text between
  added tokens with ``"▁"``: ``"</s><s>[INST]"`` becomes ``</s>``, ``<s>``, ``"▁["``. That space is not text: it is
  dropped from a token that follows an added token, so ``"▁["`` starts at ``"["``. (The space such tokenizers put
  at the start of a whole text is kept as it is: an example's first token is never trained.)
- **whitespace swallowed by an added token** with ``rstrip``/``lstrip`` (Phi-3's ``<|assistant|>``, ``<|end|>``):
  ``"<|assistant|>\nHi"`` is tokenized as ``<|assistant|>``, ``"▁Hi"``; the ``"\n"`` exists in no token. A
  template's bytes are searched the way its tokens read back: whitespace right of an ``rstrip`` token and left of
  an ``lstrip`` token is left out (:meth:`TokenText.pattern`).

Example:
    >>> from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    >>> from transformers import PreTrainedTokenizerFast
    >>> vocab = {"<eos>": 0, "▁###": 1, "▁Answer": 2, ":": 3, "▁4": 4, "<0x0A>": 5}
    >>> raw = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True))
    >>> raw.pre_tokenizer = pre_tokenizers.Metaspace()
    >>> raw.decoder = decoders.Sequence([decoders.Metaspace(), decoders.ByteFallback(), decoders.Fuse()])
    >>> tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>")
    >>> text = TokenText.from_tokenizer(tok)
    >>> data, starts = text.decode(np.array([5, 1, 2, 3, 4, 0]))
    >>> data
    b'\\n ### Answer: 4<eos>'
    >>> starts.tolist()  # byte offset where each token starts, plus the total
    [0, 1, 5, 12, 13, 15, 20]
"""

from __future__ import annotations

import contextlib
import json
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from transformers.convert_slow_tokenizer import bytes_to_unicode

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def tokenizer_steps(tokenizer, part: str) -> list[dict]:
    """The steps of a fast tokenizer's ``part`` (``"decoder"``, ``"normalizer"``), nested sequences flattened."""
    backend = getattr(tokenizer, "backend_tokenizer", None)

    def walk(node: dict) -> list[dict]:
        return [node, *(step for child in node.get(part + "s") or [] for step in walk(child))]

    return walk(json.loads(backend.to_str()).get(part) or {}) if backend is not None else []


def decoder_kinds(tokenizer) -> set[str]:
    """Names of the decoder steps of a fast tokenizer (``{"ByteLevel"}``, ``{"Metaspace", "ByteFallback"}`` ...)."""
    steps = tokenizer_steps(tokenizer, "decoder")
    metaspace = any(s.get("type") == "Replace" and s.get("pattern", {}).get("String") == "▁" for s in steps)
    return {s.get("type", "") for s in steps} | ({"Metaspace"} if metaspace else set())


def token_bytes(tokenizer) -> list[bytes]:
    """The bytes each token id stands for, for ids ``0 .. len(tokenizer) - 1``."""
    size = len(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(size)))
    added = {int(i): str(t) for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    kinds = decoder_kinds(tokenizer)
    if not kinds:  # slow tokenizer: guess from the vocabulary itself
        if any(p and p.startswith("Ġ") for p in pieces):
            kinds = {"ByteLevel"}
        elif any(p and "▁" in p for p in pieces):
            kinds = {"Metaspace", "ByteFallback"}
    byte_level = "ByteLevel" in kinds
    # GPT-2's table of printable stand-ins for the 256 byte values, inverted
    unicode_to_byte = {c: b for b, c in bytes_to_unicode().items()} if byte_level else {}
    out: list[bytes] = []
    for i, piece in enumerate(pieces):
        if i in added and not (_BYTE_FALLBACK.match(added[i]) and "ByteFallback" in kinds):
            out.append(added[i].encode("utf-8"))
        elif piece is None:
            out.append(b"")
        elif byte_level:
            try:
                out.append(bytes(unicode_to_byte[c] for c in piece))
            except KeyError:  # a vocabulary entry outside the byte alphabet: take it literally
                out.append(piece.encode("utf-8"))
        else:
            m = _BYTE_FALLBACK.match(piece)
            if m and "ByteFallback" in kinds:
                out.append(bytes([int(m.group(1), 16)]))
            elif "WordPiece" in kinds:
                out.append(piece[2:].encode() if piece.startswith("##") else b" " + piece.encode())
            else:
                out.append(piece.replace("▁", " ").encode("utf-8"))
    return out


@dataclass(frozen=True)
class TextQuirks:
    """Whitespace a tokenizer adds or drops around added tokens (measured by :func:`measure_quirks`)."""

    space_after_added: bool = False  # a text piece that follows an added token gets a "▁" that is not in the text
    strip_right: tuple[str, ...] = ()  # added tokens that swallow the whitespace after them (rstrip)
    strip_left: tuple[str, ...] = ()  # added tokens that swallow the whitespace before them (lstrip)


def _added_token_info(tokenizer) -> list[tuple[int, str, bool, bool]]:
    """``(id, content, rstrip, lstrip)`` of the tokenizer's added tokens, byte-fallback tokens (``<0x0A>``) left out."""
    out = []
    for i, tok in sorted(getattr(tokenizer, "added_tokens_decoder", {}).items()):
        content = str(tok)
        if _BYTE_FALLBACK.match(content):
            continue
        out.append((int(i), content, bool(getattr(tok, "rstrip", False)), bool(getattr(tok, "lstrip", False))))
    return out


def measure_quirks(tokenizer, table: Sequence[bytes]) -> TextQuirks:
    """Ask the tokenizer itself whether it prefixes text pieces with a space, and which added tokens strip."""
    info = _added_token_info(tokenizer)

    def reads_back(text: str) -> bytes:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return b"".join(table[i] for i in ids)

    after = False
    plain = [c for _, c, r, lft in info if not r and not lft]
    if plain:
        marker = plain[0]
        after = reads_back(f"{marker}a b") == f"{marker} a b".encode()
    return TextQuirks(
        space_after_added=after,
        strip_right=tuple(c for _, c, r, _ in info if r),
        strip_left=tuple(c for _, c, _, lft in info if lft),
    )


def template_bytes(template: str, quirks: TextQuirks) -> bytes:
    """The bytes a template occupies in token text: whitespace swallowed by ``rstrip``/``lstrip`` tokens left out.

    >>> template_bytes("<|assistant|>\\n", TextQuirks(strip_right=("<|assistant|>",)))
    b'<|assistant|>'
    >>> template_bytes("### Answer:", TextQuirks(strip_right=("<|assistant|>",)))
    b'### Answer:'
    """
    text = template
    for token in quirks.strip_right:
        text = re.sub(re.escape(token) + r"\s+", lambda m, t=token: t, text)
    for token in quirks.strip_left:
        text = re.sub(r"\s+" + re.escape(token), lambda m, t=token: t, text)
    return text.encode("utf-8")


#: tokenizer -> (fingerprint, TokenText): a large vocabulary takes seconds to map, and the launch builds collators
#: several times
_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class _Anchor:
    """Where one byte of a pattern (its rarest in the vocabulary) occurs inside every token."""

    index: int  # position of the anchor byte in the pattern
    has: np.ndarray  # per token id: does it hold the anchor byte at all (bool, cheap to gather)
    count: np.ndarray  # per token id: how often the anchor byte occurs in it
    first: np.ndarray  # per token id: offset of its first entry in ``inner``
    inner: np.ndarray  # byte offsets of the anchor inside the tokens, concatenated


class TokenText:
    """A vocabulary's token bytes packed in one buffer, for vectorised decoding and searching of id arrays."""

    def __init__(self, table: Sequence[bytes], added_ids: Sequence[int] = (), quirks: TextQuirks | None = None):
        self.table = list(table)
        self.quirks = quirks or TextQuirks()
        self.added = np.zeros(len(table), dtype=bool)  # tokens that split text into pieces (added tokens)
        if len(added_ids):
            self.added[np.asarray(added_ids, dtype=np.int64)] = True
        # tokens whose leading space may be one the tokenizer inserted (see the module docstring)
        self.space_first = np.fromiter((t[:1] == b" " for t in table), dtype=bool, count=len(table)) & ~self.added
        self._skips = self.quirks.space_after_added
        self.lengths = lengths = np.fromiter((len(b) for b in table), dtype=np.int64, count=len(table))
        self.offsets = np.zeros(len(table), dtype=np.int64)
        if len(table) > 1:
            np.cumsum(lengths[:-1], out=self.offsets[1:])
        self.buffer = np.frombuffer(b"".join(table), dtype=np.uint8)
        self.vocab_size = len(table)
        self._anchors: dict[bytes, _Anchor] = {}

    @classmethod
    def from_tokenizer(cls, tokenizer) -> TokenText:
        """The table of ``tokenizer``; built once per tokenizer (and again if its vocabulary or added tokens change)."""
        info = _added_token_info(tokenizer)
        key = (len(tokenizer), tuple(info))
        cached = None
        with contextlib.suppress(TypeError):  # (a tokenizer that is not weak-referenceable is not cached)
            cached = _BUILT.get(tokenizer)
        if cached is not None and cached[0] == key:
            return cached[1]
        table = token_bytes(tokenizer)
        text = cls(table, [i for i, _, _, _ in info if i < len(table)], measure_quirks(tokenizer, table))
        with contextlib.suppress(TypeError):
            _BUILT[tokenizer] = (key, text)
        return text

    def pattern(self, template: str) -> bytes:
        """The bytes ``template`` occupies in this tokenizer's token text (see :func:`template_bytes`)."""
        return template_bytes(template, self.quirks)

    def skips(self, ids: np.ndarray) -> np.ndarray | int:
        """Per position, the leading bytes of the token that are not text (a space the tokenizer inserted): 0 or 1."""
        if not self._skips or not ids.size:
            return 0
        skip = np.zeros(ids.size, dtype=bool)
        skip[1:] = self.added[ids[:-1]]
        return (skip & self.space_first[ids]).astype(np.int64)

    def check_ids(self, ids: np.ndarray) -> None:
        if ids.size and not 0 <= ids.min() <= ids.max() < self.vocab_size:
            bad = int(ids[(ids < 0) | (ids >= self.vocab_size)][0])
            raise ValueError(
                f"token id {bad} is outside the tokenizer's vocabulary (size {self.vocab_size}); the collator's "
                "tokenizer must be the one that tokenized the dataset."
            )

    def layout(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray | int]:
        """The byte offset where each token of ``ids`` starts in the decoded text (plus the total length), and
        :meth:`skips` of ``ids``, for callers that pass both on to :meth:`find`."""
        try:
            lengths = self.lengths[ids]
        except IndexError:
            self.check_ids(ids)  # raises, naming the bad id
            raise
        skips = self.skips(ids)
        starts = np.zeros(ids.size + 1, dtype=np.int64)
        np.cumsum(lengths - skips, out=starts[1:])
        return starts, skips

    def decode(self, ids: np.ndarray) -> tuple[bytes, np.ndarray]:
        """Concatenated bytes of ``ids`` and the byte offset where each token starts (length ``len(ids) + 1``)."""
        ids = np.asarray(ids, dtype=np.int64)
        self.check_ids(ids)
        starts, skips = self.layout(ids)
        return self._bytes(ids, starts, skips), starts

    def _bytes(self, ids: np.ndarray, starts: np.ndarray, skips: np.ndarray | int) -> bytes:
        """The text of ``ids`` whose token byte offsets are ``starts``: one gather from the packed buffer."""
        gather = np.repeat(self.offsets[ids] + skips - starts[:-1], starts[1:] - starts[:-1])
        return self.buffer[gather + np.arange(starts[-1], dtype=np.int64)].tobytes()

    def _holders(self, byte: int) -> tuple[np.ndarray, np.ndarray]:
        """Every occurrence of ``byte`` in the vocabulary: ``(token id, offset inside the token)``, in id order."""
        where = np.flatnonzero(self.buffer == byte)
        token = np.searchsorted(self.offsets, where, side="right") - 1  # empty tokens hold nothing
        return token, where - self.offsets[token]

    def _anchor(self, pattern: bytes) -> _Anchor:
        if pattern not in self._anchors:
            holders = {b: self._holders(b) for b in set(pattern)}
            tokens_with = {b: np.unique(t).size for b, (t, _) in holders.items()}
            index = min(range(len(pattern)), key=lambda i: (tokens_with[pattern[i]], i))
            token, inner = holders[pattern[index]]
            count = np.bincount(token, minlength=len(self.table)).astype(np.int64)
            first = np.zeros(len(self.table), dtype=np.int64)
            np.cumsum(count[:-1], out=first[1:])
            self._anchors[pattern] = _Anchor(index, count > 0, count, first, inner.astype(np.int64))
        return self._anchors[pattern]

    def find(
        self, pattern: bytes, ids: np.ndarray, starts: np.ndarray, skips: np.ndarray | int | None = None
    ) -> np.ndarray:
        """Byte offsets of every (possibly overlapping) occurrence of ``pattern`` in the text of ``ids``.

        ``starts`` (and ``skips``, computed here when not given) are those :meth:`layout` returns for ``ids``.

        Only the tokens holding the pattern's rarest byte are looked at: each of them proposes where an occurrence
        would start, and the proposals are checked byte by byte, all at once. Equivalent to searching the fully
        decoded text (which is what happens when too many tokens hold that byte).
        """
        if skips is None:
            skips = self.skips(ids)
        anchor = self._anchor(pattern)
        tokens = np.flatnonzero(anchor.has[ids])
        m = len(pattern)
        if tokens.size * m > starts[-1]:  # the anchor is everywhere: a plain search is cheaper
            data = self._bytes(ids, starts, skips)
            found, i = [], data.find(pattern)
            while i >= 0:
                found.append(i)
                i = data.find(pattern, i + 1)
            return np.array(found, dtype=np.int64)
        counts = anchor.count[ids[tokens]]
        if counts.size and counts.max() > 1:  # tokens holding the anchor byte several times: one proposal each
            token = np.repeat(tokens, counts)
            rank = np.arange(token.size) - np.repeat(np.cumsum(counts) - counts, counts)
        else:
            token, rank = tokens, 0
        inner = anchor.inner[anchor.first[ids[token]] + rank]
        if not np.isscalar(skips):  # an anchor inside a skipped (inserted) space proposes nothing
            skipped = skips[token]
            keep = inner >= skipped
            inner, token = (inner - skipped)[keep], token[keep]
        begin = starts[token] + inner - anchor.index
        begin = begin[(begin >= 0) & (begin + m <= starts[-1])]
        window = begin[:, None] + np.arange(m)
        holder = np.searchsorted(starts, window, side="right") - 1
        first = self.offsets[ids[holder]] + (skips[holder] if not np.isscalar(skips) else 0)
        data = self.buffer[first + window - starts[holder]]
        return begin[(data == np.frombuffer(pattern, dtype=np.uint8)).all(axis=1)]
