"""The vectorised token -> bytes table and the anchored search agree with a plain search of the decoded text."""

from __future__ import annotations

import numpy as np
import pytest

from trl_padfree.testing import tiny_byte_level_tokenizer, tiny_metaspace_tokenizer
from trl_padfree.token_text import TokenText


def all_occurrences(data: bytes, pattern: bytes) -> list[int]:
    return [i for i in range(len(data) - len(pattern) + 1) if data[i : i + len(pattern)] == pattern]


@pytest.mark.parametrize("make", [tiny_byte_level_tokenizer, tiny_metaspace_tokenizer])
def test_decode_matches_tokenizer_text_and_anchored_find_equals_plain_search(make):
    tok = make()
    text = TokenText.from_tokenizer(tok)
    sample = "### Question: café, naïve?\n### Answer: déjà vu ✓ <|assistant|>ok"
    ids = tok(sample, add_special_tokens=False)["input_ids"]
    data, starts = text.decode(np.array(ids))
    assert data.decode("utf-8").strip() == sample
    assert starts[-1] == len(data) and len(starts) == len(ids) + 1
    # the anchored search finds what a plain search of the decoded text finds
    rng = np.random.default_rng(0)
    for trial in range(60):
        ids = rng.integers(0, len(tok), size=int(rng.integers(1, 300)))
        data, starts = text.decode(ids)
        if trial % 3 == 0:  # random junk patterns, mostly absent
            pattern = bytes(rng.integers(32, 127, size=int(rng.integers(1, 6))).tolist())
        else:  # a substring of the text: present at least once
            a = int(rng.integers(0, max(1, len(data) - 1)))
            pattern = data[a : a + int(rng.integers(1, 12))] or b"#"
        assert text.find(pattern, ids, starts).tolist() == all_occurrences(data, pattern), (trial, pattern)


def test_frequent_anchor_falls_back_to_plain_search(tok):
    text = TokenText.from_tokenizer(tok)
    ids = np.array(tok("a a a a a a a a", add_special_tokens=False)["input_ids"])
    data, starts = text.decode(ids)
    assert text.find(b" a", ids, starts).tolist() == all_occurrences(data, b" a") == [1, 3, 5, 7, 9, 11, 13]
