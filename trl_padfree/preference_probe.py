"""Probe whether a model keeps the sequences of a padding-free preference batch apart.

The preference layouts of :mod:`trl_padfree.preference` rely on the model's attention for two things: packed
sequences must not see each other, and with ``prompt_once`` the rejected response must see its prompt's keys (laid
out once, before the chosen response) and not the chosen response. :func:`check_preference_packing` runs a few
random (prompt, chosen, rejected) pairs through the real collator and compares every position's logits with those
of each sequence run alone, as :func:`trl_padfree.probe.check_packing` does for SFT batches (same tolerance, same
deterministic train mode, same :class:`~trl_padfree.probe.PackingReport`).

>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
...                      num_attention_heads=2, num_key_value_heads=1)
>>> model = LlamaForCausalLM._from_config(config, attn_implementation="padfree")
>>> check_preference_packing(model, prompt_once=True).status
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

__all__ = ["DEFAULT_PAIRS", "assert_preference_packing_safe", "check_preference_packing"]

DEFAULT_PAIRS: tuple[tuple[int, int, int], ...] = ((6, 4, 3), (3, 2, 6), (5, 5, 1))
"""(prompt, chosen, rejected) lengths of the probe's pairs: uneven, so every boundary matters."""


def check_preference_packing(
    model: nn.Module,
    *,
    prompt_once: bool = False,
    pairs: Sequence[tuple[int, int, int]] = DEFAULT_PAIRS,
    seed: int = 0,
    rtol: float | None = None,
) -> PackingReport:
    """Run random pairs in the preference collator's layout and each sequence alone; compare the logits."""
    from .preference import MODEL_KEYS, DataCollatorForPreference

    start = time.perf_counter()
    setting = device, _, _ = probe_setting(model, rtol)
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    lengths = [n for pair in pairs for n in pair]
    seqs = random_sequences(lengths, model_vocab_size(model), getattr(text_config, "pad_token_id", None), seed)
    examples = [{"prompt_ids": seqs[3 * i], "chosen_ids": seqs[3 * i + 1], "rejected_ids": seqs[3 * i + 2]}
                for i in range(len(pairs))]
    batch = DataCollatorForPreference(pad_token_id=0, prompt_once=prompt_once)(examples)
    def on_device(b: dict[str, Any]) -> dict[str, Any]:
        return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in b.items()}

    inputs = on_device({k: v for k, v in batch.items() if k in MODEL_KEYS})
    error = None
    with deterministic_train_mode(model):
        expected = []
        for ex in examples:
            chosen = probe_logits(model, on_device(alone_batch(ex["prompt_ids"] + ex["chosen_ids"])))
            rejected = probe_logits(model, on_device(alone_batch(ex["prompt_ids"] + ex["rejected_ids"])))
            expected.append(chosen)
            expected.append(rejected[len(ex["prompt_ids"]) - 1 :] if prompt_once else rejected)
        got = None
        try:
            packed = probe_logits(model, {**inputs, "use_cache": False})
            bounds = torch.tensor([0, *(e.shape[0] for e in expected)]).cumsum(0).tolist()
            got = [packed[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        except Exception as exc:  # the Trainer would hit the same error: report it
            error = error_line(exc)
    return layout_report(model, expected=expected, got=got, error=error, setting=setting, lengths=lengths, start=start,
                         batch="preference batch", values="logits", prompt_once=prompt_once,
                         fix="DPOConfig(padding_free=False)")

def assert_preference_packing_safe(model: nn.Module, **kwargs: Any) -> PackingReport:
    """Like :func:`check_preference_packing`, but raise :class:`~trl_padfree.probe.PackingLeakError` unless safe."""
    report = check_preference_packing(model, **kwargs)
    if not report.ok:
        raise PackingLeakError(report)
    return report
