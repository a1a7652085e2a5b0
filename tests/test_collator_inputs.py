"""The inputs the collator accepts (those TRL 0.19.1, TRL 1.x and transformers' collators accept) and the ones it
refuses, with the example's index and what to pass instead."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling as TRLCollator

from trl_padfree import DataCollatorForCompletionOnlyLM
from trl_padfree._compat import trl_at_least
from trl_padfree.testing import tiny_byte_level_tokenizer

IGNORE = -100
TEXTS = [
    "### Question: what is the capital city of france?\n### Answer: paris.",
    "### Question: why?\n### Answer: because it is true.",
    "### Question: reverse these words: cat mat sit.\n### Answer: sit mat cat.",
]


@pytest.fixture(scope="module")
def ids(tok):
    return [tok(t)["input_ids"] for t in TEXTS]


def oracle(tok, text: str, template: str = "### Answer:") -> list[int]:
    """Expected labels from the tokenizer's character offsets: trained iff the token starts after the template."""
    enc = tok(text, return_offsets_mapping=True)
    end = text.rindex(template) + len(template)
    labels = [t if s >= end else IGNORE for t, (s, _) in zip(enc["input_ids"], enc["offset_mapping"], strict=True)]
    labels[0] = IGNORE
    return labels


def as_lists(batch) -> dict:
    return {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


# ------------------------------------------------------------------------------------------ defect 3: bare ids
FORMS = {
    "list": lambda x: list(x),
    "tuple": lambda x: tuple(x),
    "torch_int64": lambda x: torch.tensor(x),
    "torch_int32": lambda x: torch.tensor(x, dtype=torch.int32),
    "numpy_int64": lambda x: np.array(x, dtype=np.int64),
    "numpy_int32": lambda x: np.array(x, dtype=np.int32),
}


@pytest.mark.parametrize("padding_free", [True, False])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_bare_token_id_examples_are_collated_like_dicts(tok, ids, form, padding_free):
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok, padding_free=padding_free)
    reference = as_lists(collator([{"input_ids": x} for x in ids]))
    bare = as_lists(collator([FORMS[form](x) for x in ids]))
    in_dicts = as_lists(collator([{"input_ids": FORMS[form](x)} for x in ids]))
    assert bare == reference and in_dicts == reference
    expected = sum((oracle(tok, t) for t in TEXTS), [])
    if padding_free:
        assert bare["labels"] == [expected] and bare["input_ids"] == [sum(ids, [])]
    else:
        mask = torch.tensor(bare["attention_mask"]).bool()
        assert torch.tensor(bare["labels"])[mask].tolist() == expected


def test_bare_lists_without_template_match_trl_language_modelling_collator():
    """The issue's own call, and the result TRL 1.16's DataCollatorForLanguageModeling gives for the same ids."""
    collator = DataCollatorForCompletionOnlyLM(None, padding_free=True)
    batch = collator([[1, 2, 3], [4, 5]])
    trl = TRLCollator(pad_token_id=0, padding_free=True)([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}])
    assert batch["labels"].tolist() == trl["labels"].tolist() == [[IGNORE, 2, 3, IGNORE, 5]]
    keys = ["input_ids", "position_ids"]
    if trl_at_least("1.16"):  # older TRL collators give position_ids only, no cu_seq_lens, seq_idx, max_length
        keys += ["cu_seq_lens_q", "cu_seq_lens_k", "seq_idx"]
        assert trl["max_length_q"] == 3
    for key in keys:
        assert batch[key].tolist() == trl[key].tolist(), key
    assert batch["max_length_q"] == 3


@pytest.mark.parametrize(
    ("features", "message"),
    [
        (["### Question: hi"], r"example 0 of this batch is of type str; .*tokenize"),
        ([[1, 2], None], r"example 1 of this batch is of type NoneType; pass a dict with 'input_ids'"),
        ([7], r"example 0 of this batch is of type int; pass a dict with 'input_ids'"),
        ([[[1, 2], [3]]], r"example 0 of this batch: input_ids\[0\] is \[1, 2\] \(of type list\), not a token id"),
        ([torch.tensor([[1, 2, 3]])], r"example 0 of this batch: input_ids has shape \(1, 3\); pass a 1-D"),
        ([{"input_ids": np.array([[1, 2, 3]])}], r"example 0 of this batch: input_ids has shape \(1, 3\)"),
        ([{"input_ids": torch.tensor(5)}], r"example 0 of this batch: input_ids has shape \(\); pass a 1-D"),
        ([{"input_ids": "1 2 3"}], r"example 0 of this batch: input_ids is of type str; pass a list of token ids"),
    ],
)
def test_unsupported_example_forms_raise_type_error_saying_what_to_pass(tok, features, message):
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok, padding_free=True)
    with pytest.raises(TypeError, match=message):
        collator(features)


def test_dict_of_columns_instead_of_list_of_examples(tok):
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok, padding_free=True)
    with pytest.raises(TypeError, match=r"a list of examples, got a dict of columns \(keys \['input_ids'\]\)"):
        collator({"input_ids": [[1, 2], [3, 4]]})


# ---------------------------------------------------------------------------- defect 4: given labels are kept
def test_given_label_values_are_kept_and_match_trl_and_transformers(ids):
    """Labels that differ from input_ids (a distillation target, a shifted layout) are passed through as given;
    TRL 1.16's and transformers' flattening collators do the same."""
    rng = np.random.default_rng(0)
    features = []
    for x in ids:
        labels = rng.integers(3, 300, size=len(x)).tolist()
        labels[1] = IGNORE  # a position the dataset masked
        features.append({"input_ids": x, "labels": labels})
    ours = DataCollatorForCompletionOnlyLM(None, padding_free=True)(features)
    trl = TRLCollator(pad_token_id=0, padding_free=True)(features)
    from transformers import DataCollatorWithFlattening

    hf = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(features)
    expected = sum(([IGNORE] + f["labels"][1:] for f in features), [])
    assert ours["labels"].tolist() == trl["labels"].tolist() == hf["labels"].tolist() == [expected]
    padded = DataCollatorForCompletionOnlyLM(None, padding_free=False)(features)
    trl_padded = TRLCollator(pad_token_id=0)(features)
    mask = padded["attention_mask"].bool()
    assert padded["labels"][mask].tolist() == expected
    # TRL keeps the first label of each example in a padded batch (there is no next-example leak to prevent there);
    # this collator masks it in both layouts so that padded and padding-free labels are identical
    assert padded["labels"][:, 1:].tolist() == trl_padded["labels"][:, 1:].tolist()


def test_given_labels_kept_under_the_template_mask(tok, ids):
    given = [[(t * 7 + 1) % 300 for t in x] for x in ids]
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok, padding_free=True)
    labels = collator([{"input_ids": x, "labels": g} for x, g in zip(ids, given, strict=True)])["labels"][0].tolist()
    masks = [[lab != IGNORE for lab in oracle(tok, t)] for t in TEXTS]
    expected = sum(([g_ if m else IGNORE for g_, m in zip(g, ms, strict=True)] for g, ms in zip(given, masks, strict=True)), [])
    assert labels == expected


# ----------------------------------------------------------------------- defect 5: labels on some examples only
def test_labels_on_some_examples_only_each_keeps_its_own(ids):
    a, b, c = ids
    a_labels = [IGNORE] * 12 + a[12:]  # prompt masked by the dataset (a prompt/completion dataset)
    c_labels = [IGNORE] * 5 + c[5:]
    features = [{"input_ids": a, "labels": a_labels}, {"input_ids": b}, {"input_ids": c, "labels": c_labels}]
    ours = DataCollatorForCompletionOnlyLM(None, padding_free=True)(features)
    trl = TRLCollator(pad_token_id=0, padding_free=True)(features)
    expected = a_labels + [IGNORE] + b[1:] + c_labels
    assert ours["labels"].tolist() == trl["labels"].tolist() == [expected]
    # a token the dataset masked stays masked, in both layouts
    assert ours["labels"][0, 11].item() == IGNORE
    padded = DataCollatorForCompletionOnlyLM(None, padding_free=False)(features)
    assert padded["labels"][padded["attention_mask"].bool()].tolist() == expected


def test_labels_on_some_examples_only_with_template(tok, ids):
    a, b = ids[0], ids[1]
    a_labels = list(a)
    a_labels[-2] = IGNORE  # a completion token the dataset masked
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok, padding_free=True)
    labels = collator([{"input_ids": a, "labels": a_labels}, {"input_ids": b}])["labels"][0].tolist()
    expected_a = oracle(tok, TEXTS[0])
    expected_a[-2] = IGNORE
    assert labels == expected_a + oracle(tok, TEXTS[1])
    # the first example given without labels, the second with
    labels = collator([{"input_ids": b}, {"input_ids": a, "labels": a_labels}])["labels"][0].tolist()
    assert labels == oracle(tok, TEXTS[1]) + expected_a


# ------------------------------------------------- issue 12: non-integer, negative, out-of-vocabulary token ids
@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (2.7, r"example 1 of this batch: input_ids\[2\] is 2\.7 \(of type float\), not a token id"),
        (3.0, r"example 1 of this batch: input_ids\[2\] is 3\.0 \(of type float\), not a token id.*even integral floats"),
        ("5", r"example 1 of this batch: input_ids\[2\] is '5' \(of type str\), not a token id"),
        (None, r"example 1 of this batch: input_ids\[2\] is None \(of type NoneType\), not a token id"),
        (-1, r"example 1 of this batch: input_ids\[2\] is -1; token ids are >= 0"),
        (-100, r"example 1 of this batch: input_ids\[2\] is -100; token ids are >= 0.*-100 marks ignored 'labels'"),
        ("VOCAB", r"example 1 of this batch: token id {V} is outside the tokenizer's vocabulary \(size {V}\)"),
        (2**70, r"example 1 of this batch: input_ids\[2\] is 1180591620717411303424; .* outside"),
    ],
)
@pytest.mark.parametrize("padding_free", [True, False])
def test_bad_token_ids_are_refused_with_example_index(tok, bad, message, padding_free):
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok, padding_free=padding_free)
    good = tok(TEXTS[0])["input_ids"]
    if bad == "VOCAB":  # the first id past the vocabulary
        bad, message = len(tok), message.format(V=len(tok))
    with pytest.raises((TypeError, ValueError), match=message) as info:
        collator([{"input_ids": good}, {"input_ids": good[:2] + [bad] + good[3:]}])
    text = str(info.value)
    assert any(word in text for word in ("pass", "put", "tokenizer")), text  # names what to do
    wrong_type = isinstance(bad, float | str) or bad is None
    assert issubclass(info.type, TypeError if wrong_type else ValueError)


@pytest.mark.parametrize(
    "array",
    [
        np.array([1.0, 2.0, 3.0]),
        torch.tensor([1.0, 2.0, 3.0]),
        torch.tensor([True, False]),
        np.array(["1", "2"]),
    ],
    ids=["numpy_float", "torch_float", "torch_bool", "numpy_str"],
)
def test_arrays_of_non_integer_ids_are_refused(tok, array):
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok, padding_free=True)
    with pytest.raises(TypeError, match=r"example 1 of this batch: input_ids has dtype .*; token ids are integers"):
        collator([[1, 2, 3], {"input_ids": array}])


def test_negative_ids_in_integer_arrays_are_refused_not_wrapped(tok):
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok, padding_free=True)
    with pytest.raises(ValueError, match=r"example 0 of this batch: input_ids\[1\] is -100; token ids are >= 0"):
        collator([np.array([5, -100, 7])])
    with pytest.raises(ValueError, match=r"example 2 of this batch: input_ids\[0\] is -3"):
        collator([[1], torch.tensor([2]), torch.tensor([-3, 4])])


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (2.5, r"example 0 of this batch: labels\[1\] is 2\.5 \(of type float\), not a token id"),
        ("7", r"example 0 of this batch: labels\[1\] is '7' \(of type str\)"),
        (-1, r"example 0 of this batch: labels\[1\] is -1; labels are token ids or -100"),
        ("VOCAB", r"example 0 of this batch: labels\[1\] is {V}, outside the tokenizer's vocabulary \(size {V}\)"),
    ],
)
def test_bad_labels_are_refused(tok, bad, message):
    collator = DataCollatorForCompletionOnlyLM(None, tokenizer=tok, padding_free=True)
    if bad == "VOCAB":
        bad, message = len(tok), message.format(V=len(tok))
    with pytest.raises((TypeError, ValueError), match=message):
        collator([{"input_ids": [1, 2, 3], "labels": [IGNORE, bad, 3]}])


def test_without_tokenizer_only_negative_ids_are_refused():
    collator = DataCollatorForCompletionOnlyLM([7, 8], padding_free=True)  # token-id template, no tokenizer
    assert collator([[1, 7, 8, 10**6]])["labels"].tolist() == [[IGNORE, IGNORE, IGNORE, 10**6]]
    with pytest.raises(ValueError, match=r"example 0 of this batch: input_ids\[0\] is -5"):
        collator([[-5, 7, 8]])


def test_tokens_added_after_construction_are_in_the_vocabulary():
    tok = tiny_byte_level_tokenizer()
    collator = DataCollatorForCompletionOnlyLM([7, 8], tokenizer=tok, padding_free=True)
    assert collator([[1, 7, 8, 9]])["input_ids"].tolist() == [[1, 7, 8, 9]]
    tok.add_tokens(["<new>"])
    new = tok.convert_tokens_to_ids("<new>")
    assert new == len(tok) - 1
    assert collator([[1, 7, 8, new]])["labels"].tolist() == [[IGNORE, IGNORE, IGNORE, new]]


@pytest.mark.parametrize("form", sorted(FORMS))
def test_labels_in_any_accepted_form(ids, form):
    given = [[IGNORE] * 3 + x[3:] for x in ids]
    features = [{"input_ids": FORMS[form](x), "labels": FORMS[form](g)} for x, g in zip(ids, given, strict=True)]
    features[1] = {"input_ids": ids[1]}  # one example without labels
    labels = DataCollatorForCompletionOnlyLM(None, padding_free=True)(features)["labels"][0].tolist()
    assert labels == given[0] + [IGNORE] + ids[1][1:] + given[2]


def test_tokens_added_after_construction_work_with_a_string_template():
    tok = tiny_byte_level_tokenizer()
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok, padding_free=True)
    tok.add_tokens(["<new>"])
    text = "### Question: hi <new>\n### Answer: yes <new>"
    ids = tok(text)["input_ids"]
    assert tok.convert_tokens_to_ids("<new>") in ids
    assert collator([ids])["labels"][0].tolist() == oracle(tok, text)
