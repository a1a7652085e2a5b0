"""Synthetic data of the SFT benchmark: the datasets' length distributions, the seeded examples, their statistics;
which examples go into which mini-batch (fixed batches, or a token budget) and a fingerprint of the batch a model
really received, so that "the same mini-batches in every variant" is checked rather than assumed; the examples as
TRL prompt/completion text records, with a word-level tokenizer that maps them back to exactly the same token ids
(for the variants that train through ``trl.SFTTrainer``).

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

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
TEMPLATE_IDS: tuple[int, ...] = (3, 4, 5)  # the response template ("### Answer:"), never drawn as content
FIRST_CONTENT_ID = 6
IGNORE_INDEX = -100


def completion_start(ids: Sequence[int]) -> int:
    """The index just past the (first) response template in ``ids``: where the completion starts.

    >>> completion_start([1, 9, 3, 4, 5, 11, 2])
    5
    """
    n = len(TEMPLATE_IDS)
    return next(i + n for i in range(len(ids) - n + 1) if tuple(ids[i : i + n]) == TEMPLATE_IDS)


@dataclass(frozen=True)
class LengthDistribution:
    """Example lengths (tokens, template and special tokens included) of one synthetic dataset.

    ``kind="lognormal"``: ``exp(N(log(center), spread))``; ``kind="normal"``: ``N(center, spread)``. Lengths are
    rounded, multiplied by ``scale`` and clipped to ``[min_length, max_length]``.

    >>> rng = np.random.default_rng(0)
    >>> lengths = DATASETS["orcamath"].sample(rng, 20_000, min_length=16, max_length=2048)
    >>> round(float(lengths.mean()) / 10) * 10, round(float(lengths.std()) / 10) * 10
    (400, 140)
    """

    name: str
    label: str
    kind: str
    center: float
    spread: float

    @property
    def short(self) -> str:
        """The label without the distribution's parameters, e.g. ``"FLAN-like"``."""
        return self.label.split(" (")[0]

    def sample(
        self, rng: np.random.Generator, n: int, *, min_length: int, max_length: int, scale: float = 1.0
    ) -> np.ndarray:
        """``n`` lengths as an int64 array."""
        if self.kind == "lognormal":
            raw = np.exp(rng.normal(math.log(self.center), self.spread, size=n))
        elif self.kind == "normal":
            raw = rng.normal(self.center, self.spread, size=n)
        else:  # pragma: no cover - the table below only holds the two kinds
            raise ValueError(f"unknown length distribution kind {self.kind!r}")
        return np.clip(np.rint(raw * scale), min_length, max_length).astype(np.int64)


DATASETS: dict[str, LengthDistribution] = {
    "flan": LengthDistribution("flan", "FLAN-like (lognormal, median 340, sigma 0.8)", "lognormal", 340.0, 0.8),
    "orcamath": LengthDistribution("orcamath", "OrcaMath-like (normal, 400 +- 140)", "normal", 400.0, 140.0),
}


def _zipf_probabilities(vocab_size: int, exponent: float = 1.1) -> np.ndarray:
    ranks = np.arange(1, vocab_size - FIRST_CONTENT_ID + 1, dtype=np.float64)
    weights = 1.0 / (ranks + 2.7) ** exponent
    return weights / weights.sum()


def make_examples(
    dataset: str,
    n: int,
    *,
    vocab_size: int,
    seed: int,
    split: str = "train",
    min_length: int = 16,
    max_length: int = 2048,
    length_scale: float = 1.0,
    prompt_fraction: float = 0.7,
) -> list[list[int]]:
    """``n`` synthetic examples ``<bos> prompt <template> completion <eos>`` as token-id lists (seeded).

    The same arguments give the same examples in every process.

    >>> ex = make_examples("flan", 3, vocab_size=64, seed=0, length_scale=0.1)
    >>> [len(e) for e in ex]
    [16, 16, 66]
    >>> ex[1]  # <bos>=1, 8 prompt tokens (70% of 11), template 3 4 5, 3 completion tokens, <eos>=2
    [1, 30, 29, 15, 7, 22, 12, 6, 56, 3, 4, 5, 11, 26, 48, 2]
    """
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; choose from {', '.join(DATASETS)}")
    rng = np.random.default_rng([seed, zlib.crc32(f"{dataset}/{split}".encode())])
    lengths = DATASETS[dataset].sample(rng, n, min_length=min_length, max_length=max_length, scale=length_scale)
    probabilities = _zipf_probabilities(vocab_size)
    examples = []
    for length in lengths.tolist():
        body = length - 2 - len(TEMPLATE_IDS)  # minus <bos>, <eos> and the template
        prompt = min(max(1, round(prompt_fraction * body)), body - 1)
        content = rng.choice(probabilities.size, size=body, p=probabilities) + FIRST_CONTENT_ID
        ids = [BOS_ID, *content[:prompt].tolist(), *TEMPLATE_IDS, *content[prompt:].tolist(), EOS_ID]
        examples.append(ids)
    return examples


def length_stats(lengths: Sequence[int], batch_size: int, warmup: int) -> dict[str, float]:
    """Length statistics of the train examples, and the padding ratio of their padded mini-batches.

    ``lengths``: the train examples' lengths in order, ``batch_size`` to a fixed mini-batch, the first ``warmup``
    mini-batches untimed. ``padding_ratio`` is padded tokens per real token over the timed steps (what padding costs
    in token slots); ``mean_batch_tokens`` the mean real tokens of a fixed mini-batch, warm-up included.

    >>> s = length_stats([1, 1, 2, 4, 3, 3], batch_size=2, warmup=1)
    >>> s["padding_ratio"], s["real_tokens_per_step"], s["mean_batch_tokens"]
    (1.1666666666666667, 6.0, 4.666666666666667)
    """
    n_train = len(lengths) // batch_size
    lengths = np.asarray(lengths)
    timed = lengths[warmup * batch_size :].reshape(n_train - warmup, batch_size)
    return {
        "mean": float(lengths.mean()),
        "median": float(np.median(lengths)),
        "std": float(lengths.std()),
        "max": int(lengths.max()),
        "real_tokens_per_step": float(timed.sum(axis=1).mean()),
        "mean_batch_tokens": float(lengths.sum() / n_train),
        "padding_ratio": float(timed.max(axis=1).sum() * batch_size / timed.sum()),
    }


def dataset_title(name: str, entry: dict[str, Any], length_scale: float = 1.0) -> str:
    """The dataset's name with this run's own example lengths (not the distribution's nominal ones).

    >>> dataset_title("flan", {"length_stats": {"median": 51.0, "mean": 70.4, "max": 205}}, 0.1)
    'FLAN-like: median 51, mean 70, max 205 tokens per example (lognormal lengths x 0.1)'
    """
    s = entry["length_stats"]
    dist = DATASETS.get(name)
    short = dist.short if dist else entry.get("label", name)
    kind = f" ({dist.kind} lengths" + (f" x {length_scale:g})" if length_scale != 1.0 else ")") if dist else ""
    return f"{short}: median {s['median']:.0f}, mean {s['mean']:.0f}, max {s['max']} tokens per example{kind}"


def fixed_batches(examples: Sequence[list[int]], batch_size: int) -> list[list[list[int]]]:
    """Consecutive mini-batches of ``batch_size`` examples, in order (the paper's fixed mini-batches).

    >>> fixed_batches([[1], [2], [3], [4]], 2)
    [[[1], [2]], [[3], [4]]]
    """
    return [list(examples[i : i + batch_size]) for i in range(0, len(examples), batch_size)]


def token_budget_batches(examples: Sequence[list[int]], max_tokens: int, seed: int) -> list[list[list[int]]]:
    """Mini-batches of whole examples chosen by :class:`trl_padfree.batching.TokenBudgetBatchSampler` (one epoch,
    shuffled with ``seed``): each holds as many examples as fit ``max_tokens`` real tokens."""
    from trl_padfree.batching import TokenBudgetBatchSampler

    sampler = TokenBudgetBatchSampler([len(e) for e in examples], max_tokens, shuffle=True, seed=seed)
    sampler.set_epoch(0)
    return [[examples[i] for i in indices] for indices in sampler]


def batch_fingerprint(batch: Mapping[str, Any]) -> str:
    """``"<examples>x<real tokens>:<crc32>"`` of a collated batch: its examples' real token ids in order and their
    lengths. A padded batch and the padding-free batch of the same examples, in the same order, get the same
    fingerprint (whichever collator built them: this project's or TRL's).

    >>> import torch
    >>> padded = {"input_ids": torch.tensor([[1, 2, 3], [4, 5, 0]]),
    ...           "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]])}
    >>> packed = {"input_ids": torch.tensor([[1, 2, 3, 4, 5]]), "position_ids": torch.tensor([[0, 1, 2, 0, 1]])}
    >>> batch_fingerprint(padded) == batch_fingerprint(packed), batch_fingerprint(packed)[:4]
    (True, '2x5:')
    >>> swapped = {"input_ids": torch.tensor([[4, 5, 1, 2, 3]]), "position_ids": torch.tensor([[0, 1, 0, 1, 2]])}
    >>> batch_fingerprint(swapped) == batch_fingerprint(packed)  # same tokens, other order
    False
    """
    ids = batch["input_ids"].detach().cpu()
    if "attention_mask" in batch:
        mask = batch["attention_mask"].detach().cpu().bool()
        real = ids[mask]
        lengths = mask.sum(dim=-1).tolist()
    else:
        real = ids.reshape(-1)
        starts = (batch["position_ids"].detach().cpu().reshape(-1) == 0).nonzero().flatten().tolist()
        lengths = np.diff([*starts, real.numel()]).tolist()
    crc = zlib.crc32(np.asarray(real, dtype=np.int64).tobytes())
    crc = zlib.crc32(np.asarray(lengths, dtype=np.int64).tobytes(), crc)
    return f"{len(lengths)}x{real.numel()}:{crc:08x}"


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
