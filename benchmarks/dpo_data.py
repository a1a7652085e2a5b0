"""Data and arithmetic of the DPO benchmark (``trl-padfree bench --task dpo``): UltraFeedback-like preference pairs,
their text records for ``trl.DPOTrainer``, the fingerprint of a preference batch in any layout, and the workload's
matmul FLOPs counted from the batches really run.

**Lengths (tokens).** A pair is ``prompt`` (``<bos>`` + content), ``chosen`` and ``rejected`` (content + ``<eos>``),
each length drawn independently from a lognormal ``exp(N(log(median), sigma))``, rounded, multiplied by the run's
``length_scale`` and clipped to ``[min_length, max_length]``: prompt median 113, sigma 0.9 (mean 170); chosen and
rejected each median 250, sigma 0.6 (mean 300). A moment match to UltraFeedback's published sizes, not a fit to
tokenized rows: the derivation is in docs/bench/dpo-notes.md. The prompt's 5th and 99th percentiles:

>>> import math
>>> from statistics import NormalDist
>>> p = ULTRAFEEDBACK["prompt"]
>>> [round(p.center * math.exp(p.spread * NormalDist().inv_cdf(q))) for q in (0.05, 0.99)]
[26, 917]

**FLOPs** (:func:`batch_workload`, :func:`~.flops.forward_flops`): matmul FLOPs of one forward of the Llama over a
batch exactly as it was laid out (docs/dpo-bench.md): the LM head ``2 d V`` per position handed to it (TRL's fused
head on CPU scores every position: ``2B x (T - 1)`` for a padded batch, the whole row for a flat one); attention,
the full rectangle per segment: padded ``2B x T^2``, padding-free ``(P+R)^2`` per sequence, prompt-once ``(P+C)^2``
for the chosen segment and ``(R+1) x (P+R)`` for the rejected one (its queries read the shared prompt keys). A
training step is policy forward + backward (~3 forwards) + the reference forward (1): 4 forwards in every variant,
so the FLOP ratio of two variants is the ratio of their forwards.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .data import BOS_ID, EOS_ID, FIRST_CONTENT_ID, LengthDistribution, _zipf_probabilities, token_text
from .flops import Workload

# UltraFeedback-like (see the module docstring for the source and why).
ULTRAFEEDBACK: dict[str, LengthDistribution] = {
    "prompt": LengthDistribution("prompt", "prompt", "lognormal", 113.0, 0.9),
    "response": LengthDistribution("response", "chosen or rejected", "lognormal", 250.0, 0.6),
}
DISTRIBUTION_LABEL = ("UltraFeedback-like: prompt lognormal (median 113, sigma 0.9), chosen and rejected each "
                      "lognormal (median 250, sigma 0.6), drawn independently")


def make_pairs(n: int, *, vocab_size: int, seed: int, split: str = "train", length_scale: float = 1.0,
               min_length: int = 2, max_length: int = 1024) -> list[dict[str, list[int]]]:
    """``n`` seeded pairs ``{"prompt": [<bos>, ...], "chosen": [..., <eos>], "rejected": [..., <eos>]}`` (token ids).

    >>> pairs = make_pairs(2, vocab_size=64, seed=0, length_scale=0.02)
    >>> [(len(p["prompt"]), len(p["chosen"]), len(p["rejected"])) for p in pairs]
    [(2, 3, 4), (2, 3, 7)]
    >>> pairs[0]["prompt"][0], pairs[0]["chosen"][-1]
    (1, 2)
    """
    rng = np.random.default_rng([seed, zlib.crc32(f"dpo-ultrafeedback/{split}".encode())])
    common = dict(scale=length_scale, min_length=max(2, min_length), max_length=max_length)
    prompts = ULTRAFEEDBACK["prompt"].sample(rng, n, **common)
    chosen = ULTRAFEEDBACK["response"].sample(rng, n, **common)
    rejected = ULTRAFEEDBACK["response"].sample(rng, n, **common)
    probabilities = _zipf_probabilities(vocab_size)

    def content(k: int) -> list[int]:
        return (rng.choice(probabilities.size, size=k, p=probabilities) + FIRST_CONTENT_ID).tolist()

    return [
        {"prompt": [BOS_ID, *content(p - 1)], "chosen": [*content(c - 1), EOS_ID],
         "rejected": [*content(r - 1), EOS_ID]}
        for p, c, r in zip(prompts.tolist(), chosen.tolist(), rejected.tolist(), strict=True)
    ]


def to_records(pairs: Sequence[Mapping[str, Sequence[int]]]) -> list[dict[str, str]]:
    """The pairs as ``trl.DPOTrainer`` text records for :func:`~.data.bench_tokenizer` (responses start with a
    space and already end with ``</s>``, so TRL adds no EOS and tokenizes back exactly the pair's ids).

    >>> to_records([{"prompt": [1, 9], "chosen": [7, 2], "rejected": [2]}])
    [{'prompt': '<s> w9', 'chosen': ' w7 </s>', 'rejected': ' </s>'}]
    """
    def text(ids: Sequence[int]) -> str:
        return " ".join(map(token_text, ids))

    return [{"prompt": text(p["prompt"]), "chosen": " " + text(p["chosen"]), "rejected": " " + text(p["rejected"])}
            for p in pairs]


def pair_stats(pairs: Sequence[Mapping[str, Sequence[int]]], batch_size: int, warmup: int) -> dict[str, Any]:
    """Length statistics of the pairs and of the timed batches (TRL's token count: prompt counted twice)."""
    p = np.array([len(x["prompt"]) for x in pairs])
    c = np.array([len(x["chosen"]) for x in pairs])
    r = np.array([len(x["rejected"]) for x in pairs])

    def describe(a: np.ndarray) -> dict[str, float]:
        return {"mean": float(a.mean()), "median": float(np.median(a)), "p5": float(np.percentile(a, 5)),
                "p95": float(np.percentile(a, 95)), "max": int(a.max())}

    timed = slice(warmup * batch_size, None)
    steps = (len(pairs) - warmup * batch_size) // batch_size
    per_step = (2 * p + c + r)[timed].reshape(steps, batch_size).sum(axis=1)
    return {"prompt": describe(p), "chosen": describe(c), "rejected": describe(r),
            "trl_tokens_per_step": float(per_step.mean()),
            "prompt_share_of_trl_tokens": float((2 * p).sum() / (2 * p + c + r).sum())}


# ---- what a batch holds, in any layout -------------------------------------------------------------------------
def _np(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def batch_pairs(batch: Mapping[str, Any]) -> list[tuple[list[int], list[int], list[int]]]:
    """``(prompt, chosen, rejected)`` token ids of every pair of a collated batch, in order, whatever the layout:
    TRL's padded ``(2B, T)`` batch (``completion_mask``), or this package's flat row (padding-free or prompt-once:
    responses from ``score_index`` / ``shift_labels``, the prompt from the chosen sequence's segment).

    >>> import torch
    >>> padded = {"input_ids": torch.tensor([[1, 7, 8, 2, 0], [1, 7, 9, 0, 0]]),
    ...           "attention_mask": torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]),
    ...           "completion_mask": torch.tensor([[0, 0, 1, 1, 0], [0, 0, 1, 0, 0]])}
    >>> batch_pairs(padded)
    [([1, 7], [8, 2], [9])]
    >>> from trl_padfree.preference import DataCollatorForPreference
    >>> pair = {"prompt_ids": [1, 7], "chosen_ids": [8, 2], "rejected_ids": [9]}
    >>> [batch_pairs(DataCollatorForPreference(0, prompt_once=once)([pair])) for once in (False, True)]
    [[([1, 7], [8, 2], [9])], [([1, 7], [8, 2], [9])]]
    """
    if "completion_mask" in batch:  # TRL: rows 0..B-1 prompt + chosen, rows B..2B-1 prompt + rejected
        ids, mask = _np(batch["input_ids"]), _np(batch["attention_mask"]).astype(bool)
        comp = _np(batch["completion_mask"]).astype(bool)
        pairs = ids.shape[0] // 2
        rows = [(ids[i][mask[i] & ~comp[i]].tolist(), ids[i][comp[i]].tolist()) for i in range(2 * pairs)]
        out = []
        for j in range(pairs):
            if rows[j][0] != rows[pairs + j][0]:
                raise ValueError(f"pair {j}: the chosen and rejected rows hold different prompts")
            out.append((rows[j][0], rows[j][1], rows[pairs + j][1]))
        return out
    ids = _np(batch["input_ids"]).reshape(-1)
    labels = _np(batch["shift_labels"]).reshape(-1)
    index = _np(batch["score_index"]).reshape(-1)
    starts = _np(batch["cu_seq_lens_q"]).reshape(-1)
    pairs = int(batch["num_pairs"])
    out = []
    for j in range(pairs):
        chosen_at = np.flatnonzero(index == j)
        first = int(chosen_at[0])
        start = int(starts[np.searchsorted(starts, first, side="right") - 1])
        out.append((ids[start : first + 1].tolist(), labels[chosen_at].tolist(),
                    labels[index == pairs + j].tolist()))
    return out


def pairs_fingerprint(pairs: Sequence[tuple[Sequence[int], Sequence[int], Sequence[int]]]) -> str:
    """``"<pairs>x<TRL tokens>:<crc32>"`` over the pairs' prompt, chosen and rejected ids and lengths, in order.

    >>> pairs_fingerprint([([1, 7], [8, 2], [9])])
    '1x7:13e6fbb0'
    """
    crc, tokens = 0, 0
    for part in pairs:
        for ids in part:
            crc = zlib.crc32(np.asarray([len(ids), *ids], dtype=np.int64).tobytes(), crc)
        tokens += 2 * len(part[0]) + len(part[1]) + len(part[2])
    return f"{len(pairs)}x{tokens}:{crc:08x}"


# ---- FLOPs ---------------------------------------------------------------------------------------------------------
def batch_workload(batch: Mapping[str, Any], scored_head: bool = False) -> Workload:
    """The :class:`Workload` of a collated batch as the model receives it.

    ``scored_head``: the flat row is scored by :mod:`trl_padfree.scored_head`, which projects only the positions
    with a label (``shift_labels != -100``); otherwise (TRL's fused head on a CPU) every position of the row.

    >>> import torch
    >>> padded = {"input_ids": torch.zeros(4, 10, dtype=torch.long), "attention_mask": torch.ones(4, 10),
    ...           "completion_mask": torch.ones(4, 10)}
    >>> batch_workload(padded)
    Workload(slots=40, head_slots=36, attention_qk=400)
    >>> flat = {"input_ids": torch.zeros(1, 7, dtype=torch.long), "cu_seq_lens_q": torch.tensor([0, 4, 7]),
    ...         "shift_labels": torch.zeros(1, 7)}
    >>> batch_workload(flat)
    Workload(slots=7, head_slots=7, attention_qk=25)
    >>> once = {**flat, "input_ids": torch.zeros(1, 6, dtype=torch.long), "cu_seq_lens_q": torch.tensor([0, 4, 6]),
    ...         "cu_seq_lens_k": torch.tensor([0, 4, 7])}
    >>> batch_workload(once)  # 4 x 4 + 2 x 3
    Workload(slots=6, head_slots=6, attention_qk=22)
    >>> batch_workload({**flat, "shift_labels": torch.tensor([[-100, 5, 6, -100, 7, 8, -100]])}, scored_head=True)
    Workload(slots=7, head_slots=4, attention_qk=25)
    """
    ids = batch["input_ids"]
    rows, width = int(ids.shape[0]), int(ids.shape[-1])
    if "cu_seq_lens_q" not in batch:  # padded rows: dense T x T attention, the fused head drops the last position
        return Workload(rows * width, rows * (width - 1), rows * width * width)
    q = np.diff(_np(batch["cu_seq_lens_q"]).astype(np.int64))
    k = np.diff(_np(batch["cu_seq_lens_k"]).astype(np.int64)) if "cu_seq_lens_k" in batch else q
    head = int((_np(batch["shift_labels"]) != -100).sum()) if scored_head else rows * width
    return Workload(rows * width, head, int((q * k).sum()))


STEP_FORWARDS = 4  # policy forward + backward (~3 forwards) + the reference forward (1)
