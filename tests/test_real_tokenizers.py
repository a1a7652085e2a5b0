"""The collator on 14 real tokenizers (built by ``make real-tokenizers``, which checks each against the original's ids
on llama.cpp's test strings; without them these tests fail saying so), their chat templates and plain formats,
against character-span truth (tests/real_cases.py)."""

from __future__ import annotations

import pytest
import real_cases as rc
from real_cases import real_tokenizers_built  # noqa: F401  (autouse: fails saying how to build them)


def _first_difference(tok, case, got) -> str:
    i = next(k for k, (a, b) in enumerate(zip(got, case.labels, strict=True)) if a != b)
    pieces = tok.convert_ids_to_tokens(case.input_ids)
    return (f"{case.family} {case.format}: token {i} {pieces[i]!r} (context {pieces[max(0, i - 3): i + 3]}) "
            f"collator {'trained' if got[i] != rc.IGNORE else 'masked'}, truth {'trained' if case.labels[i] != rc.IGNORE else 'masked'}"
            f"; text {case.text!r}")


@pytest.mark.parametrize("family", rc.FAMILIES)
def test_collator_labels_equal_character_span_truth(family):
    cases = rc.all_cases(family)
    assert sum(c.format == "chat-template" for c in cases) == (len(cases) - 24 if family in rc.CHAT else 0)
    got = rc.collator_labels(cases)
    wrong = [_first_difference(rc.load(family), c, g) for c, g in zip(cases, got, strict=True) if g != c.labels]
    assert not wrong, f"{len(wrong)} of {len(cases)} examples differ; first: {wrong[0]}"
    assert all(any(lab != rc.IGNORE for lab in c.labels) for c in cases)  # the truth trains something everywhere
