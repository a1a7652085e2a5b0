"""The collator on 14 real tokenizers, their own chat templates and plain formats, against character-span truth.

The tokenizers are built once by ``make real-tokenizers`` (``make test`` depends on it) from llama.cpp's vocabulary
files; see ``scripts/real_tokenizers.py`` and ``tests/real_cases.py``. Without that cache these tests fail and say
what to run (they never download anything themselves).
"""

from __future__ import annotations

import pytest
from real_cases import (
    CACHE,
    CHAT,
    FAMILIES,
    HI_BYE,
    IGNORE,
    all_cases,
    cache_problem,
    collator_labels,
    load,
    trained_spans,
)

from trl_padfree import DataCollatorForCompletionOnlyLM


@pytest.fixture(scope="session", autouse=True)
def real_tokenizers_built():
    if cache_problem():
        pytest.fail(cache_problem(), pytrace=False)


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizer_gives_the_original_tokenizers_ids(family):
    """Each rebuilt tokenizer reproduces the ids the original gave on llama.cpp's test strings (.inp/.out)."""
    import sys

    sys.path.insert(0, str(CACHE.parent.parent / "scripts"))
    from real_tokenizers import check_against_out, vocab_cases

    tok = load(family)
    cases = vocab_cases((CACHE / family / "vocab-test.inp").read_text(encoding="utf-8"),
                        (CACHE / family / "vocab-test.out").read_text(encoding="utf-8"))
    assert len(cases) >= 40
    assert check_against_out(tok, cases) == []


def _first_difference(tok, case, got) -> str:
    i = next(k for k, (a, b) in enumerate(zip(got, case.labels, strict=True)) if a != b)
    pieces = tok.convert_ids_to_tokens(case.input_ids)
    return (f"{case.family} {case.format}: token {i} {pieces[i]!r} (context {pieces[max(0, i - 3): i + 3]}) "
            f"collator {'trained' if got[i] != IGNORE else 'masked'}, truth {'trained' if case.labels[i] != IGNORE else 'masked'}"
            f"; text {case.text!r}")


@pytest.mark.parametrize("family", FAMILIES)
def test_collator_labels_equal_character_span_truth(family):
    cases = all_cases(family)
    assert sum(c.format == "chat-template" for c in cases) == (len(cases) - 24 if family in CHAT else 0)
    got = collator_labels(cases)
    wrong = [_first_difference(load(family), c, g) for c, g in zip(cases, got, strict=True) if g != c.labels]
    assert not wrong, f"{len(wrong)} of {len(cases)} examples differ; first: {wrong[0]}"
    assert all(any(lab != IGNORE for lab in c.labels) for c in cases)  # the truth trains something everywhere


@pytest.mark.parametrize("family", ["llama-2", "mistral-inst"])
def test_inst_multi_turn_later_user_turns_are_not_trained(family):
    """Defect 1: the '▁' the tokenizer inserts after '<s>' / '</s>' is not text; '▁[' of a user turn is masked."""
    tok = load(family)
    text = tok.apply_chat_template(HI_BYE, tokenize=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    collator = DataCollatorForCompletionOnlyLM("[/INST]", "[INST]", tokenizer=tok, padding_free=True)
    labels = collator([{"input_ids": ids}])["labels"][0].tolist()
    trained = [t for t, lab in zip(tok.convert_ids_to_tokens(ids), labels, strict=True) if lab != IGNORE]
    if family == "llama-2":
        assert text == "<s>[INST] Hi [/INST] Hello </s><s>[INST] Bye [/INST] Ciao </s>"
        assert trained == ["▁Hello", "▁", "</s>", "<s>", "▁C", "iao", "▁", "</s>"]
    else:
        assert text == "<s>[INST] Hi [/INST]Hello</s>[INST] Bye [/INST]Ciao</s>"
        assert trained == ["Hello", "</s>", "C", "iao", "</s>"]


def test_phi3_template_written_by_its_chat_template_is_accepted_and_exact():
    """Defect 2: '<|assistant|>\\n' (what Phi-3's chat template writes) works although '<|assistant|>' swallows
    the newline (rstrip)."""
    tok = load("phi-3")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"},
                {"role": "assistant", "content": "Ciao"}]
    text = tok.apply_chat_template(messages, tokenize=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    collator = DataCollatorForCompletionOnlyLM("<|assistant|>\n", ["<|user|>\n", "<|system|>\n"], tokenizer=tok,
                                               padding_free=True)
    labels = collator([{"input_ids": ids}])["labels"][0].tolist()
    trained = [t for t, lab in zip(tok.convert_ids_to_tokens(ids), labels, strict=True) if lab != IGNORE]
    assert trained == ["▁Hello", "<|end|>", "▁C", "iao", "<|end|>", "<|endoftext|>"]
    assert trained_spans(text, "<|assistant|>\n", ("<|user|>\n", "<|system|>\n")) == [
        (text.index("Hello"), text.index("<|user|>\nBye")), (text.index("Ciao"), len(text))]
