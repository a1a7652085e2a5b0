"""Tiny models beside ``trl_padfree.testing``'s Llama: sliding-window decoder configs, GPT-Neo / MPT checkpoints that
cannot use ``"padfree"`` (``save_tiny_model``), today's families for the trainer tests (``family_model``), and
``trl_padfree.families``' models skipped where transformers lacks them (``tiny_family``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from trl_padfree.families import family_available, tiny_family_model
from trl_padfree.testing import tiny_llama_config

# GPT-Neo builds its attention from a table of its own (no "padfree" in it: a KeyError at load); its default
# attention (eager) keeps packed examples apart
GPT_NEO = dict(hidden_size=32, num_heads=2, num_layers=1, attention_types=[[["global"], 1]],
               max_position_embeddings=2048)
# MPT computes attention itself, never through transformers' AttentionInterface
MPT = dict(d_model=32, n_heads=2, n_layers=1, max_seq_len=128)


def decoder_config(kind: str, *, sliding_window: int, **sizes: Any) -> PretrainedConfig:
    """``llama`` (full), ``mistral`` (all windowed) or ``qwen2`` (first full, others windowed) config."""
    if kind == "llama":
        return tiny_llama_config(**sizes)
    if kind == "mistral":
        return AutoConfig.for_model("mistral", **sizes, sliding_window=sliding_window)
    if kind == "qwen2":
        return AutoConfig.for_model("qwen2", **sizes, use_sliding_window=True, sliding_window=sliding_window,
                                    max_window_layers=1)
    raise ValueError(kind)


def save_tiny_model(out: Path, model_type: str, sizes: dict[str, int], tokenizer: Any = None) -> Path:
    """A random seeded ``model_type`` checkpoint in ``out`` (vocabulary 64, or ``tokenizer``'s beside it)."""
    ids: dict[str, int] = {"vocab_size": 64}
    if tokenizer is not None:
        ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                   bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **ids, **sizes)).save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out


# today's families through the trainers (tests/test_family_trainers.py): 4 layers, hidden 32, the tiny vocabulary
FAMILY_TOKENS = dict(vocab_size=400, pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=False,
                     max_position_embeddings=256)
FAMILIES: dict[str, dict[str, Any]] = {
    # a Qwen3.5-like hybrid: gated delta nets (short convolution + recurrence) around one full attention layer
    "qwen3_5_text": dict(intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
                         linear_value_head_dim=8, linear_conv_kernel_dim=4,
                         layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"]),
    # GPT-OSS: attention sinks, sliding (window 6) and full layers alternating, GQA, mixture of experts
    "gpt_oss": dict(intermediate_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                    num_local_experts=4, num_experts_per_tok=2, sliding_window=6),
    # Llama-4: chunked attention (chunks of 8, crossed by every example here) on RoPE layers, full NoPE layers with
    # the attention-temperature scale (changes every 4 positions), mixture of experts
    "llama4_text": dict(intermediate_size=32, intermediate_size_mlp=64, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=8, num_local_experts=2, attention_chunk_size=8, attn_temperature_tuning=True,
                        floor_scale=4, no_rope_layer_interval=2),
}


def family_model(model_type: str, attn: str, seed: int = 0) -> Any:
    """A random tiny ``model_type`` model of :data:`FAMILIES` (fp32, seed ``seed``) with attention ``attn``."""
    config = AutoConfig.for_model(model_type, hidden_size=32, num_hidden_layers=4, **FAMILY_TOKENS,
                                  **FAMILIES[model_type])
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.get_default_dtype())


def family(model_type: str) -> str:
    """``model_type``, or the test skipped where the installed transformers lacks it (5.23, CI's lowest, lacks some)."""
    if not family_available(model_type):
        pytest.skip(f"transformers has no {model_type!r} model here")
    return model_type


def tiny_family(model_type: str, attn: str = "padfree", **kwargs: Any) -> Any:
    """``trl_padfree.families``' tiny ``model_type`` model (:func:`family`: skipped where transformers lacks it)."""
    return tiny_family_model(family(model_type), attn, **kwargs)
