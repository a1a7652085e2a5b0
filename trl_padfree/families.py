"""Tiny configs of today's decoder families, and the exactness check packed vs alone, for tests and scripts.

:data:`FAMILIES` maps a ``model_type`` of transformers 5.24's ``MODEL_FOR_CAUSAL_LM_MAPPING`` to the config fields
that build a tiny random model of it (vocabulary 128, hidden 64, 4 layers, few experts: at most a few hundred
thousand parameters), with every layer kind the family has: the hybrids list their layer types explicitly so that
at least one attention layer sits among the linear-attention / convolution / Mamba layers, sliding windows and
Llama-4's attention chunks are 8 tokens so that the test sequences (:data:`EXACTNESS_LENGTHS`) cross them.
:func:`tiny_family_config` builds the config (``None`` for a family the installed transformers lacks) and
:func:`packed_vs_alone` measures how far the loss and every gradient of examples packed in one row (the collator's
layout) are from the same examples run alone.

>>> config = tiny_family_config("qwen3_5_text")
>>> config.layer_types
['linear_attention', 'full_attention', 'linear_attention', 'linear_attention']
>>> tiny_family_config("no_such_family") is None
True
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = [
    "EXACTNESS_LENGTHS", "FAMILIES", "FAMILY_GROUPS", "OLDER_FAMILIES", "Exactness", "family_available",
    "packed_vs_alone", "tiny_family_config", "tiny_family_model",
]  # fmt: skip

# Shared by every family unless its entry says otherwise.
_BASE: dict[str, Any] = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=256, pad_token_id=0, bos_token_id=1,
    eos_token_id=2, tie_word_embeddings=False,
)  # fmt: skip
_WINDOW = 8  # sliding windows and attention chunks: crossed by every sequence of EXACTNESS_LENGTHS but one
_LINEAR = dict(linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
               linear_num_value_heads=4)  # fmt: skip
_GDN_LAYERS = ["linear_attention", "full_attention", "linear_attention", "linear_attention"]
_MAMBA2 = dict(mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
               mamba_chunk_size=8)  # fmt: skip

_ALTERNATING = dict(sliding_window=_WINDOW,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"])
_QWEN_MOE = dict(**_LINEAR, layer_types=_GDN_LAYERS, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                 shared_expert_intermediate_size=32)  # fmt: skip
_GLM_MOE = dict(n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, moe_intermediate_size=32,
                first_k_dense_replace=1)  # fmt: skip

_GROUPS: dict[str, dict[str, dict[str, Any]]] = {
    "attention": {
        "llama": {}, "qwen3": {}, "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
        "gemma3_text": _ALTERNATING,
        "deepseek_v3": dict(
            **_GLM_MOE, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
            head_dim=8, num_key_value_heads=4),
        "glm4_moe": _GLM_MOE, "olmo3": _ALTERNATING, "smollm3": dict(no_rope_layer_interval=2), "ministral3": {},
        "minimax_m2": dict(num_local_experts=4, num_experts_per_tok=2), "phi3": {}, "cohere2": _ALTERNATING,
        "exaone4": _ALTERNATING, "seed_oss": {},
    },
    "linear attention / convolution": {
        "qwen3_5_text": dict(**_LINEAR, layer_types=_GDN_LAYERS), "qwen3_5_moe_text": _QWEN_MOE, "qwen3_next": _QWEN_MOE,
        "qwen4_exp_text": dict(
            **_QWEN_MOE, hc_lowrank=8, indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8,
            indexer_compress_ratio=4),
        "olmo_hybrid": dict(**_LINEAR, layer_types=_GDN_LAYERS),
        "lfm2": dict(layer_types=["conv", "full_attention", "conv", "conv"]),
        "lfm3": dict(sliding_window=_WINDOW, layer_types=["conv", "full_attention", "conv", "sliding_attention"]),
        "kimi_linear": dict(
            layer_types=_GDN_LAYERS, num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, head_dim=8,
            num_key_value_heads=4, linear_head_dim=16, linear_num_heads=4, linear_conv_kernel_dim=4),
    },
    "mamba-2 hybrid": {
        "granitemoehybrid": dict(
            **_MAMBA2, layer_types=["mamba", "attention", "mamba", "mamba"], num_local_experts=4,
            num_experts_per_tok=2, shared_intermediate_size=64),
        "nemotron_h": dict(
            layers_block_type=["mamba", "attention", "mamba", "moe"], ssm_state_size=16, mamba_num_heads=8,
            mamba_head_dim=16, n_groups=1, conv_kernel=4, chunk_size=8, n_routed_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=32, moe_shared_expert_intermediate_size=32),
        "falcon_h1": dict(**_MAMBA2, mamba_d_ssm=128), "bamba": dict(**_MAMBA2, attn_layer_indices=[1]),
        "zamba2": dict(
            layers_block_type=["mamba", "hybrid", "mamba", "mamba"], mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
            mamba_ngroups=1, n_mamba_heads=8, chunk_size=8, attention_head_dim=32, num_attention_heads=4,
            num_key_value_heads=4, use_mamba_kernels=False, adapter_rank=8),
    },
    "soft-capping / sinks": {  # attention features "padfree" refuses
        "gemma2": dict(sliding_window=_WINDOW),
        "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2, **_ALTERNATING),
        "deepseek_v4": dict(
            num_key_value_heads=1, head_dim=16, q_lora_rank=32, n_routed_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=32, sliding_window=_WINDOW, o_groups=2, o_lora_rank=16, index_n_heads=2,
            index_head_dim=16, index_topk=4, hc_mult=2,
            layer_types=["sliding_attention", "compressed_sparse_attention", "sliding_attention",
                         "heavily_compressed_attention"],
            mlp_layer_types=["moe"] * 4, compress_rates={"compressed_sparse_attention": 4,
                                                          "heavily_compressed_attention": 8}),
        "granite_swa": dict(sliding_window=_WINDOW),
    },
    "other": {  # position-dependent attention, state spaces, KV sharing
        "llama4_text": dict(
            num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2, intermediate_size_mlp=128,
            attention_chunk_size=_WINDOW, attn_temperature_tuning=True, floor_scale=4, no_rope_layer_interval=4),
        "jamba": dict(
            num_experts=4, num_experts_per_tok=2, attn_layer_period=4, attn_layer_offset=1, expert_layer_period=2,
            expert_layer_offset=1, mamba_d_state=16, mamba_dt_rank=8, use_mamba_kernels=False),
        "mamba2": dict(num_heads=8, head_dim=16, state_size=16, expand=2, n_groups=1, chunk_size=8, conv_kernel=4),
        "gemma4_text": dict(
            **_ALTERNATING, num_kv_shared_layers=2, hidden_size_per_layer_input=8, vocab_size_per_layer_input=128,
            global_head_dim=16),
    },
}  # fmt: skip

FAMILIES: dict[str, dict[str, Any]] = {t: fields for group in _GROUPS.values() for t, fields in group.items()}
"""``model_type`` -> the fields (beside the shared small sizes) of its tiny config: the 35 decoder families of
transformers 5.24 that this package measures."""

FAMILY_GROUPS: dict[str, tuple[str, ...]] = {name: tuple(group) for name, group in _GROUPS.items()}
"""The families of :data:`FAMILIES` by what sets them apart (the order of docs/probe-families.md)."""

OLDER_FAMILIES: dict[str, dict[str, Any]] = {
    "mistral": {}, "mixtral": dict(num_local_experts=4, num_experts_per_tok=2), "qwen2": {},
    "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=32),
    "gemma": {}, "phi": {}, "granite": {}, "olmo": {}, "olmo2": {}, "cohere": {}, "stablelm": {}, "starcoder2": {},
    "gpt2": {}, "gpt_bigcode": {}, "gpt_neox": {}, "gptj": dict(rotary_dim=8), "codegen": dict(rotary_dim=8),
    "falcon": dict(head_dim=None),  # a read-only property there
    "opt": {}, "bloom": {}, "mpt": {}, "biogpt": {}, "xglm": {}, "bart": {}, "mamba": {},
}  # fmt: skip
"""Older families (the first table of docs/probe-families.md): the shared small sizes are enough (``None``: a field
left out)."""

EXACTNESS_LENGTHS: tuple[int, ...] = (11, 5, 14, 9)
"""Lengths of :func:`packed_vs_alone`'s examples: all different, three cross an 8-token window or chunk."""


def family_available(model_type: str) -> bool:
    """Whether the installed transformers has ``model_type`` (transformers 5.23 lacks some of today's families)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return model_type in CONFIG_MAPPING


def tiny_family_config(model_type: str, **overrides: Any) -> Any:
    """The tiny config of ``model_type`` (:data:`FAMILIES`), ``overrides`` replacing fields; None when the installed
    transformers lacks the family. A model type not in :data:`FAMILIES` gets the shared small sizes only."""
    if not family_available(model_type):
        return None
    from transformers import AutoConfig

    fields = copy.deepcopy({**_BASE, **FAMILIES.get(model_type, OLDER_FAMILIES.get(model_type, {})), **overrides})
    return AutoConfig.for_model(model_type, **{k: v for k, v in fields.items() if v is not None})


def tiny_family_model(
    model_type: str, attn_implementation: str = "padfree", seed: int = 0, *, prepare: bool = False, **overrides: Any
) -> nn.Module | None:
    """A random float32 ``AutoModelForCausalLM`` of :func:`tiny_family_config` (None where the family is absent);
    with ``prepare``, made ready for training as this package's trainers make it, so that a measurement sees what
    training runs (:func:`trl_padfree.recurrent.prepare_packed_layers`: recurrent layers restart at every boundary
    of a packed row)."""
    config = tiny_family_config(model_type, **overrides)
    if config is None:
        return None
    from transformers import AutoModelForCausalLM

    from . import attention  # noqa: F401  (registers "padfree")

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=torch.float32)
    if prepare:
        from .recurrent import prepare_packed_layers

        prepare_packed_layers(model)
    return model


@dataclass(frozen=True)
class Exactness:
    """What :func:`packed_vs_alone` measured.

    Attributes:
        loss_diff: Largest ``|loss packed - loss alone|`` over the examples (each example's own loss, a token
            mean, read from the packed row's per-token losses).
        grad_diff: Largest relative gradient difference over every parameter:
            ``max|g_packed - g_alone| / max(max|g_alone|, 1% of the largest max|g_alone| of any parameter)``,
            where ``g`` is the gradient of the sum of the examples' losses.
        worst_param: The parameter with the largest relative gradient difference.
    """

    loss_diff: float
    grad_diff: float
    worst_param: str

    def exact(self, loss_tol: float = 1e-5, grad_tol: float = 1e-4) -> bool:
        """Within the tolerances (default: the project's, loss 1e-5 absolute, gradients 1e-4 relative)."""
        return self.loss_diff <= loss_tol and self.grad_diff <= grad_tol


def packed_vs_alone(
    model: nn.Module, lengths: Sequence[int] = EXACTNESS_LENGTHS, *, seed: int = 0,
    batch: Mapping[str, Any] | None = None,
) -> Exactness:
    """Loss and every gradient of examples packed in one row vs the same examples run one by one.

    The packed row is the collator's (:func:`trl_padfree.probe.packed_batch`: ``position_ids`` restarting at 0,
    ``cu_seq_lens_q/k``, ``max_length_q/k``, ``seq_idx``, no attention mask, ``use_cache=False``); each example
    alone is an ordinary one-row batch with an attention mask of ones. The model runs in train mode with dropout,
    layerdrop and router jitter at 0 (:func:`trl_padfree.probe.deterministic_train_mode`); the loss of each
    example is the mean over its tokens of the next-token loss, computed from the logits, so a model's own loss
    (aux losses, chunked heads) plays no part. The gradient compared is that of the sum of the examples' losses.
    A forward that raises propagates. ``batch`` replaces the packed batch (to test another layout).

    >>> from trl_padfree.testing import tiny_llama
    >>> m = packed_vs_alone(tiny_llama(vocab_size=128, attn_implementation="padfree"))
    >>> m.exact(), m.loss_diff < 1e-6
    (True, True)
    >>> packed_vs_alone(tiny_llama(vocab_size=128, attn_implementation="sdpa"), batch={}).exact()
    Traceback (most recent call last):
    ...
    ValueError: packed_vs_alone: the batch needs input_ids (1, T) and labels (1, T); got keys [].
    """
    from .probe import _on, alone_batch, deterministic_train_mode, model_sequences, packed_batch

    lengths = tuple(int(n) for n in lengths)
    if len(lengths) < 2 or min(lengths) < 2:
        raise ValueError(f"packed_vs_alone needs at least 2 examples of length >= 2; got lengths={list(lengths)}.")
    sequences = model_sequences(model, lengths, seed)
    packed = dict(packed_batch(sequences) if batch is None else batch)
    if "input_ids" not in packed or "labels" not in packed:
        raise ValueError(
            f"packed_vs_alone: the batch needs input_ids (1, T) and labels (1, T); got keys {sorted(packed)}."
        )
    device = next(model.parameters()).device
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]

    def run(inputs: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = _on(inputs, device)
        labels = inputs.pop("labels")
        out = model(**inputs)
        logits = out.logits if hasattr(out, "logits") else out[0]
        target = labels[0, 1:]  # per-position next-token losses (0 where the next label is -100), float32
        losses = nn.functional.cross_entropy(logits[0, :-1].float(), target.clamp_min(0), reduction="none")
        return losses * (target != -100), target != -100

    with deterministic_train_mode(model), torch.enable_grad():
        alone_losses, alone_grads = [], [torch.zeros_like(p, dtype=torch.float32) for _, p in params]
        for seq in sequences:
            losses, scored = run(alone_batch(seq))
            loss = losses.sum() / scored.sum()
            grads = torch.autograd.grad(loss, [p for _, p in params], allow_unused=True)
            for acc, g in zip(alone_grads, grads, strict=True):
                if g is not None:
                    acc += g.float()
            alone_losses.append(loss.detach())
        losses, scored = run(packed)
        ends = torch.tensor(lengths).cumsum(0).tolist()
        starts = [0, *ends[:-1]]
        # position t's loss predicts token t+1: an example's losses are positions start .. end-2 (its first label
        # is -100, so the position before it, the previous example's last, scores nothing).
        packed_losses = [losses[s : e - 1].sum() / scored[s : e - 1].sum() for s, e in zip(starts, ends, strict=True)]
        total = torch.stack(packed_losses).sum()
        grads = torch.autograd.grad(total, [p for _, p in params], allow_unused=True)
    loss_diff = max(abs(a.item() - b.item()) for a, b in zip(alone_losses, packed_losses, strict=True))
    # A gradient that cancels to (nearly) zero, like a key projection's bias under softmax, is rounding noise next
    # to its own size: each parameter's difference is relative to its largest gradient, but at least 1% of the
    # largest gradient of any parameter.
    floor = max([g.abs().max().item() for g in alone_grads if g.numel()] + [1e-8]) * 1e-2
    worst, worst_name = 0.0, ""
    for (name, _), g_alone, g in zip(params, alone_grads, grads, strict=True):
        g_packed = torch.zeros_like(g_alone) if g is None else g.float()
        diff = (g_packed - g_alone).abs().max().item() / max(g_alone.abs().max().item(), floor)
        if not math.isfinite(diff):
            diff = math.inf
        if diff > worst or not worst_name:
            worst, worst_name = diff, name
    return Exactness(loss_diff=loss_diff, grad_diff=worst, worst_param=worst_name)
