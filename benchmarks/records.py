"""The benchmark's examples as TRL prompt/completion text records, with a word-level tokenizer that maps them back
to exactly the same token ids (for the variants that train through ``trl.SFTTrainer``).

Token id ``i`` is the word ``w<i>``; the special and template ids have readable names. A record's prompt ends with
the response template, its completion starts with a space and ends with the EOS token, so TRL's tokenization of
``prompt`` and of ``prompt + completion`` gives the example's ids, and TRL's completion mask is the collator's
completion-only label mask.

>>> tok = bench_tokenizer(16)
>>> example = [1, 9, 7, 3, 4, 5, 11, 2]
>>> records = to_records([example])
>>> records
[{'prompt': '<s> w9 w7 ### Answer :', 'completion': ' w11 </s>'}]
>>> tok(records[0]["prompt"] + records[0]["completion"])["input_ids"] == example
True
"""

from __future__ import annotations

from collections.abc import Sequence

from .data import BOS_ID, EOS_ID, PAD_ID, TEMPLATE_IDS, completion_start

_NAMED = {PAD_ID: "<pad>", BOS_ID: "<s>", EOS_ID: "</s>", **dict(zip(TEMPLATE_IDS, ("###", "Answer", ":"), strict=True))}


def token_text(token_id: int) -> str:
    """The word that stands for ``token_id``.

    >>> token_text(2), token_text(4), token_text(57)
    ('</s>', 'Answer', 'w57')
    """
    return _NAMED.get(token_id, f"w{token_id}")


def bench_tokenizer(vocab_size: int):
    """A ``PreTrainedTokenizerFast`` (word level, whitespace split, no added specials) over ``vocab_size`` ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({token_text(i): i for i in range(vocab_size)}, unk_token="<pad>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=raw, pad_token=token_text(PAD_ID), bos_token=token_text(BOS_ID),
        eos_token=token_text(EOS_ID),
    )


def to_records(examples: Sequence[Sequence[int]]) -> list[dict[str, str]]:
    """Each example ``<bos> prompt <template> completion <eos>`` as ``{"prompt": ..., "completion": ...}``."""
    records = []
    for ids in examples:
        end = completion_start(ids)
        records.append({
            "prompt": " ".join(map(token_text, ids[:end])),
            "completion": " " + " ".join(map(token_text, ids[end:])),
        })
    return records
