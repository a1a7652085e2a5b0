"""Padding-free preference batches: the 2B sequences of B (prompt, chosen, rejected) pairs in one row.

TRL's ``DataCollatorForPreference`` pads ``prompt + chosen`` and ``prompt + rejected`` of every pair into a
``(2B, T)`` rectangle. :class:`DataCollatorForPreference` here lays the same tokens out in one row without padding,
with the sequence boundaries that varlen attention needs, in one of two layouts:

* **padding-free** (``prompt_once=False``): every sequence ``prompt + response`` is a segment of its own, exactly
  the layout of the SFT collator (:func:`trl_padfree.flattening.packed_batch`);
* **prompt once** (``prompt_once=True``): a pair is ``[prompt, chosen, p, rejected]`` where ``p`` is the last prompt
  token again. Query segment 1 is ``prompt + chosen`` (ordinary causal attention); query segment 2 is ``p +
  rejected``, whose keys are ``prompt[:-1] + p + rejected``: the prompt's keys and values computed once serve both
  responses (:data:`trl_padfree.attention.KV_INDEX`), and the rejected response never sees the chosen one. ``p``
  is repeated so that the hidden state predicting the first rejected token exists in segment 2 (one token per
  pair). Tokens through the MLPs per pair: ``|P| + |C| + |R| + 1`` instead of ``2|P| + |C| + |R|``. A pair whose
  two truncated prompts differ (``truncation_mode="keep_end"`` cutting into the prompt) is laid out as two
  segments, as without ``prompt_once``.

Scoring is by position: ``shift_labels[i]`` is the token whose log-probability the hidden state at ``i`` scores
(``-100``: none), ``score_index[i]`` the sequence it counts for (chosen of pair ``j`` is ``j``, rejected ``B + j``;
``-1``: none) and ``score_rank[i]`` its 1-based place in that response. Per-sequence sums are segment sums over
the row (:func:`segment_sum`); nothing is padded back into ``(2B, T)``.

Example (prompt ``[1, 2]``, chosen ``[3, 4]``, rejected ``[5]``):

    >>> pair = {"prompt_ids": [1, 2], "chosen_ids": [3, 4], "rejected_ids": [5]}
    >>> flat = DataCollatorForPreference(pad_token_id=0)([pair])
    >>> flat["input_ids"].tolist(), flat["position_ids"].tolist(), flat["cu_seq_lens_q"].tolist()
    ([[1, 2, 3, 4, 1, 2, 5]], [[0, 1, 2, 3, 0, 1, 2]], [0, 4, 7])
    >>> flat["shift_labels"].tolist(), flat["score_index"].tolist()
    ([[-100, 3, 4, -100, -100, 5, -100]], [[-1, 0, 0, -1, -1, 1, -1]])
    >>> once = DataCollatorForPreference(pad_token_id=0, prompt_once=True)([pair])
    >>> once["input_ids"].tolist(), once["position_ids"].tolist()
    ([[1, 2, 3, 4, 2, 5]], [[0, 1, 2, 3, 1, 2]])
    >>> once["cu_seq_lens_q"].tolist(), once["cu_seq_lens_k"].tolist(), once["padfree_kv_index"].tolist()
    ([0, 4, 6], [0, 4, 7], [0, 1, 2, 3, 0, 4, 5])
    >>> once["shift_labels"].tolist(), once["score_index"].tolist(), once["score_rank"].tolist()
    ([[-100, 3, 4, -100, 5, -100]], [[-1, 0, 0, -1, 1, -1]], [[0, 1, 2, 0, 1, 0]])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .attention import KV_INDEX
from .flattening import packed_batch

__all__ = ["MODEL_KEYS", "DataCollatorForPreference", "PreferenceLayout", "segment_sum", "truncate_pair"]

IGNORE = -100
#: The keys of the collator's batch that go to the model (the rest drive the loss).
MODEL_KEYS = ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
              "seq_idx", KV_INDEX)


def truncate_pair(
    prompt: Sequence[int], response: Sequence[int], max_length: int | None, truncation_mode: str
) -> tuple[list[int], list[int]]:
    """``(prompt part, response part)`` of ``prompt + response`` cut to ``max_length`` as TRL's collator cuts it.

    >>> truncate_pair([1, 2, 3], [4, 5], 4, "keep_start"), truncate_pair([1, 2, 3], [4, 5], 3, "keep_end")
    (([1, 2, 3], [4]), ([3], [4, 5]))
    """
    prompt, response = list(prompt), list(response)
    if max_length is None or len(prompt) + len(response) <= max_length:
        return prompt, response
    if truncation_mode == "keep_start":
        keep = max_length - len(prompt)
        return (prompt[:max_length], []) if keep <= 0 else (prompt, response[:keep])
    if truncation_mode == "keep_end":
        if max_length <= len(response):
            return [], response[len(response) - max_length :] if max_length > 0 else []
        return prompt[len(prompt) - (max_length - len(response)) :], response
    raise ValueError(f"Unsupported truncation mode: {truncation_mode}, expected 'keep_end' or 'keep_start'")


@dataclass
class PreferenceLayout:
    """The flat row being built: tokens, their positions, query segments, key layout and scoring (lists)."""

    ids: list[int]
    positions: list[int]
    q_bounds: list[int]
    k_bounds: list[int]
    kv_index: list[int]
    shift_labels: list[int]
    score_index: list[int]
    score_rank: list[int]

    @classmethod
    def empty(cls) -> PreferenceLayout:
        return cls([], [], [0], [0], [], [], [], [])

    def segment(self, prompt: list[int], response: list[int], seq: int, *, start_position: int = 0,
                shared_keys: list[int] | None = None) -> None:
        """Append one query segment ``prompt + response`` (``prompt`` may be ``[p]`` continuing shared keys)."""
        first = len(self.ids)
        tokens = prompt + response
        self.ids += tokens
        self.positions += range(start_position, start_position + len(tokens))
        keys = (shared_keys or []) + list(range(first, first + len(tokens)))
        self.kv_index += keys
        self.q_bounds.append(len(self.ids))
        self.k_bounds.append(len(self.kv_index))
        # token i predicts token i + 1, scored where that one is a response token: i in [before, before + scored)
        before = min(max(len(prompt) - 1, 0), len(tokens))
        targets = tokens[before + 1 :]
        after = len(tokens) - before - len(targets)
        self.shift_labels += [IGNORE] * before + targets + [IGNORE] * after
        self.score_index += [-1] * before + [seq] * len(targets) + [-1] * after
        first_rank = before + 2 - len(prompt)  # the rank of the first scored target (1 for the first response token)
        self.score_rank += [0] * before + list(range(first_rank, first_rank + len(targets))) + [0] * after


def segment_sum(values: torch.Tensor, index: torch.Tensor, count: int) -> torch.Tensor:
    """Sum ``values`` per ``index`` (entries with index ``-1`` are left out) into a ``(count,)`` tensor.

    >>> segment_sum(torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([0, -1, 1, 0]), 2).tolist()
    [5.0, 3.0]
    """
    values, index = values.reshape(-1), index.reshape(-1).to(values.device)
    keep = index >= 0
    out = values.new_zeros(count)
    return out.index_add(0, index[keep], values[keep])


@dataclass
class DataCollatorForPreference:
    """Padding-free counterpart of TRL's ``DataCollatorForPreference`` (same inputs, same truncation).

    Args:
        pad_token_id: used only by ``pad_to_multiple_of`` (the padding is a segment of its own, never scored).
        max_length: each ``prompt + response`` is cut to it, as by TRL's collator (``truncation_mode``).
        truncation_mode: ``"keep_start"`` (default) or ``"keep_end"``.
        pad_to_multiple_of: pad the row's length to a multiple of it (a separate, unscored segment).
        prompt_once: lay each pair out with its prompt computed once (see the module docstring); needs
            ``attn_implementation="padfree"``.

    Returns a dict of model inputs (``input_ids``, ``position_ids``, ``cu_seq_lens_q/k``, ``max_length_q/k``,
    ``seq_idx`` and, with ``prompt_once``, ``padfree_kv_index``) and scoring tensors (``shift_labels``,
    ``score_index``, ``score_rank``, ``completion_lens`` (2B,), ``num_pairs``, ``num_tokens``), plus
    ``ref_chosen_logps`` / ``ref_rejected_logps`` when the examples have them.
    """

    pad_token_id: int
    max_length: int | None = None
    truncation_mode: str = "keep_start"
    pad_to_multiple_of: int | None = None
    prompt_once: bool = False
    return_tensors: str = "pt"

    def __post_init__(self) -> None:
        if self.truncation_mode not in {"keep_start", "keep_end"}:
            raise ValueError(
                f"Unsupported truncation mode: {self.truncation_mode}, expected 'keep_end' or 'keep_start'"
            )

    @staticmethod
    def check_batch(examples: list[dict[str, Any]], collator: str, what: str, keys: tuple[str, ...], trainer: str,
                    data: str) -> None:
        """Refuse an empty batch, or examples without ``keys`` (the fix: tokenize them as TRL's ``trainer`` does)."""
        if not examples:
            raise ValueError(f"{collator} got an empty batch")
        missing = [k for k in keys if k not in examples[0]]
        if missing:
            names = ", ".join(map(repr, keys[:-1])) + f" and {keys[-1]!r}"
            raise ValueError(f"{what} need {names}; missing {missing}. Tokenize the dataset as TRL's {trainer} does "
                             f"(it does so for {data} data).")

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        self.check_batch(examples, "DataCollatorForPreference", "preference examples",
                       ("prompt_ids", "chosen_ids", "rejected_ids"), "DPOTrainer", "prompt/chosen/rejected")
        pairs = len(examples)
        layout = PreferenceLayout.empty()
        completion_lens = [0] * (2 * pairs)
        num_tokens = 0
        for j, ex in enumerate(examples):
            p_c, chosen = truncate_pair(ex["prompt_ids"], ex["chosen_ids"], self.max_length, self.truncation_mode)
            p_r, rejected = truncate_pair(ex["prompt_ids"], ex["rejected_ids"], self.max_length,
                                          self.truncation_mode)
            completion_lens[j], completion_lens[pairs + j] = len(chosen), len(rejected)
            num_tokens += len(p_c) + len(chosen) + len(p_r) + len(rejected)
            if self.prompt_once and p_c == p_r and p_c:
                first = len(layout.ids)
                layout.segment(p_c, chosen, j)
                shared = list(range(first, first + len(p_c) - 1))
                layout.segment(p_c[-1:], rejected, pairs + j, start_position=len(p_c) - 1, shared_keys=shared)
            else:
                layout.segment(p_c, chosen, j)
                layout.segment(p_r, rejected, pairs + j)
        out = self._tensors(layout)
        out["completion_lens"] = torch.tensor(completion_lens, dtype=torch.long)
        out["num_pairs"] = pairs
        out["num_tokens"] = num_tokens
        for key in ("ref_chosen_logps", "ref_rejected_logps"):
            if key in examples[0]:
                out[key] = torch.tensor([ex[key] for ex in examples])
        return out

    def _tensors(self, layout: PreferenceLayout) -> dict[str, Any]:
        ids = np.asarray(layout.ids, dtype=np.int64)
        batch = packed_batch(ids, np.asarray(layout.shift_labels, dtype=np.int64),
                             np.asarray(layout.q_bounds, dtype=np.int64), pad_to_multiple_of=self.pad_to_multiple_of,
                             pad_id=self.pad_token_id, ignore_index=IGNORE)
        extra = batch["input_ids"].shape[1] - ids.size
        batch["shift_labels"] = batch.pop("labels")
        for key, fill in (("score_index", -1), ("score_rank", 0)):
            values = np.concatenate([np.asarray(getattr(layout, key), dtype=np.int64), np.full(extra, fill, np.int64)])
            batch[key] = torch.from_numpy(values)[None]
        # positions follow the layout (prompt-once segments continue the prompt's positions); padding restarts at 0
        positions = np.concatenate([np.asarray(layout.positions, dtype=np.int64), np.arange(extra, dtype=np.int64)])
        batch["position_ids"] = torch.from_numpy(positions)[None]
        if layout.k_bounds != layout.q_bounds:
            kv = np.concatenate([np.asarray(layout.kv_index, dtype=np.int64), np.arange(ids.size, ids.size + extra)])
            cu_k = np.asarray(layout.k_bounds + ([layout.k_bounds[-1] + extra] if extra else []), dtype=np.int64)
            batch[KV_INDEX] = torch.from_numpy(kv)
            batch["cu_seq_lens_k"] = torch.from_numpy(cu_k.astype(np.int32))
            batch["max_length_k"] = int(np.diff(cu_k).max())
        return batch
