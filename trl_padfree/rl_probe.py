"""Probe whether a model keeps the rows of a padding-free GRPO/RLOO micro-batch apart.

:func:`check_group_packing` builds a padded batch as TRL's RL trainers do (prompts left-padded, completions
right-padded) of a few random groups (one prompt, several completions), interleaved as TRL's shuffle leaves them,
lays it out with :func:`~trl_padfree.rl_packing.pack_completion_rows` (the layout training uses) and compares every
position's logits with those of each ``prompt + completion`` run alone. With ``prompt_once`` a later sibling's
segment (``[last prompt token] + completion``) must equal the tail of its sequence alone: it sees its prompt's shared
keys and not its siblings. Same tolerance, deterministic train mode and report as
:func:`trl_padfree.probe.check_packing` (:class:`~trl_padfree.probe.PackingReport`).

>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
...                      num_attention_heads=2, num_key_value_heads=1)
>>> model = LlamaForCausalLM._from_config(config, attn_implementation="padfree")
>>> check_group_packing(model, prompt_once=True).status
'safe'
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .probe import (
    PackingLeakError,
    PackingReport,
    alone_batch,
    deterministic_train_mode,
    error_line,
    layout_report,
    model_vocab_size,
    probe_logits,
    probe_setting,
    random_sequences,
)

__all__ = ["DEFAULT_GROUPS", "assert_group_packing_safe", "check_group_packing", "probe_rows"]

DEFAULT_GROUPS: tuple[tuple[int, tuple[int, ...]], ...] = ((5, (3, 1, 4)), (2, (2, 5, 1)), (4, (3,)))
"""(prompt length, completion lengths) of the probe's groups: uneven, so every boundary matters."""


def probe_rows(groups: Sequence[tuple[int, Sequence[int]]], vocab_size: int, pad_id: int | None,
               seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """Random ``(prompt, completion)`` rows of ``groups``, interleaved (g0c0, g1c0, g2c0, g0c1, ...).

    >>> [(len(p), len(c)) for p, c in probe_rows(((3, (1, 2)), (2, (4,))), 50, None)]
    [(3, 1), (2, 4), (3, 2)]
    """
    if not groups or any(p < 1 or not cs or min(cs) < 1 for p, cs in groups):
        raise ValueError(f"probe groups need a prompt and completions of at least one token each, got {groups!r}")
    lengths = [n for p, cs in groups for n in (p, *cs)]
    seqs = iter(random_sequences(lengths, vocab_size, pad_id, seed))
    per_group = []
    for _, cs in groups:
        prompt = next(seqs)
        per_group.append([(prompt, next(seqs)) for _ in cs])
    depth = max(len(g) for g in per_group)
    return [g[k] for k in range(depth) for g in per_group if k < len(g)]


def _padded(rows: Sequence[tuple[list[int], list[int]]], pad: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """TRL's padded batch of ``rows``: ``(input_ids, attention_mask, completion width)``."""
    p_width = max(len(p) for p, _ in rows)
    c_width = max(len(c) for _, c in rows)
    ids = torch.full((len(rows), p_width + c_width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, c) in enumerate(rows):
        ids[i, p_width - len(p) : p_width] = torch.tensor(p)
        ids[i, p_width : p_width + len(c)] = torch.tensor(c)
        mask[i, p_width - len(p) : p_width + len(c)] = 1
    return ids, mask, c_width


def check_group_packing(
    model: nn.Module,
    *,
    prompt_once: bool = False,
    groups: Sequence[tuple[int, Sequence[int]]] = DEFAULT_GROUPS,
    seed: int = 0,
    rtol: float | None = None,
) -> PackingReport:
    """Run random groups in the RL trainers' packed layout and each sequence alone; compare the logits."""
    from .preference import MODEL_KEYS
    from .rl_packing import pack_completion_rows

    start = time.perf_counter()
    setting = device, _, _ = probe_setting(model, rtol)
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    pad_id = getattr(text_config, "pad_token_id", None)
    rows = probe_rows(groups, model_vocab_size(model), pad_id, seed)
    ids, mask, width = _padded(rows, pad_id if isinstance(pad_id, int) else 0)
    packed = pack_completion_rows(ids, mask, width, prompt_once=prompt_once)
    inputs = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in packed.items() if k in MODEL_KEYS}
    bounds = packed["cu_seq_lens_q"].tolist()
    error = None
    with deterministic_train_mode(model):
        expected, seen = [], set()
        for prompt, completion in rows:
            alone = probe_logits(model, {k: (v.to(device) if isinstance(v, torch.Tensor) else v)
                                    for k, v in alone_batch(prompt + completion).items()})
            shared = prompt_once and tuple(prompt) in seen
            seen.add(tuple(prompt))
            expected.append(alone[len(prompt) - 1 :] if shared else alone)
        got = None
        try:
            packed = probe_logits(model, {**inputs, "use_cache": False})
            got = [packed[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        except Exception as exc:  # the Trainer would hit the same error: report it
            error = error_line(exc)
    return layout_report(model, expected=expected, got=got, error=error, setting=setting,
                         lengths=[len(p) + len(c) for p, c in rows], start=start, batch="GRPO/RLOO batch",
                         values="logits", prompt_once=prompt_once, fix="padding_free=False")

def assert_group_packing_safe(model: nn.Module, **kwargs: Any) -> PackingReport:
    """Like :func:`check_group_packing`, but raise :class:`~trl_padfree.probe.PackingLeakError` unless safe."""
    report = check_group_packing(model, **kwargs)
    if not report.ok:
        raise PackingLeakError(report)
    return report
