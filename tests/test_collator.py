"""Exact labels, positions and boundaries from DataCollatorForCompletionOnlyLM, and the inputs it accepts (those
TRL 0.19.1, TRL 1.x and transformers' collators accept) and refuses, with the example's index and what to pass."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import DataCollatorWithFlattening, PreTrainedTokenizerFast
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling as TRLCollator

from trl_padfree import DataCollatorForCompletionOnlyLM, TemplateNotFoundError
from trl_padfree.testing import tiny_byte_level_tokenizer, tiny_metaspace_tokenizer

IGNORE = -100


@pytest.fixture(scope="module", params=["byte_level", "metaspace"])
def tok(request):
    return tiny_byte_level_tokenizer() if request.param == "byte_level" else tiny_metaspace_tokenizer()


def trained_spans(tokenizer, ids, labels) -> list[str]:
    """Decoded runs of consecutive trained tokens (a trained token's label is the token)."""
    assert all(lab in (IGNORE, t) for t, lab in zip(ids, labels, strict=True))
    runs = itertools.groupby(zip(ids, labels, strict=True), key=lambda pair: pair[1] != IGNORE)
    return [tokenizer.decode([int(t) for t, _ in run]) for trained, run in runs if trained]


def oracle_labels(tokenizer, text: str, template: str) -> list[int]:
    """Oracle from character offsets: tokens starting after the last template; never the first."""
    enc = tokenizer(text, return_offsets_mapping=True)
    end = text.rindex(template) + len(template)
    labels = [t if start >= end else IGNORE for t, (start, _) in zip(enc["input_ids"], enc["offset_mapping"], strict=True)]
    labels[0] = IGNORE
    return labels


TEXTS = [
    "### Question: what is the capital city of france?\n### Answer: paris.",
    "### Question: reverse these words: cat mat sit.\n### Answer: sit mat cat.",
    "### Question: why?\n### Answer: because it is true.",
    "### Question: a question about ### Answer: inside the question\n### Answer: yes.",
]


@pytest.mark.parametrize("template", ["### Answer:", "\n### Answer:", " Answer:"])
def test_single_turn_labels_match_offset_oracle(tok, template):
    collator = DataCollatorForCompletionOnlyLM(template, tokenizer=tok, padding_free=True)
    texts = [*TEXTS, "### Question: café ☕ naïve?\n### Answer: déjà vu ✓"]  # non-ASCII last
    batch = collator([tok(t) for t in texts])
    expected = sum((oracle_labels(tok, t, template) for t in texts), [])
    assert batch["labels"][0].tolist() == expected
    # the last occurrence wins (example 3 mentions the template inside its question)
    spans = trained_spans(tok, batch["input_ids"][0].tolist(), batch["labels"][0].tolist())
    assert [s.strip() for s in spans] == ["paris.", "sit mat cat.", "because it is true.", "yes.", "déjà vu ✓"]


@pytest.mark.parametrize("make", [tiny_byte_level_tokenizer, tiny_metaspace_tokenizer])
def test_token_id_template_is_matched_exactly_and_a_string_one_in_context(make):
    tok = make()
    alone = tok.encode("\n### Answer:", add_special_tokens=False)
    ids = tok("### Question: why?\n### Answer: because")["input_ids"]
    by_ids = DataCollatorForCompletionOnlyLM(alone, tokenizer=tok, padding_free=True)  # the seed's call
    by_text = DataCollatorForCompletionOnlyLM("\n### Answer:", tokenizer=tok, padding_free=True)
    byte_level = make is tiny_byte_level_tokenizer
    answer = " because" if byte_level else "because"
    assert trained_spans(tok, ids, by_text([{"input_ids": ids}])["labels"][0].tolist()) == [answer]
    if byte_level:  # the ids occur as such: TRL 0.19.1's token-id template finds them
        assert trained_spans(tok, ids, by_ids([{"input_ids": ids}])["labels"][0].tolist()) == [answer]
        return
    # metaspace tokenizes the template differently in context: the token-id template is never found, reported
    assert not any(ids[i : i + len(alone)] == alone for i in range(len(ids))), "the tokenizer no longer shows the bug"
    with pytest.warns(UserWarning, match="1 of 1 examples in this batch contain no response template"):
        assert (by_ids([{"input_ids": ids}])["labels"] == IGNORE).all()


def test_packed_layout_exact(tok):
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok, padding_free=True)
    features = [tok(t) for t in TEXTS[:3]]
    lengths = [len(f["input_ids"]) for f in features]
    batch = collator(features)
    total = sum(lengths)
    assert "attention_mask" not in batch
    assert batch["use_cache"] is False
    assert batch["input_ids"].shape == batch["labels"].shape == batch["position_ids"].shape == (1, total)
    assert batch["input_ids"].dtype == batch["position_ids"].dtype == torch.int64
    assert batch["input_ids"][0].tolist() == sum((f["input_ids"] for f in features), [])
    assert batch["position_ids"][0].tolist() == sum((list(range(n)) for n in lengths), [])
    cu = [0, *np.cumsum(lengths).tolist()]
    for key in ("cu_seq_lens_q", "cu_seq_lens_k"):
        assert batch[key].dtype == torch.int32 and batch[key].dim() == 1
        assert batch[key].tolist() == cu
    assert batch["max_length_q"] == batch["max_length_k"] == max(lengths)
    assert type(batch["max_length_q"]) is int
    assert batch["seq_idx"].dtype == torch.int32
    assert batch["seq_idx"][0].tolist() == sum(([i] * n for i, n in enumerate(lengths)), [])
    assert all(batch["labels"][0, c].item() == IGNORE for c in cu[:-1])
    s = collator.stats
    assert (s.batches, s.examples, s.tokens, s.padded_tokens) == (1, 3, total, 3 * max(lengths))
    assert s.trained_tokens == int((batch["labels"] != IGNORE).sum())
    assert s.padding_share == pytest.approx(1 - total / (3 * max(lengths)))


@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_labels_identical_to_packed_and_pad_eq_eos_trains_eos(side):
    tok = tiny_byte_level_tokenizer()
    tok.pad_token = tok.eos_token  # the TRL #976 setting
    tok.padding_side = side
    eos = tok.eos_token_id
    features = [{"input_ids": tok(t)["input_ids"] + [eos]} for t in TEXTS]
    packed = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok, padding_free=True)(features)
    padded = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok, pad_to_multiple_of=8)(features)
    lengths = [len(f["input_ids"]) for f in features]
    width = -(-max(lengths) // 8) * 8
    assert padded["input_ids"].shape == (4, width)
    mask = padded["attention_mask"].bool()
    assert mask.sum(1).tolist() == lengths
    assert padded["labels"][mask].tolist() == packed["labels"][0].tolist()
    assert (padded["labels"][~mask] == IGNORE).all()
    assert (padded["input_ids"][~mask] == eos).all()
    # every example's real EOS is trained although pad == eos
    for row, n in zip(range(4), lengths, strict=True):
        last = (width - 1) if side == "left" else (n - 1)
        assert padded["labels"][row, last].item() == eos
    if side == "left":
        assert mask[:, -1].all() and not mask[:, 0].all()


CHAT = {
    "user_assistant": ("<|user|>hi there<|assistant|>hello<eos><|user|>more please<|assistant|>sure<eos>", ["hello<eos>", "sure<eos>"]),
    "leading_system": ("<|system|>be brief<|user|>hi<|assistant|>yes<eos>", ["yes<eos>"]),
    "tool_turn": ("<|user|>sum 2 3<|assistant|>call sum<|tool|>5<|assistant|>it is 5<eos>", ["call sum", "it is 5<eos>"]),
    "repeated_assistant": ("<|user|>q<|assistant|>part one<|assistant|>part two<eos>", ["part one", "part two<eos>"]),
    "repeated_user": ("<|user|>a<|user|>b<|assistant|>answer<eos>", ["answer<eos>"]),
    "cut_mid_assistant": ("<|user|>q<|assistant|>a long answer that was trun", ["a long answer that was trun"]),
    "cut_mid_user": ("<|user|>q<|assistant|>done<eos><|user|>and then", ["done<eos>"]),
    "assistant_first": ("<|assistant|>greeting<eos><|user|>q<|assistant|>a", ["greeting<eos>", "a"]),
}


@pytest.mark.parametrize("name", sorted(CHAT))
def test_multi_turn_trains_every_assistant_turn(tok, name):
    text, expected = CHAT[name]
    collator = DataCollatorForCompletionOnlyLM(
        "<|assistant|>", ["<|user|>", "<|system|>", "<|tool|>"], tokenizer=tok, padding_free=True
    )
    ids = tok(text)["input_ids"]
    batch = collator([{"input_ids": ids}, {"input_ids": tok(CHAT["user_assistant"][0])["input_ids"]}])
    n = len(ids)
    assert trained_spans(tok, ids, batch["labels"][0, :n].tolist()) == expected
    assert trained_spans(tok, batch["input_ids"][0, n:].tolist(), batch["labels"][0, n:].tolist()) == [
        "hello<eos>",
        "sure<eos>",
    ]


def test_multi_turn_with_plain_text_headers(tok):
    text = "### Human: hi\n### Assistant: hello there\n### Human: why?\n### Assistant: because."
    collator = DataCollatorForCompletionOnlyLM("### Assistant:", "### Human:", tokenizer=tok, padding_free=True)
    ids = tok(text)["input_ids"]
    spans = trained_spans(tok, ids, collator([{"input_ids": ids}])["labels"][0].tolist())
    # a token belongs to the span its first byte lies in: where the tokenizer glued "\n" to "###" (the metaspace
    # tokenizer's merges do), that token starts in the answer and is trained
    pieces = [tok.decode([i]) for i in ids]
    glued = next((p for p in pieces if p.startswith("\n") and "#" in p), None)
    first = "hello there" + (glued.rstrip() if glued else "")
    assert [s.strip() for s in spans] == [first, "because."]


def _hand_tokenizer() -> PreTrainedTokenizerFast:
    """Metaspace vocabulary whose ':P' straddles the template's end, '.\\n' an instruction's start."""
    vocab = {"<eos>": 0, "▁###": 1, "▁Answer": 2, ":P": 3, "aris": 4, ".\n": 5, "###": 6, "▁Q": 7, ":": 8}
    vocab.update({f"<0x{b:02X}>": 9 + b for b in range(256)})
    vocab.update({c: 265 + i for i, c in enumerate("▁" + "".join(map(chr, range(33, 127)))) if c not in vocab})
    raw = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True))
    raw.pre_tokenizer = pre_tokenizers.Metaspace()
    raw.decoder = decoders.Sequence([decoders.Metaspace(), decoders.ByteFallback(), decoders.Fuse()])
    return PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>")


def test_token_straddling_template_end_is_masked_and_instruction_start_is_trained():
    tok = _hand_tokenizer()
    # " ### Answer:Paris.\n### Q:" as tokens: ▁### ▁Answer :P aris .\n ### ▁Q :
    ids = [1, 2, 3, 4, 5, 6, 7, 8, 0]
    assert tok.decode(ids) == "### Answer:Paris.\n### Q:<eos>"
    collator = DataCollatorForCompletionOnlyLM(" ### Answer:", "\n### Q:", tokenizer=tok, padding_free=True)
    labels = collator([{"input_ids": ids}])["labels"][0].tolist()
    # ':P' starts inside the template -> masked; '.\n' starts in the answer -> trained; '###' starts inside the
    # instruction template -> masked
    assert labels == [IGNORE, IGNORE, IGNORE, 4, 5, IGNORE, IGNORE, IGNORE, IGNORE]


def test_template_not_found_one_aggregated_warning_per_batch_or_an_error(byte_tok):
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=byte_tok, padding_free=True)
    features = [byte_tok(t) for t in ["no template here", TEXTS[0], "nor here at all"]]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batch = collator(features)
    (message,) = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert "2 of 3 examples in this batch contain no response template '### Answer:'" in message
    assert "example 0 of this batch, which begins 'no template here'" in message
    assert (batch["labels"][0, : len(features[0]["input_ids"])] == IGNORE).all()
    assert collator.stats.templates_not_found == 2
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=byte_tok, on_template_not_found="raise")
    with pytest.raises(TemplateNotFoundError, match=r"not found in example 1 of this batch, which begins 'oops"):
        collator([byte_tok(TEXTS[0]), byte_tok("oops, no answer header")])


def test_seq_lengths_split_a_prepacked_row(byte_tok):
    a, b = byte_tok(TEXTS[0])["input_ids"], byte_tok(TEXTS[2])["input_ids"]
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=byte_tok, padding_free=True)
    prepacked = collator([{"input_ids": a + b, "seq_lengths": [len(a), len(b)]}])
    separate = collator([{"input_ids": a}, {"input_ids": b}])
    for key in ("input_ids", "labels", "position_ids", "cu_seq_lens_q", "seq_idx"):
        assert prepacked[key].tolist() == separate[key].tolist()


def test_tokenizer_positional_like_trl_0_19_and_bad_arguments_have_clear_errors(byte_tok):
    collator = DataCollatorForCompletionOnlyLM("### Answer:", None, byte_tok)
    assert collator.tokenizer is byte_tok and collator.padding_free is False
    assert collator([byte_tok(TEXTS[0])])["attention_mask"].shape[0] == 1
    with pytest.raises(ValueError, match="String templates need the tokenizer"):
        DataCollatorForCompletionOnlyLM("### Answer:")
    with pytest.raises(ValueError, match="mlm=True is not supported"):
        DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=byte_tok, mlm=True)
    with pytest.raises(ValueError, match="return_tensors='np' is not supported"):
        DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=byte_tok, return_tensors="np")
    with pytest.raises(TypeError, match="a template must be a string or a list of token ids"):
        DataCollatorForCompletionOnlyLM(3.5, tokenizer=byte_tok)
    for value in (0, -8, 2.5, "8"):
        with pytest.raises(ValueError, match=r"pad_to_multiple_of must be a positive int \(or None\), got"):
            DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=byte_tok, padding_free=True,
                                            pad_to_multiple_of=value)
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=byte_tok)
    with pytest.raises(KeyError, match="example 0 has no 'input_ids'"):
        collator([{"text": "raw"}])
    with pytest.raises(ValueError, match="example 1 has no tokens; drop empty examples"):
        collator([{"input_ids": [1, 2]}, {"input_ids": []}])


def test_padding_free_pad_to_multiple_of_is_its_own_segment(byte_tok):
    features = [byte_tok(t) for t in TEXTS[:3]]
    lengths = [len(f["input_ids"]) for f in features]
    n = sum(lengths)
    plain = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=byte_tok, padding_free=True)(features)
    for multiple in (1, n):  # already a multiple: nothing added
        same = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=byte_tok, padding_free=True,
                                               pad_to_multiple_of=multiple)(features)
        assert as_lists(same) == as_lists(plain)
    batch = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=byte_tok, padding_free=True,
                                            pad_to_multiple_of=64)(features)
    total = -(-n // 64) * 64
    extra = total - n
    assert extra > 1, "pick texts whose total is not close to a multiple of 64"
    assert batch["input_ids"].shape == batch["labels"].shape == batch["position_ids"].shape == (1, total)
    assert batch["input_ids"][0].tolist() == plain["input_ids"][0].tolist() + [byte_tok.pad_token_id] * extra
    assert batch["labels"][0].tolist() == plain["labels"][0].tolist() + [IGNORE] * extra
    # positions restart at 0: the padding is never read as a continuation of the last example
    assert batch["position_ids"][0].tolist() == plain["position_ids"][0].tolist() + list(range(extra))
    cu = [0, *np.cumsum(lengths).tolist(), total]
    for key in ("cu_seq_lens_q", "cu_seq_lens_k"):
        assert batch[key].dtype == torch.int32 and batch[key].tolist() == cu
    assert batch["seq_idx"][0].tolist() == plain["seq_idx"][0].tolist() + [3] * extra
    assert batch["max_length_q"] == batch["max_length_k"] == max(*lengths, extra)
    assert type(batch["max_length_q"]) is int
    # the same flat row as TRL 1.16's collator (which makes every padding token a segment of its own)
    given = [{"input_ids": f["input_ids"], "labels": part.tolist()}
             for f, part in zip(features, plain["labels"][0].split(lengths), strict=True)]
    trl = TRLCollator(pad_token_id=byte_tok.pad_token_id, padding_free=True, pad_to_multiple_of=64)(given)
    assert trl["input_ids"].tolist() == batch["input_ids"].tolist() and trl["labels"].tolist() == batch["labels"].tolist()
    assert trl["cu_seq_lens_q"].tolist() == cu[:-1] + list(range(n + 1, total + 1))


def test_a_chat_texts_end_of_turn_is_trained_once_when_trl_appends_the_eos(demo_tokenizer, tmp_path):
    # the README's library route on chat-rendered text: the text ends in "<|eos|>\n" (the demo chat template; ChatML's
    # "<|im_end|>\n" where <|im_end|> is the EOS), TRL's SFTTrainer appends the EOS, and the second one was trained
    from datasets import Dataset
    from trl import SFTConfig

    from trl_padfree import SFTTrainer
    from trl_padfree.testing import tiny_llama

    tok = demo_tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                                   tokenize=False)
    assert text.endswith(tok.eos_token + "\n")
    args = SFTConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, bf16=False, padding_free=False)
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok, padding_free=True)
    trainer = SFTTrainer(tiny_llama(vocab_size=len(tok)), args=args, processing_class=tok, data_collator=collator,
                         train_dataset=Dataset.from_dict({"text": [text, "### Question: a\n### Answer: b"]}))
    examples = [trainer.train_dataset[i] for i in range(2)]
    eos, newline = tok.eos_token_id, tok("\n", add_special_tokens=False)["input_ids"]
    assert examples[0]["input_ids"][-3:] == [eos, *newline, eos]  # what TRL made of it
    with pytest.warns(UserWarning, match=r"1 example\(s\) end in '<\|eos\|>', whitespace and '<\|eos\|>' again"):
        batch = collator([{"input_ids": e["input_ids"]} for e in examples])
    ids, labels, cu = batch["input_ids"][0], batch["labels"][0], batch["cu_seq_lens_q"].tolist()
    trained = [tok.decode(ids[a:b][labels[a:b] != -100]) for a, b in zip(cu[:-1], cu[1:], strict=True)]
    assert trained == [" yo<|eos|>\n", " b<|eos|>"]  # one end of turn each; plain text keeps TRL's EOS trained


def as_lists(batch) -> dict:
    return {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


@pytest.fixture(scope="module")
def byte_tok():
    return tiny_byte_level_tokenizer()


@pytest.fixture(scope="module")
def ids(byte_tok):
    return [byte_tok(t)["input_ids"] for t in TEXTS[:3]]


FORMS = {
    "list": list, "tuple": tuple, "torch_int64": torch.tensor, "torch_int32": lambda x: torch.tensor(x, dtype=torch.int32),
    "numpy_int64": lambda x: np.array(x, dtype=np.int64), "numpy_int32": lambda x: np.array(x, dtype=np.int32),
}  # fmt: skip


@pytest.mark.parametrize("padding_free", [True, False])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_bare_token_ids_and_labels_in_any_form_are_collated_like_lists_in_dicts(byte_tok, ids, form, padding_free):
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=byte_tok, padding_free=padding_free)
    reference = as_lists(collator([{"input_ids": x} for x in ids]))
    assert as_lists(collator([FORMS[form](x) for x in ids])) == reference
    assert as_lists(collator([{"input_ids": FORMS[form](x)} for x in ids])) == reference
    expected = sum((oracle_labels(byte_tok, t, "### Answer:") for t in TEXTS[:3]), [])
    mask = torch.tensor(reference.get("attention_mask", [[1] * len(expected)])).bool()
    assert torch.tensor(reference["labels"])[mask].tolist() == expected
    # given labels in the same form, one example without labels
    given = [[IGNORE] * 3 + x[3:] for x in ids]
    features = [{"input_ids": FORMS[form](x), "labels": FORMS[form](g)} for x, g in zip(ids, given, strict=True)]
    features[1] = {"input_ids": ids[1]}
    labels = DataCollatorForCompletionOnlyLM(None, padding_free=True)(features)["labels"][0].tolist()
    assert labels == given[0] + [IGNORE] + ids[1][1:] + given[2]


@pytest.mark.parametrize("labelled", [(0, 1, 2), (0, 2), ()], ids=["all", "some", "none"])
def test_given_labels_are_kept_each_examples_own_as_trl_and_transformers_keep_them(ids, labelled):
    """Labels other than input_ids are kept as given, as TRL's and transformers' collators do; an example without
    labels (beside ones with them, or all of them: the issue's own call) is trained on its input_ids, and the flat
    row is TRL 1.16's DataCollatorForLanguageModeling's."""
    rng = np.random.default_rng(0)
    features = [{"input_ids": x} for x in ids]
    for i in labelled:
        features[i]["labels"] = rng.integers(3, 300, size=len(ids[i])).tolist()
        features[i]["labels"][1] = IGNORE  # a position the dataset masked
    expected = sum(([IGNORE] + f.get("labels", f["input_ids"])[1:] for f in features), [])
    ours = DataCollatorForCompletionOnlyLM(None, padding_free=True)(features)
    trl = TRLCollator(pad_token_id=0, padding_free=True)(features)
    assert ours["labels"].tolist() == trl["labels"].tolist() == [expected]
    for key in ["input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "seq_idx", "max_length_q"]:
        assert as_lists(ours)[key] == as_lists(trl)[key], key
    padded = DataCollatorForCompletionOnlyLM(None, padding_free=False)(features)
    assert padded["labels"][padded["attention_mask"].bool()].tolist() == expected
    if len(labelled) < len(ids):
        return
    hf = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(features)
    assert hf["labels"].tolist() == [expected]
    # TRL keeps the first label of each example in a padded batch (there is no next-example leak to prevent there);
    # this collator masks it in both layouts so that padded and padding-free labels are identical
    assert padded["labels"][:, 1:].tolist() == TRLCollator(pad_token_id=0)(features)["labels"][:, 1:].tolist()


def test_given_labels_are_kept_under_the_template_mask(byte_tok, ids):
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=byte_tok, padding_free=True)
    given = [[(t * 7 + 1) % 300 for t in x] for x in ids]
    labels = collator([{"input_ids": x, "labels": g} for x, g in zip(ids, given, strict=True)])["labels"][0].tolist()
    masks = [oracle_labels(byte_tok, t, "### Answer:") for t in TEXTS[:3]]
    assert labels == [g if m != IGNORE else IGNORE for gs, ms in zip(given, masks, strict=True)
                      for g, m in zip(gs, ms, strict=True)]
    # labels on one example only, in either order: a completion token the dataset masked stays masked
    a, b = ids[0], ids[1]
    a_labels = list(a)
    a_labels[-2] = IGNORE
    expected_a, expected_b = masks[0][:-2] + [IGNORE, masks[0][-1]], masks[1]
    assert collator([{"input_ids": a, "labels": a_labels}, {"input_ids": b}])["labels"][0].tolist() == expected_a + expected_b
    assert collator([{"input_ids": b}, {"input_ids": a, "labels": a_labels}])["labels"][0].tolist() == expected_b + expected_a


@pytest.mark.parametrize(("features", "error", "message"), [
    (["### Question: hi"], TypeError, r"example 0 of this batch is of type str; .*tokenize"),
    ([[1, 2], None], TypeError, r"example 1 of this batch is of type NoneType; pass a dict with 'input_ids'"),
    ([7], TypeError, r"example 0 of this batch is of type int; pass a dict with 'input_ids'"),
    ([[[1, 2], [3]]], TypeError, r"example 0 of this batch: input_ids\[0\] is \[1, 2\] \(of type list\), not a token id"),
    ([torch.tensor([[1, 2, 3]])], TypeError, r"example 0 of this batch: input_ids has shape \(1, 3\); pass a 1-D"),
    ([{"input_ids": np.array([[1, 2, 3]])}], TypeError, r"example 0 of this batch: input_ids has shape \(1, 3\)"),
    ([{"input_ids": torch.tensor(5)}], TypeError, r"example 0 of this batch: input_ids has shape \(\); pass a 1-D"),
    ([{"input_ids": "1 2 3"}], TypeError, r"example 0 of this batch: input_ids is of type str; pass a list of token ids"),
    ({"input_ids": [[1, 2], [3, 4]]}, TypeError, r"a list of examples, got a dict of columns \(keys \['input_ids'\]\)"),
    *[([[1, 2, 3], {"input_ids": array}], TypeError, r"example 1 of this batch: input_ids has dtype .*; token ids are integers")
      for array in (np.array([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.0]), torch.tensor([True, False]), np.array(["1", "2"]))],
    ([np.array([5, -100, 7])], ValueError, r"example 0 of this batch: input_ids\[1\] is -100; token ids are >= 0"),
    ([[1], torch.tensor([2]), torch.tensor([-3, 4])], ValueError, r"example 2 of this batch: input_ids\[0\] is -3"),
    ([{"input_ids": [1, 99999]}], ValueError, "token id 99999 is outside the tokenizer's vocabulary"),
])  # fmt: skip
def test_unsupported_inputs_are_refused_saying_what_to_pass(byte_tok, features, error, message):
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=byte_tok, padding_free=True)
    with pytest.raises(error, match=message):
        collator(features)


@pytest.mark.parametrize(("field", "bad", "message"), [
    ("input_ids", 2.7, r"example 1 of this batch: input_ids\[2\] is 2\.7 \(of type float\), not a token id"),
    ("input_ids", 3.0, r"example 1 of this batch: input_ids\[2\] is 3\.0 \(of type float\), not a token id.*even integral floats"),
    ("input_ids", "5", r"example 1 of this batch: input_ids\[2\] is '5' \(of type str\), not a token id"),
    ("input_ids", None, r"example 1 of this batch: input_ids\[2\] is None \(of type NoneType\), not a token id"),
    ("input_ids", -1, r"example 1 of this batch: input_ids\[2\] is -1; token ids are >= 0"),
    ("input_ids", -100, r"example 1 of this batch: input_ids\[2\] is -100; token ids are >= 0.*-100 marks ignored 'labels'"),
    ("input_ids", "VOCAB", r"example 1 of this batch: token id {V} is outside the tokenizer's vocabulary \(size {V}\)"),
    ("input_ids", 2**70, r"example 1 of this batch: input_ids\[2\] is 1180591620717411303424; .* outside"),
    ("labels", 2.5, r"example 1 of this batch: labels\[2\] is 2\.5 \(of type float\), not a token id"),
    ("labels", "7", r"example 1 of this batch: labels\[2\] is '7' \(of type str\)"),
    ("labels", -1, r"example 1 of this batch: labels\[2\] is -1; labels are token ids or -100"),
    ("labels", "VOCAB", r"example 1 of this batch: labels\[2\] is {V}, outside the tokenizer's vocabulary \(size {V}\)"),
])  # fmt: skip
@pytest.mark.parametrize("padding_free", [True, False])
def test_bad_token_ids_and_labels_are_refused_with_example_index(byte_tok, field, bad, message, padding_free):
    template = "### Answer:" if field == "input_ids" else None  # labels: given, no template
    collator = DataCollatorForCompletionOnlyLM(template, tokenizer=byte_tok, padding_free=padding_free)
    good = byte_tok(TEXTS[0])["input_ids"]
    if bad == "VOCAB":  # the first id past the vocabulary
        bad, message = len(byte_tok), message.format(V=len(byte_tok))
    with pytest.raises((TypeError, ValueError), match=message) as info:
        collator([{"input_ids": good}, {"input_ids": good, field: good[:2] + [bad] + good[3:]}])
    assert any(word in str(info.value).lower() for word in ("pass", "put", "tokenizer")), info.value  # what to do
    assert issubclass(info.type, TypeError if isinstance(bad, float | str) or bad is None else ValueError)


def test_the_vocabulary_is_the_tokenizers_now_and_unchecked_without_one():
    collator = DataCollatorForCompletionOnlyLM([7, 8], padding_free=True)  # token-id template, no tokenizer
    assert collator([[1, 7, 8, 10**6]])["labels"].tolist() == [[IGNORE, IGNORE, IGNORE, 10**6]]
    with pytest.raises(ValueError, match=r"example 0 of this batch: input_ids\[0\] is -5"):
        collator([[-5, 7, 8]])
    # tokens added after construction are in the vocabulary, with a token-id or a string template
    tok = tiny_byte_level_tokenizer()
    by_ids = DataCollatorForCompletionOnlyLM([7, 8], tokenizer=tok, padding_free=True)
    by_text = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok, padding_free=True)
    assert by_ids([[1, 7, 8, 9]])["input_ids"].tolist() == [[1, 7, 8, 9]]
    tok.add_tokens(["<new>"])
    new = tok.convert_tokens_to_ids("<new>")
    assert new == len(tok) - 1
    assert by_ids([[1, 7, 8, new]])["labels"].tolist() == [[IGNORE, IGNORE, IGNORE, new]]
    text = "### Question: hi <new>\n### Answer: yes <new>"
    assert new in tok(text)["input_ids"]
    assert by_text([tok(text)["input_ids"]])["labels"][0].tolist() == oracle_labels(tok, text, "### Answer:")
