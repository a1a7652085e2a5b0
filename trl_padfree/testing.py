"""Tiny tokenizers and models built from code, for tests, doctests, the probe and benchmarks (no network).

Two tokenizer families, both trained in milliseconds with the ``tokenizers`` library on the same small corpus:

- :func:`tiny_byte_level_tokenizer`: GPT-2 / Llama-3 style byte-level BPE;
- :func:`tiny_metaspace_tokenizer`: Llama-2 / Mistral sentencepiece style (``"▁"`` for spaces, byte fallback),
  whose merges glue ``"\\n###"`` to the characters before it, the classic reason TRL's template matching failed.

Example:
    >>> tok = tiny_metaspace_tokenizer()
    >>> alone = tok.encode("\\n### Answer:", add_special_tokens=False)
    >>> in_context = tok.encode("### Question: why?\\n### Answer: because", add_special_tokens=False)
    >>> any(in_context[i : i + len(alone)] == alone for i in range(len(in_context)))
    False
"""

from __future__ import annotations

import random

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<|user|>", "<|assistant|>", "<|system|>", "<|tool|>"]

_WORDS = (
    "what is the sum of and why does a cat sit on mat please answer question reverse these words sort numbers "
    "count letters in word yes no because it is true false capital city of france paris rome blue red green"
).split()


def demo_corpus(n: int = 400, seed: int = 0) -> list[str]:
    """Instruction-style texts (``### Question: ...\\n### Answer: ...``) to train the tiny tokenizers on."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        q = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 12)))
        a = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 8)))
        texts.append(f"### Question: {q}{rng.choice('?.!')}\n### Answer: {a}.")
    return texts


def _wrap(raw: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>", bos_token="<bos>", pad_token="<pad>",
                                   additional_special_tokens=SPECIAL_TOKENS[3:])


def tiny_byte_level_tokenizer(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (GPT-2 / Llama-3 family)."""
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    raw.train_from_iterator(demo_corpus(), trainer)
    return _wrap(raw)


def tiny_metaspace_tokenizer(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """A sentencepiece-style BPE tokenizer (Llama-2 / Mistral family): metaspace and byte fallback."""
    raw = Tokenizer(models.BPE(byte_fallback=True))
    raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    raw.decoder = decoders.Sequence([decoders.Metaspace(replacement="▁", prepend_scheme="first"),
                                     decoders.ByteFallback(), decoders.Fuse()])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size + 256, special_tokens=SPECIAL_TOKENS + byte_tokens,
                                  show_progress=False)
    raw.train_from_iterator(demo_corpus(), trainer)
    return _wrap(raw)


def tiny_llama_config(vocab_size: int = 400, **overrides) -> LlamaConfig:
    """The config of :func:`tiny_llama`: 2 layers, hidden 64, GQA (4 heads, 2 kv heads), 512 positions;
    ``overrides`` replace or add fields.

    >>> c = tiny_llama_config(vocab_size=128, num_labels=1)
    >>> c.vocab_size, c.hidden_size, c.num_key_value_heads, c.max_position_embeddings, c.num_labels
    (128, 64, 2, 512, 1)
    """
    return LlamaConfig(**{**dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512),
                          **overrides})


def tiny_llama(vocab_size: int = 400, seed: int = 0, **overrides) -> LlamaForCausalLM:
    """A randomly initialised 2-layer Llama (GQA: 4 heads, 2 kv heads) in fp32 (:func:`tiny_llama_config`)."""
    overrides.setdefault("attn_implementation", "sdpa")
    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_llama_config(vocab_size, **overrides))
