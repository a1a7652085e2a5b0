"""Per-position scores of a sequence-classification model, and a probe that its packed reward pairs stay apart.

A sequence-classification model (``AutoModelForSequenceClassification``) projects every position's hidden state
with its ``score`` head and then pools one position per row. In a padding-free row that pooled position is wrong
(the row's last token), so :func:`position_scores` captures the head's output for every position with a forward
hook while the model (wrapper, DDP, PEFT and all) runs its own forward.

:func:`check_reward_packing` lays random pairs out as the trainer does (:mod:`trl_padfree.reward_layout`) and
compares the score at every token of every sequence with the score of that sequence run alone, padded path
(``attention_mask`` of ones), as :func:`trl_padfree.probe.check_packing` does for SFT (same tolerance, same
deterministic train mode, same :class:`~trl_padfree.probe.PackingReport`).

>>> from transformers import LlamaConfig, LlamaForSequenceClassification
>>> config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
...                      num_attention_heads=2, num_key_value_heads=1, num_labels=1, pad_token_id=0)
>>> model = LlamaForSequenceClassification._from_config(config, attn_implementation="padfree")
>>> check_reward_packing(model, prompt_once=True).status
'safe'
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from accelerate.utils import is_peft_model
from torch import nn

from .probe import (
    PackingLeakError,
    PackingReport,
    deterministic_train_mode,
    error_line,
    layout_report,
    model_vocab_size,
    probe_setting,
    random_sequences,
)

__all__ = ["DEFAULT_REWARD_PAIRS", "assert_reward_packing_safe", "check_reward_packing", "position_scores",
           "score_head"]

DEFAULT_REWARD_PAIRS: tuple[tuple[int, int, int], ...] = ((6, 4, 3), (3, 2, 6), (5, 5, 1), (1, 3, 2))
"""(shared prefix, chosen tail, rejected tail) lengths of the probe's pairs: uneven, so every boundary matters."""


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


@contextlib.contextmanager
def position_scores(head: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Collect the outputs of ``head`` (``(1, T, num_labels)`` per call) during the ``with`` block."""
    captured: list[torch.Tensor] = []

    def hook(module: nn.Module, args: Any, output: Any) -> None:
        captured.append(output)

    handle = head.register_forward_hook(hook)
    try:
        yield captured
    finally:
        handle.remove()


def scores_of(model: nn.Module, inputs: dict[str, Any]) -> tuple[Any, torch.Tensor]:
    """``(model outputs, per-position scores (T, num_labels))`` of a one-row batch, from ``model``'s own forward."""
    with position_scores(score_head(model)) as captured:
        outputs = model(**inputs)
    if len(captured) != 1:
        raise RuntimeError(f"the score head ran {len(captured)} times in one forward (expected once); padding-free "
                           "reward training cannot tell which output holds the per-position scores")
    scores = captured[0]
    if scores.dim() != 3 or scores.shape[0] != 1:
        raise RuntimeError(f"expected the score head to output (1, T, num_labels), got {tuple(scores.shape)}")
    return outputs, scores[0]


def check_reward_packing(
    model: nn.Module,
    *,
    prompt_once: bool = False,
    pairs: Sequence[tuple[int, int, int]] = DEFAULT_REWARD_PAIRS,
    seed: int = 0,
    rtol: float | None = None,
) -> PackingReport:
    """Run random pairs in the reward layout and each sequence alone; compare every token's score."""
    from .preference import MODEL_KEYS
    from .reward_layout import DataCollatorForRewardPairs, reward_layout

    start = time.perf_counter()
    setting = device, _, _ = probe_setting(model, rtol)
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    pad_id = getattr(text_config, "pad_token_id", None)
    lengths = [n for pair in pairs for n in pair]
    seqs = random_sequences(lengths, model_vocab_size(model), pad_id, seed)
    examples = []
    for i in range(len(pairs)):
        prefix, chosen, rejected = seqs[3 * i : 3 * i + 3]
        examples.append({"chosen_ids": prefix + chosen, "rejected_ids": prefix + rejected})
    collator = DataCollatorForRewardPairs(pad_token_id=pad_id, prompt_once=prompt_once)
    batch = collator(examples)
    _, rows = reward_layout(examples, prompt_once=prompt_once)
    alone = [ex["chosen_ids"] for ex in examples] + [ex["rejected_ids"] for ex in examples]

    def on_device(b: dict[str, Any]) -> dict[str, Any]:
        return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in b.items()}

    inputs = on_device({k: v for k, v in batch.items() if k in MODEL_KEYS})
    error = None
    with deterministic_train_mode(model):
        expected = []
        for seq in alone:
            ids = torch.tensor([seq], dtype=torch.int64)
            _, s = scores_of(model, on_device({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                               "use_cache": False}))
            expected.append(s.detach().float())
        got = None
        try:
            _, packed = scores_of(model, {**inputs, "use_cache": False})
            packed = packed.detach().float()
            got = [packed[torch.as_tensor(r, device=packed.device)] for r in rows]
        except Exception as exc:  # the Trainer would hit the same error: report it
            error = error_line(exc)
    return layout_report(model, expected=expected, got=got, error=error, setting=setting, lengths=lengths,
                         start=start, batch="reward batch", values="scores", prompt_once=prompt_once,
                         fix="RewardConfig(padding_free=False)")

def assert_reward_packing_safe(model: nn.Module, **kwargs: Any) -> PackingReport:
    """Like :func:`check_reward_packing`, but raise :class:`~trl_padfree.probe.PackingLeakError` unless safe."""
    report = check_reward_packing(model, **kwargs)
    if not report.ok:
        raise PackingLeakError(report)
    return report
