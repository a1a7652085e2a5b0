"""Tiny models of the families the tests compare beside ``trl_padfree.testing``'s Llama: decoder configs with
sliding windows (``decoder_config``), and Falcon / MPT checkpoints that cannot use ``"padfree"``
(``save_tiny_model`` with ``FALCON`` / ``MPT`` sizes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from trl_padfree.testing import tiny_llama_config

# transformers builds Falcon's attention from a table of its own, without "padfree" (a KeyError at load)
FALCON = dict(hidden_size=32, num_attention_heads=2, num_hidden_layers=1)
# MPT computes attention itself, never through transformers' AttentionInterface
MPT = dict(d_model=32, n_heads=2, n_layers=1, max_seq_len=128)


def decoder_config(kind: str, *, sliding_window: int, **sizes: Any) -> PretrainedConfig:
    """A ``"llama"`` (full attention), ``"mistral"`` (every layer windowed) or ``"qwen2"`` (first layer full, the
    others windowed: both mask kinds in one model) config of ``sizes``."""
    if kind == "llama":
        return tiny_llama_config(**sizes)
    if kind == "mistral":
        return AutoConfig.for_model("mistral", **sizes, sliding_window=sliding_window)
    if kind == "qwen2":
        return AutoConfig.for_model("qwen2", **sizes, use_sliding_window=True, sliding_window=sliding_window,
                                    max_window_layers=1)
    raise ValueError(kind)


def save_tiny_model(out: Path, model_type: str, sizes: dict[str, int], tokenizer: Any = None) -> Path:
    """A random ``model_type`` model of ``sizes`` (seed 0) saved like a checkpoint in ``out``: vocabulary 64, or
    ``tokenizer``'s (then with its special tokens, and saved beside it)."""
    ids: dict[str, int] = {"vocab_size": 64}
    if tokenizer is not None:
        ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                   bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **ids, **sizes)).save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out
