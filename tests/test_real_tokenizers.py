"""The collator on 14 real tokenizers (built by ``make real-tokenizers``; without them these tests fail saying so),
their chat templates and plain formats, against character-span truth (tests/real_cases.py)."""

from __future__ import annotations

import pytest
import real_cases as rc

from trl_padfree import DataCollatorForCompletionOnlyLM


@pytest.fixture(scope="session", autouse=True)
def real_tokenizers_built():
    if rc.cache_problem():
        pytest.fail(rc.cache_problem(), pytrace=False)


@pytest.mark.parametrize("family", rc.FAMILIES)
def test_tokenizer_gives_the_original_tokenizers_ids(family):
    """Each rebuilt tokenizer reproduces the ids the original gave on llama.cpp's test strings (.inp/.out)."""
    import sys

    sys.path.insert(0, str(rc.CACHE.parent.parent / "scripts"))
    from real_tokenizers import check_against_out, vocab_cases

    tok = rc.load(family)
    cases = vocab_cases((rc.CACHE / family / "vocab-test.inp").read_text(encoding="utf-8"),
                        (rc.CACHE / family / "vocab-test.out").read_text(encoding="utf-8"))
    assert len(cases) >= 40
    assert check_against_out(tok, cases) == []


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


@pytest.mark.parametrize("family", ["llama-2", "mistral-inst"])
def test_inst_multi_turn_later_user_turns_are_not_trained(family):
    """Defect 1: the '▁' the tokenizer inserts after '<s>' / '</s>' is not text; '▁[' of a user turn is masked."""
    tok = rc.load(family)
    text = tok.apply_chat_template(rc.HI_BYE, tokenize=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    collator = DataCollatorForCompletionOnlyLM("[/INST]", "[INST]", tokenizer=tok, padding_free=True)
    labels = collator([{"input_ids": ids}])["labels"][0].tolist()
    trained = [t for t, lab in zip(tok.convert_ids_to_tokens(ids), labels, strict=True) if lab != rc.IGNORE]
    if family == "llama-2":
        assert text == "<s>[INST] Hi [/INST] Hello </s><s>[INST] Bye [/INST] Ciao </s>"
        assert trained == ["▁Hello", "▁", "</s>", "<s>", "▁C", "iao", "▁", "</s>"]
    else:
        assert text == "<s>[INST] Hi [/INST]Hello</s>[INST] Bye [/INST]Ciao</s>"
        assert trained == ["Hello", "</s>", "C", "iao", "</s>"]


def test_phi3_template_written_by_its_chat_template_is_accepted_and_exact():
    """Defect 2: Phi-3's '<|assistant|>\\n' works although '<|assistant|>' strips the newline."""
    tok = rc.load("phi-3")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"},
                {"role": "assistant", "content": "Ciao"}]
    text = tok.apply_chat_template(messages, tokenize=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    collator = DataCollatorForCompletionOnlyLM("<|assistant|>\n", ["<|user|>\n", "<|system|>\n"], tokenizer=tok,
                                               padding_free=True)
    labels = collator([{"input_ids": ids}])["labels"][0].tolist()
    trained = [t for t, lab in zip(tok.convert_ids_to_tokens(ids), labels, strict=True) if lab != rc.IGNORE]
    assert trained == ["▁Hello", "<|end|>", "▁C", "iao", "<|end|>", "<|endoftext|>"]
    assert rc.trained_spans(text, "<|assistant|>\n", ("<|user|>\n", "<|system|>\n")) == [
        (text.index("Hello"), text.index("<|user|>\nBye")), (text.index("Ciao"), len(text))]
