"""Padding-free reward-model batches: the chosen and rejected sequences of B pairs in one row, and where to read
each sequence's score.

TRL's ``RewardTrainer`` pads ``chosen_ids`` and ``rejected_ids`` into ``(2B, T)`` and its sequence-classification
model reads each row's score at the row's rightmost token that is not ``pad_token_id``. Here the 2B sequences are
laid out in one row by :class:`~trl_padfree.preference.PreferenceLayout` (the DPO collator's layout, so the same
``position_ids`` / ``cu_seq_lens`` / shared-key index), and ``score_positions`` (2B,) says at which position of the
row each sequence's score is read: the same token TRL's pooling picks in that sequence (its rightmost non-pad
token; the first token when every token is the pad token, as ``argmax`` of zeros gives).

With ``prompt_once`` a pair's shared part is the longest common token prefix ``P`` of ``chosen_ids`` and
``rejected_ids`` (an explicit ``prompt`` column is concatenated before tokenizing by TRL, so this covers it and
the implicit case alike, and is exact by construction: the tokens are the same). The pair is laid out as DPO's
prompt-once pair: ``[P + chosen tail]`` then ``[P[-1] + rejected tail]`` whose keys are ``P[:-1]`` (computed once)
plus its own. A rejected token inside ``P[:-1]`` has exactly the hidden state of the same token of the chosen
segment, so a score read there is read in the chosen segment.

Example (pad id 0; chosen ``[7, 8, 9]``, rejected ``[7, 8, 5, 0]``: its score is read at ``5``):

    >>> pair = {"chosen_ids": [7, 8, 9], "rejected_ids": [7, 8, 5, 0]}
    >>> flat = DataCollatorForRewardPairs(pad_token_id=0)([pair])
    >>> flat["input_ids"].tolist(), flat["position_ids"].tolist(), flat["score_positions"].tolist()
    ([[7, 8, 9, 7, 8, 5, 0]], [[0, 1, 2, 0, 1, 2, 3]], [2, 5])
    >>> once = DataCollatorForRewardPairs(pad_token_id=0, prompt_once=True)([pair])
    >>> once["input_ids"].tolist(), once["position_ids"].tolist(), once["score_positions"].tolist()
    ([[7, 8, 9, 8, 5, 0]], [[0, 1, 2, 1, 2, 3]], [2, 4])
    >>> once["padfree_kv_index"].tolist(), once["num_tokens"]
    ([0, 1, 2, 0, 3, 4, 5], 7)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from accelerate.utils import is_peft_model
from torch import nn

from .preference import DataCollatorForPreference, PreferenceLayout

__all__ = ["DataCollatorForRewardPairs", "pooled_index", "reward_layout", "score_head", "scores_of", "shared_prefix"]


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists.

    >>> shared_prefix([1, 2, 3], [1, 2, 4, 5]), shared_prefix([1], [2]), shared_prefix([1, 2], [1, 2])
    (2, 0, 2)
    """
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


def pooled_index(ids: Sequence[int], pad_token_id: int | None) -> int:
    """The token whose score a sequence-classification model reports for ``ids`` in a padded batch.

    transformers' ``GenericForSequenceClassification`` takes the rightmost token that is not ``pad_token_id``
    (``argmax`` of ``index * (ids != pad)``: 0 when every token is the pad token); without a pad token, the last.

    >>> pooled_index([5, 6, 0, 0], 0), pooled_index([5, 0, 6], 0), pooled_index([0, 0], 0), pooled_index([5, 6], None)
    (1, 2, 0, 1)
    """
    if pad_token_id is None:
        return len(ids) - 1
    keep = np.flatnonzero(np.asarray(ids) != pad_token_id)
    return int(keep[-1]) if keep.size else 0


def reward_layout(
    examples: Sequence[dict[str, Any]], *, prompt_once: bool = False
) -> tuple[PreferenceLayout, list[np.ndarray]]:
    """Lay the pairs out in one row; also return, per sequence (chosen ``0..B-1``, then rejected ``B..2B-1``), the
    row position that computes each of its tokens' hidden state (``rows[s][i]``: token ``i`` of sequence ``s``).

    >>> layout, rows = reward_layout([{"chosen_ids": [1, 2, 3], "rejected_ids": [1, 2, 4]}], prompt_once=True)
    >>> layout.ids, [r.tolist() for r in rows]
    ([1, 2, 3, 2, 4], [[0, 1, 2], [0, 3, 4]])
    """
    pairs = len(examples)
    layout = PreferenceLayout.empty()
    rows: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * (2 * pairs)
    for j, ex in enumerate(examples):
        chosen, rejected = list(ex["chosen_ids"]), list(ex["rejected_ids"])
        for name, seq in (("chosen_ids", chosen), ("rejected_ids", rejected)):
            if not seq:
                raise ValueError(f"pair {j} has empty {name}: drop such pairs from the dataset (a reward model needs "
                                 "at least one token to score)")
        first = len(layout.ids)
        layout.segment(chosen, [], j)
        second = len(layout.ids)
        rows[j] = np.arange(first, second)
        # with a shared prefix P: the rejected segment is P[-1] + its tail, its keys P[:-1] (the chosen's) + its own
        shared = max(shared_prefix(chosen, rejected) - 1, 0) if prompt_once else 0
        layout.segment(rejected[shared:], [], pairs + j, start_position=shared,
                       shared_keys=list(range(first, first + shared)))
        rows[pairs + j] = np.concatenate([np.arange(first, first + shared),
                                          np.arange(second, second + len(rejected) - shared)])
    return layout, rows


@dataclass
class DataCollatorForRewardPairs:
    """Padding-free counterpart of TRL's reward ``DataCollatorForPreference`` (``chosen_ids``, ``rejected_ids``,
    optional ``margin``).

    Args:
        pad_token_id: the tokenizer's pad token: which token's score is read (:func:`pooled_index`), and the id of
            ``pad_to_multiple_of``'s padding (a segment of its own, never scored).
        pad_to_multiple_of: pad the row's length to a multiple of it.
        prompt_once: compute each pair's common prefix once (needs ``attn_implementation="padfree"``).

    Returns the model inputs of :data:`~trl_padfree.preference.MODEL_KEYS` and ``score_positions`` (2B,),
    ``num_pairs``, ``num_tokens`` (the tokens TRL's padded batch counts: every sequence's length) and ``margin``
    (B,) when the examples have one.
    """

    pad_token_id: int | None
    pad_to_multiple_of: int | None = None
    prompt_once: bool = False
    return_tensors: str = "pt"

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        DataCollatorForPreference.check_batch(examples, "DataCollatorForRewardPairs", "reward pairs",
                                              ("chosen_ids", "rejected_ids"), "RewardTrainer", "chosen/rejected")
        layout, rows = reward_layout(examples, prompt_once=self.prompt_once)
        pairs = len(examples)
        seqs = [ex["chosen_ids"] for ex in examples] + [ex["rejected_ids"] for ex in examples]
        positions = [int(r[pooled_index(s, self.pad_token_id)]) for r, s in zip(rows, seqs, strict=True)]
        pad_id = 0 if self.pad_token_id is None else self.pad_token_id
        batch = DataCollatorForPreference(pad_token_id=pad_id, pad_to_multiple_of=self.pad_to_multiple_of,
                                          prompt_once=self.prompt_once)._tensors(layout)
        for key in ("shift_labels", "score_index", "score_rank"):  # the LM scoring of DPO: not used here
            batch.pop(key)
        batch["score_positions"] = torch.tensor(positions, dtype=torch.long)
        batch["num_pairs"] = pairs
        batch["num_tokens"] = sum(len(s) for s in seqs)
        if "margin" in examples[0]:
            batch["margin"] = torch.tensor([ex["margin"] for ex in examples], dtype=torch.float)
        return batch


def score_head(model: nn.Module) -> nn.Module:
    """The module whose output is the per-position score (``model.score``; through PEFT and other wrappers)."""
    base = model
    for _ in range(4):  # DDP / accelerate wrappers (.module), PEFT (.get_base_model())
        if is_peft_model(base):
            base = base.get_base_model()
        elif isinstance(getattr(base, "module", None), nn.Module) and not hasattr(base, "score"):
            base = base.module
        else:
            break
    head = getattr(base, "score", None)
    if not isinstance(head, nn.Module):
        raise ValueError(
            f"padding-free reward training reads every position's score from the model's `score` head, and "
            f"{type(base).__name__} has none. Use an AutoModelForSequenceClassification of a decoder model "
            "(LlamaForSequenceClassification, Qwen2ForSequenceClassification, ...) or set padding_free=False."
        )
    return head


def scores_of(model: nn.Module, inputs: dict[str, Any]) -> tuple[Any, torch.Tensor]:
    """``(model outputs, per-position scores (T, num_labels))`` of a one-row batch, from ``model``'s own forward."""
    captured: list[torch.Tensor] = []
    handle = score_head(model).register_forward_hook(lambda module, args, output: captured.append(output))
    try:
        outputs = model(**inputs)
    finally:
        handle.remove()
    if len(captured) != 1:
        raise RuntimeError(f"the score head ran {len(captured)} times in one forward (expected once); padding-free "
                           "reward training cannot tell which output holds the per-position scores")
    scores = captured[0]
    if scores.dim() != 3 or scores.shape[0] != 1:
        raise RuntimeError(f"expected the score head to output (1, T, num_labels), got {tuple(scores.shape)}")
    return outputs, scores[0]
