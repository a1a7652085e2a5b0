"""The padding-free layout of GRPO/RLOO rows, and the way back to TRL's ``[N, logits_to_keep]`` tensors.

TRL's ``GRPOTrainer`` and ``RLOOTrainer`` score ``N`` rows ``prompt + completion``: prompts left-padded, completions
right-padded, ``attention_mask`` 1 on the real tokens, and the log-prob of completion token ``j`` of row ``i`` at
``[i, j]`` of a ``[N, logits_to_keep]`` tensor (0 where the completion is padding). :func:`pack_completion_rows`
lays the real tokens of those rows out in ONE row with no padding (``position_ids`` restarting at 0,
``cu_seq_lens``), built with :class:`~trl_padfree.preference.PreferenceLayout` as DPO's batches are;
:func:`scatter_scores` puts each packed position's value back at ``[i, j]``.

With ``prompt_once=True`` the rows of the same prompt (a GRPO group, or the part of it in this micro-batch) share
one forwarded copy of it: the first row is laid out whole; every later one is ``[last prompt token] + completion``,
its positions continuing the prompt's, and its keys are the shared prompt's first ``P - 1`` tokens followed by its
own (``padfree_kv_index``, read by the ``"padfree"`` attention only), so it attends to the prompt and to itself and
never to a sibling.

>>> import torch
>>> ids = torch.tensor([[0, 7, 8, 3, 4, 0], [0, 7, 8, 5, 0, 0], [9, 9, 9, 6, 6, 6]])  # 3 prompt + 3 completion
>>> mask = torch.tensor([[0, 1, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
>>> flat = pack_completion_rows(ids, mask, 3)
>>> flat["input_ids"].tolist(), flat["position_ids"].tolist(), flat["cu_seq_lens_q"].tolist()
([[7, 8, 3, 4, 7, 8, 5, 9, 9, 9, 6, 6, 6]], [[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4, 5]], [0, 4, 7, 13])
>>> once = pack_completion_rows(ids, mask, 3, prompt_once=True)
>>> once["input_ids"].tolist(), once["position_ids"].tolist(), once["padfree_kv_index"].tolist()[:7]
([[7, 8, 3, 4, 8, 5, 9, 9, 9, 6, 6, 6]], [[0, 1, 2, 3, 1, 2, 0, 1, 2, 3, 4, 5]], [0, 1, 2, 3, 0, 4, 5])
>>> once["stats"]
PackStats(rows=3, padded_tokens=18, real_tokens=13, forwarded_tokens=12, shared_tokens=1)
>>> logps = torch.arange(12.0)[None]  # one value per packed position (it scores the next token)
>>> scatter_scores(logps, once, 3).tolist()
[[1.0, 2.0, 0.0], [4.0, 0.0, 0.0], [8.0, 9.0, 10.0]]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .preference import DataCollatorForPreference, PreferenceLayout

__all__ = ["PackStats", "pack_completion_rows", "real_spans", "scatter_scores"]


@dataclass(frozen=True)
class PackStats:
    """What one packed micro-batch holds.

    Attributes:
        rows: sequences (``prompt + completion``) in it.
        padded_tokens: tokens TRL's padded layout forwards for them (``rows x (P + C)``).
        real_tokens: their real tokens (``attention_mask`` 1), every prompt counted once per row.
        forwarded_tokens: tokens of the packed row (the real ones, less what ``prompt_once`` shares).
        shared_tokens: prompt tokens not forwarded again because a sibling's copy is shared.
    """

    rows: int
    padded_tokens: int
    real_tokens: int
    forwarded_tokens: int
    shared_tokens: int


def real_spans(attention_mask: torch.Tensor, logits_to_keep: int) -> list[tuple[int, int]]:
    """``(prompt tokens, completion tokens)`` of each row: a left-padded prompt and a right-padded completion.

    Raises ValueError where a row's mask has a hole (a layout TRL does not build and this one cannot reproduce).

    >>> real_spans(torch.tensor([[0, 1, 1, 1, 0], [1, 1, 0, 0, 0]]), 3)
    [(1, 2), (2, 0)]
    """
    if attention_mask.ndim != 2:
        raise ValueError(f"attention_mask must be (rows, prompt + completion), got shape {tuple(attention_mask.shape)}")
    width = attention_mask.shape[1]
    if not 0 < logits_to_keep <= width:
        raise ValueError(f"logits_to_keep={logits_to_keep} must be in [1, {width}] (the completion width)")
    mask = attention_mask.detach().to("cpu", torch.bool)
    prompt, completion = mask[:, : width - logits_to_keep], mask[:, width - logits_to_keep :]
    p_len, c_len = prompt.sum(1), completion.sum(1)
    left = prompt == (torch.arange(prompt.shape[1])[None] >= (prompt.shape[1] - p_len)[:, None])
    right = completion == (torch.arange(completion.shape[1])[None] < c_len[:, None])
    bad = (~(left.all(1) & right.all(1))).nonzero().flatten().tolist()
    if bad:
        raise ValueError(
            f"padding-free RL needs left-padded prompts and right-padded completions (as TRL's trainers build "
            f"them); rows {bad[:5]} have a hole in their attention_mask. Set padding_free=False for this batch layout."
        )
    return list(zip(p_len.tolist(), c_len.tolist(), strict=True))


def pack_completion_rows(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, *, prompt_once: bool = False,
    pad_token_id: int = 0, pad_to_multiple_of: int | None = None,
) -> dict[str, Any]:
    """One flat row of TRL's ``prompt + completion`` rows (see the module docstring).

    Returns the model inputs (``input_ids``, ``position_ids``, ``cu_seq_lens_q/k``, ``max_length_q/k``, ``seq_idx``
    and, where prompts are shared, ``padfree_kv_index``), ``shift_labels`` (the next token at scored positions,
    -100 elsewhere), ``score_index`` (the row a position scores, -1 where none), ``score_rank`` (1 + the completion
    column it scores) and ``stats`` (:class:`PackStats`). A row with an empty completion (e.g. a truncated one TRL
    masked) keeps its prompt, unscored, unless a sibling's prompt is already there.
    """
    if input_ids.shape != attention_mask.shape:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} differ")
    spans = real_spans(attention_mask, logits_to_keep)
    rows, width = input_ids.shape
    prompt_width = width - logits_to_keep
    ids = input_ids.detach().to("cpu").tolist()
    layout = PreferenceLayout.empty()
    first_of: dict[tuple[int, ...], tuple[int, int]] = {}  # prompt -> (its first token in the row, its length)
    real = shared = 0
    for i, (p_len, c_len) in enumerate(spans):
        if p_len == 0:
            raise ValueError(f"row {i} has no prompt token: TRL scores a completion's first token from the prompt's "
                             "last one, so padding-free RL needs a non-empty prompt in every row")
        prompt = ids[i][prompt_width - p_len : prompt_width]
        completion = ids[i][prompt_width : prompt_width + c_len]
        real += p_len + c_len
        key = tuple(prompt)
        if prompt_once and key in first_of:
            if not completion:
                shared += p_len
                continue
            start, length = first_of[key]
            layout.segment(prompt[-1:], completion, i, start_position=length - 1,
                           shared_keys=list(range(start, start + length - 1)))
            shared += p_len - 1
        else:
            first_of.setdefault(key, (len(layout.ids), p_len))
            layout.segment(prompt, completion, i)
    out = DataCollatorForPreference(pad_token_id=pad_token_id, pad_to_multiple_of=pad_to_multiple_of)._tensors(layout)
    out["stats"] = PackStats(rows=rows, padded_tokens=rows * width, real_tokens=real,
                             forwarded_tokens=len(layout.ids), shared_tokens=shared)
    return out


def scatter_scores(values: torch.Tensor, packed: dict[str, Any], logits_to_keep: int) -> torch.Tensor:
    """``[rows, logits_to_keep]``: each packed position's value at the (row, completion column) it scores, 0 elsewhere.

    ``values`` is ``(1, T)`` (or ``(T,)``) over the packed row, e.g. the fused LM head's ``log_probs`` or
    ``entropy`` given ``shift_labels``; the gradient flows back to the scored positions.
    """
    flat = values.reshape(-1)
    index = packed["score_index"].reshape(-1).to(flat.device)
    rank = packed["score_rank"].reshape(-1).to(flat.device)
    if flat.numel() != index.numel():
        raise ValueError(f"{flat.numel()} values for a packed row of {index.numel()} positions")
    keep = index >= 0
    return flat.new_zeros(packed["stats"].rows, logits_to_keep).index_put((index[keep], rank[keep] - 1), flat[keep])
