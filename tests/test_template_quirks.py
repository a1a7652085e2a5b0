"""Whitespace that tokenizers insert or swallow around added tokens, measured on the tokenizer (no real cache)."""

from __future__ import annotations

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers
from transformers import PreTrainedTokenizerFast

from trl_padfree import DataCollatorForCompletionOnlyLM
from trl_padfree.token_text import TextQuirks, TokenText, measure_quirks

IGNORE = -100


def _spm(rstrip: bool = False, lowercase: bool = False) -> PreTrainedTokenizerFast:
    """Sentencepiece-style, legacy pre-processing (Prepend + Replace on every piece between added tokens)."""
    chars = "▁" + "".join(map(chr, range(33, 127)))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<|assistant|>": 3, "<|user|>": 4}
    vocab.update({f"<0x{b:02X}>": len(vocab) + b for b in range(256)})
    for c in [*chars, "▁[", "▁A", "▁C"]:
        vocab.setdefault(c, len(vocab))
    merges = [("▁", "["), ("▁", "A"), ("▁", "C")]
    raw = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
    steps = [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    raw.normalizer = normalizers.Sequence(([normalizers.Lowercase()] if lowercase else []) + steps)
    raw.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    raw.add_special_tokens([AddedToken(t, rstrip=rstrip and t.startswith("<|"), normalized=False)
                            for t in ("<s>", "</s>", "<|assistant|>", "<|user|>")])
    return PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def test_quirks_are_measured_and_template_bytes_leave_out_whitespace_a_header_swallows_or_a_tokenizer_inserts():
    tok = _spm(rstrip=True)
    text = TokenText.from_tokenizer(tok)
    assert measure_quirks(tok, text.table) == TextQuirks(space_after_added=True, strip_right=("<|assistant|>", "<|user|>"))
    assert text.pattern("<|assistant|>\n") == b"<|assistant|>"
    assert text.pattern("\n<|assistant|>\n") == b"\n<|assistant|>"
    assert TokenText.from_tokenizer(_spm()).pattern("<|assistant|>\n") == b"<|assistant|>\n"
    tok = _spm()  # the space it inserts after an added token is not text
    text = TokenText.from_tokenizer(tok)
    ids = tok("</s><s>[INST] a", add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids)[:3] == ["</s>", "<s>", "▁["]
    data, starts = text.decode(ids)
    assert data == b"</s><s>[INST] a"
    assert starts[:4].tolist() == [0, 4, 7, 8]


@pytest.mark.parametrize("rstrip", [True, False])
def test_multi_turn_with_chat_headers_trains_exactly_the_answers(rstrip):
    """With rstrip the newline after a header is in no token; without it, it follows an inserted lone '▁'."""
    tok = _spm(rstrip=rstrip)
    text = "<s><|user|>\nq<|assistant|>\nA b</s><|user|>\nr<|assistant|>\nC</s>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    collator = DataCollatorForCompletionOnlyLM("<|assistant|>\n", "<|user|>\n", tokenizer=tok, padding_free=True)
    labels = collator([{"input_ids": ids}])["labels"][0].tolist()
    trained = [t for t, lab in zip(tok.convert_ids_to_tokens(ids), labels, strict=True) if lab != IGNORE]
    if rstrip:
        assert trained == ["▁A", "▁", "b", "</s>", "▁C", "</s>"]
    else:  # <|assistant|> ▁ <0x0A> A ▁ b </s>: the '▁' and '\n' belong to the header
        assert tok.convert_ids_to_tokens(ids)[5:8] == ["<|assistant|>", "▁", "<0x0A>"]
        assert trained == ["A", "▁", "b", "</s>", "C", "</s>"]


def test_a_normalizing_tokenizer_is_refused_with_the_cause_and_the_fix():
    tok = _spm(lowercase=True)
    with pytest.raises(ValueError) as err:
        DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok)
    message = str(err.value)
    assert "Cause: the tokenizer's normalizer (Lowercase) rewrites the text" in message
    assert "'### answer:'" not in message and "### Answer:" in message
    assert "Fix: pass the template as the exact token ids" in message
