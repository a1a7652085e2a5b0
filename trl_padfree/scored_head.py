"""An LM head that projects only the scored positions, in bounded chunks, on every device (docs/head.md).

TRL 1.16's fused LM head projects only the labelled positions on CUDA/XPU with Triton, and every position of the
row elsewhere (a CPU). :func:`score_tokens` (plain tensors: hidden states ``[N, H]`` of the scored positions,
targets ``[N]``, the head's ``weight`` ``[V, H]``) returns each target's log-probability and on request TRL's
per-token metrics, with logits for ``chunk_tokens`` rows at a time, recomputed in the backward
(:class:`ScoredLogProbs`); :func:`score_row` does it for a packed row ``[B, T, H]`` and its shifted labels, in
TRL's ``FusedCausalLMOutput`` layout; :func:`add_scored_head` installs it through the model's own forward (so DDP,
PEFT and accelerate's unwrapping keep working) for TRL's ``model(..., fused_lm_head=True)`` call, and leaves to
TRL's head what it is not exact for (:func:`head_fallback_reason`). ``logits_to_keep`` would still build all the
scored positions' ``[N, V]`` logits at once. The statistics and the backward are those of TRL's kernel
(``trl/kernels/chunked_logprob.py``); ``tests/test_scored_head.py`` asserts loss, metrics and gradients equal to it.

    >>> import torch
    >>> torch.manual_seed(0) and None
    >>> hidden, weight = torch.randn(5, 8), torch.randn(11, 8)
    >>> targets = torch.tensor([1, 4, 0, 10, 3])
    >>> out = score_tokens(hidden, weight, targets, outputs=("log_probs", "entropy", "is_top1"), chunk_tokens=2)
    >>> full = torch.log_softmax(hidden @ weight.T, -1)
    >>> torch.allclose(out.log_probs, full.gather(1, targets[:, None]).squeeze(1))
    True
    >>> torch.allclose(out.entropy, -(full.exp() * full).sum(-1))
    True
"""

from __future__ import annotations

import functools
import math
import types
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "CHUNK_ELEMENTS", "OUTPUTS", "ScoredLogProbs", "ScoredTokens", "add_scored_head", "chunk_rows",
    "head_fallback_reason", "remove_scored_head", "score_row", "score_tokens", "scored_head_state",
]  # fmt: skip

IGNORE_INDEX = -100
OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
"""The per-token fields, named as TRL's ``FusedCausalLMOutput`` names them. ``log_probs`` is always computed."""

CHUNK_ELEMENTS = 1 << 24
"""Logits elements per chunk by default (64 MiB in fp32): ``chunk_rows(V)`` rows of a ``V``-word vocabulary."""

_ATTR = "_trl_padfree_scored_head"
_PREVIOUS = "_trl_padfree_trl_forward"


@dataclass
class ScoredTokens:
    """Per-token results of :func:`score_tokens` / :func:`score_row`; a field not requested is None.

    ``log_probs`` and ``entropy`` carry gradients; ``log_sum_sq_probs``, ``mean_logits`` and ``is_top1`` do not.
    """

    log_probs: torch.Tensor
    entropy: torch.Tensor | None = None
    log_sum_sq_probs: torch.Tensor | None = None
    mean_logits: torch.Tensor | None = None
    is_top1: torch.Tensor | None = None


def chunk_rows(vocab_size: int, chunk_elements: int = CHUNK_ELEMENTS) -> int:
    """Rows per chunk so that one chunk's logits hold at most ``chunk_elements`` values (at least one row).

    >>> chunk_rows(2048), chunk_rows(151_936), chunk_rows(10**9)
    (8192, 110, 1)
    """
    return max(1, chunk_elements // max(1, vocab_size))


def _checked_outputs(outputs: Any) -> tuple[str, ...]:
    if isinstance(outputs, str) or not all(isinstance(o, str) for o in outputs):
        raise TypeError(f"outputs must be a tuple of names among {OUTPUTS}, got {outputs!r}")
    unknown = [o for o in outputs if o not in OUTPUTS]
    if unknown:
        raise ValueError(f"unknown output(s) {unknown}: choose among {list(OUTPUTS)}")
    return tuple(outputs)


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype,
                  inv_t: float) -> torch.Tensor:
    """One chunk's logits ``[n, V]`` in fp32 (projected in ``dtype``), divided by the temperature."""
    h, w = hidden.to(dtype), weight.to(dtype)
    z = (torch.addmm(bias.to(dtype), h, w.t()) if bias is not None else h @ w.t()).float()
    return z * inv_t if inv_t != 1.0 else z


class ScoredLogProbs(torch.autograd.Function):
    """``log_softmax(hidden @ weight.T + bias)[targets]`` and TRL's per-token statistics, chunk by chunk.

    Forward: for each chunk of ``rows`` tokens, the logits ``[rows, V]`` are projected, folded into the statistics,
    and dropped. Saved for backward: the inputs, ``log Z`` and the entropy (``[N]`` each). Backward: each chunk's
    logits are projected again and turned into their gradient, ``g_lp (1[t] - p) - g_H p (log p + H)`` (times
    ``1/T``), which feeds the two gradient matmuls (accumulated in fp32). Use :func:`score_tokens`.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, inv_t, rows, flags):  # type: ignore[override]
        ctx.set_materialize_grads(False)
        want_entropy, want_sq, want_mean, want_top1 = flags
        n, vocab = hidden.shape[0], weight.shape[0]
        device = hidden.device
        dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else hidden.dtype
        f32 = dict(device=device, dtype=torch.float32)
        log_probs, log_z = torch.empty(n, **f32), torch.empty(n, **f32)
        entropy = torch.empty(n, **f32) if want_entropy else None
        sq = torch.empty(n, **f32) if want_sq else None
        mean = torch.empty(n, **f32) if want_mean else None
        top1 = torch.empty(n, device=device, dtype=torch.bool) if want_top1 else None
        for start in range(0, n, rows):
            end = min(start + rows, n)
            z = _chunk_logits(hidden[start:end], weight, bias, dtype, inv_t)
            t = targets[start:end]
            m = z.amax(-1)
            e = torch.exp(z - m[:, None])
            s = e.sum(-1)
            lz = m + torch.log(s)
            log_z[start:end] = lz
            log_probs[start:end] = z.gather(1, t[:, None]).squeeze(1) - lz
            if want_entropy:
                entropy[start:end] = lz - (e * z).sum(-1) / s
            if want_sq:
                sq[start:end] = torch.log((e * e).sum(-1)) - 2 * torch.log(s)
            if want_mean:
                mean[start:end] = z.sum(-1) / vocab
            if want_top1:
                top1[start:end] = z.argmax(-1) == t  # the first maximum: a tie with an earlier token is not top-1
        ctx.save_for_backward(hidden, weight, bias, targets, log_z, entropy if want_entropy else log_z)
        ctx.dtype, ctx.inv_t, ctx.rows = dtype, inv_t, rows
        ctx.mark_non_differentiable(*(x for x in (sq, mean, top1) if x is not None))
        return log_probs, entropy, sq, mean, top1

    @staticmethod
    def backward(ctx, grad_lp, grad_entropy, *_):  # type: ignore[override]
        hidden, weight, bias, targets, log_z, entropy = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        dtype, inv_t, rows = ctx.dtype, ctx.inv_t, ctx.rows
        n = hidden.shape[0]
        grad_h = torch.zeros(hidden.shape, device=hidden.device, dtype=torch.float32) if need_h else None
        grad_w = torch.zeros(weight.shape, device=weight.device, dtype=torch.float32) if need_w else None
        grad_b = torch.zeros(bias.shape, device=bias.device, dtype=torch.float32) if need_b else None
        if grad_lp is None and grad_entropy is None:
            n = 0
        for start in range(0, n, rows):
            end = min(start + rows, n)
            h = hidden[start:end].to(dtype)
            w = weight.to(dtype)
            z = _chunk_logits(h, w, bias, dtype, inv_t)
            log_p = z.sub_(log_z[start:end, None])
            p = torch.exp(log_p)
            if grad_entropy is not None:
                # d H / dz = -p (log p + H)
                g = -(p * (log_p + entropy[start:end, None])) * grad_entropy[start:end, None].float()
                if grad_lp is not None:
                    g -= p * grad_lp[start:end, None].float()
            else:
                g = p.mul_(-grad_lp[start:end, None].float())
            if grad_lp is not None:  # d log p_t / dz = 1[t] - p
                rows_idx = torch.arange(end - start, device=g.device)
                g[rows_idx, targets[start:end]] += grad_lp[start:end].float()
            if inv_t != 1.0:
                g.mul_(inv_t)
            g = g.to(dtype)
            if grad_h is not None:
                grad_h[start:end] = (g @ w).float()
            if grad_w is not None:
                grad_w.addmm_(g.t().float(), h.float())
            if grad_b is not None:
                grad_b += g.sum(0, dtype=torch.float32)
        return (
            grad_h.to(hidden.dtype) if grad_h is not None else None,
            grad_w.to(weight.dtype) if grad_w is not None else None,
            grad_b.to(bias.dtype) if grad_b is not None else None,
            None, None, None, None,
        )


def score_tokens(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, bias: torch.Tensor | None = None, *,
    temperature: float = 1.0, outputs: tuple[str, ...] = ("log_probs",), chunk_tokens: int | None = None,
) -> ScoredTokens:
    """Log-probability of each target under ``softmax((hidden @ weight.T + bias) / temperature)``, in chunks.

    Args:
        hidden: ``[N, H]``, the final hidden states of the scored positions only (gather them first:
            :func:`score_row` does).
        weight: ``[V, H]``, the LM head's weight (``model.get_output_embeddings().weight``); ``bias``: ``[V]`` or None.
        targets: ``[N]`` integer token ids in ``[0, V)``: the label each position predicts.
        temperature: the logits are divided by it (TRL's GRPO/RLOO ``temperature``); 1.0 for SFT and DPO.
        outputs: fields of :class:`ScoredTokens` to compute among :data:`OUTPUTS` (``log_probs`` always is).
        chunk_tokens: rows projected at once (default :func:`chunk_rows` of ``V``: 64 MiB of fp32 logits).

    Returns:
        :class:`ScoredTokens` of ``[N]`` float32 tensors (``is_top1`` bool). Under autocast the projection runs in
        the autocast dtype and the statistics in fp32, as in TRL's kernel.

    >>> import torch
    >>> out = score_tokens(torch.zeros(3, 4), torch.zeros(8, 4), torch.tensor([0, 7, 2]), outputs=("mean_logits",))
    >>> [round(x, 4) for x in out.log_probs.tolist()], out.entropy
    ([-2.0794, -2.0794, -2.0794], None)
    >>> score_tokens(torch.zeros(2, 4), torch.zeros(8, 4), torch.tensor([0, 8]))
    Traceback (most recent call last):
    ValueError: targets must be token ids in [0, 8) (the vocabulary of the head), got ids from 0 to 8; gather only the positions whose label is not -100
    """
    outputs = _checked_outputs(outputs)
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden must be [N, H] and weight [V, H] with the same H, got {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)}")
    if targets.shape != (hidden.shape[0],) or targets.dtype.is_floating_point or targets.dtype == torch.bool:
        raise ValueError(f"targets must be [N] integer ids, one per row of hidden ({hidden.shape[0]}), got "
                         f"{tuple(targets.shape)} {targets.dtype}")
    vocab = weight.shape[0]
    if bias is not None and bias.shape != (vocab,):
        raise ValueError(f"bias must be [V] = [{vocab}], got {tuple(bias.shape)}")
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= vocab):
        raise ValueError(f"targets must be token ids in [0, {vocab}) (the vocabulary of the head), got ids from "
                         f"{int(targets.min())} to {int(targets.max())}; gather only the positions whose label is "
                         f"not {IGNORE_INDEX}")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a positive number, got {temperature!r}")
    if chunk_tokens is not None and (isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int)
                                     or chunk_tokens < 1):
        raise ValueError(f"chunk_tokens must be a positive integer (rows projected at once) or None, got "
                         f"{chunk_tokens!r}")
    rows = chunk_tokens or chunk_rows(vocab)
    flags = tuple(name in outputs for name in OUTPUTS[1:])
    fields = ScoredLogProbs.apply(hidden, weight, bias, targets.long(), 1.0 / float(temperature), rows, flags)
    return ScoredTokens(*fields)


def score_row(
    hidden_states: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
    temperature: float = 1.0, outputs: tuple[str, ...] = ("log_probs",), chunk_tokens: int | None = None,
) -> tuple[ScoredTokens, torch.Tensor]:
    """:func:`score_tokens` on the positions of ``hidden_states`` whose label is not ``-100``, put back in place.

    ``hidden_states`` ``[B, T, H]`` and ``labels`` ``[B, T]`` are aligned: ``labels[b, i]`` is the token position
    ``i`` predicts (already shifted, as ``shift_labels``). Returns the fields as ``[B, T]`` tensors, zero (False) at
    ignored positions, and the mask of scored positions; a row with nothing scored still returns a tensor connected
    to ``hidden_states`` (a differentiable zero), as TRL's head does.

    >>> import torch
    >>> h, w = torch.randn(1, 4, 3), torch.randn(6, 3)
    >>> out, mask = score_row(h, torch.tensor([[-100, 2, -100, 5]]), w)
    >>> mask.tolist(), out.log_probs[0, 0].item(), out.log_probs[0, 1].item() < 0
    ([[False, True, False, True]], 0.0, True)
    """
    if hidden_states.shape[:-1] != labels.shape:
        raise ValueError(f"labels {tuple(labels.shape)} must match hidden_states {tuple(hidden_states.shape)} "
                         "without its last dimension (pass the labels already shifted)")
    mask = labels != IGNORE_INDEX
    scored = score_tokens(hidden_states[mask], weight, labels[mask], bias, temperature=temperature,
                          outputs=outputs, chunk_tokens=chunk_tokens)

    def place(x: torch.Tensor | None) -> torch.Tensor | None:
        # masked_scatter keeps an all-ignored row connected to the model (a zero gradient instead of an error)
        return None if x is None else x.new_zeros(mask.shape).masked_scatter(mask, x)

    return ScoredTokens(*(place(getattr(scored, name)) for name in OUTPUTS)), mask


# ---- the model integration -------------------------------------------------------------------------------------
_SCALE_ATTRS = ("logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")


def head_fallback_reason(model: Any) -> str | None:
    """Why :func:`add_scored_head` leaves ``model``'s scoring to TRL's fused head, or None when it is exact.

    This head computes ``log_softmax(W h + b)``: a model whose logits go through more than a plain
    ``torch.nn.Linear`` before the loss (logit softcapping as gemma2, a logit scale or multiplier as cohere, granite,
    falcon-h1) is scored by TRL's head, which applies them.

    >>> from trl_padfree.testing import tiny_llama
    >>> head_fallback_reason(tiny_llama(vocab_size=32)) is None
    True
    """
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    softcap = getattr(config, "final_logit_softcapping", None)
    if softcap is not None:
        return f"final_logit_softcapping={softcap} ({config.model_type}): logits softcapped before the loss"
    for attr in _SCALE_ATTRS:
        value = getattr(config, attr, None)
        if value is not None and value != 1:
            return f"{attr}={value} ({config.model_type}): logits scaled before the loss"
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear):
        return f"the output embeddings are {type(head).__name__}, not a torch.nn.Linear"
    return None


def scored_head_state(model: Any) -> str | None:
    """``"scored"`` where :func:`add_scored_head` scores ``model``'s calls, ``"trl: <why>"`` where TRL's head does,
    None where it was never added."""
    return getattr(model, _ATTR, None)


def backbone(model: Any) -> Any:
    """The module under ``model``'s LM head that returns ``last_hidden_state``: ``model.base_model`` (what TRL's
    fused head calls), or ``model.model`` where ``base_model`` is the model itself because its
    ``base_model_prefix`` names no attribute (``Llama4ForCausalLM``: prefix ``"language_model"``, decoder in
    ``.model``, transformers/models/llama4/modeling_llama4.py; TRL 1.16's fused head then fails on the CausalLM
    output: trl/trainer/utils.py, ``add_fused_lm_head``).

    >>> from trl_padfree.testing import tiny_llama
    >>> model = tiny_llama()
    >>> backbone(model) is model.model
    True
    """
    base = model.base_model
    if base is model:
        inner = getattr(model, "model", None)
        if isinstance(inner, torch.nn.Module):
            return inner
    return base


def add_scored_head(
    model: Any, *, temperature: float = 1.0, outputs: tuple[str, ...] = ("log_probs",),
    cast_lm_head_to_fp32: bool = False, chunk_tokens: int | None = None, use_trl_on_triton: bool = True,
) -> str | None:
    """Make ``model(..., labels|shift_labels, fused_lm_head=True)`` (TRL's call, returning TRL's
    ``FusedCausalLMOutput``) score only the labelled positions with this head; None, or why TRL's head scores.

    ``model.forward`` is replaced on the instance (a call through DDP, PEFT or accelerate's wrappers reaches it);
    the backbone (:func:`backbone`) is called inside it. Add it to the model TRL gives its fused head to
    (``model.get_base_model()`` under PEFT); TRL's fused head, added first when missing, takes the calls this head
    is not exact for (:func:`head_fallback_reason`; per call: ``output_router_logits``, an FSDP2-sharded head,
    DeepSpeed ZeRO-3). Arguments as TRL's ``add_fused_lm_head``, plus ``chunk_tokens`` (:func:`score_tokens`) and
    ``use_trl_on_triton``: on CUDA/XPU with Triton TRL's head already projects only the labelled positions, so by
    default those calls go to it (not measured against this head on a GPU); False: this head on every device.
    """
    from torch.distributed.tensor import DTensor
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
    from transformers.utils import is_triton_available
    from trl.trainer.utils import FusedCausalLMOutput, add_fused_lm_head

    outputs = _checked_outputs(outputs)
    remove_scored_head(model)  # added before: replaced, over the same TRL head
    if _forward_name(model) != "_fused_forward":
        add_fused_lm_head(model, temperature=temperature, cast_lm_head_to_fp32=cast_lm_head_to_fp32, outputs=outputs)
    previous = model.forward  # TRL's fused forward (it calls the model's own without fused_lm_head)
    reason = head_fallback_reason(model)
    setattr(model, _ATTR, "scored" if reason is None else f"trl: {reason}")
    if reason is not None:
        return reason
    text_config = model.config.get_text_config()

    @functools.wraps(type(model).forward)
    def _scored_forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None,
                        **kwargs):
        lm_head = self.get_output_embeddings()
        router = kwargs.get("output_router_logits") or getattr(text_config, "output_router_logits", False)
        # where TRL's fused head scores only the labelled positions: CUDA/XPU with Triton (`_use_triton` in TRL)
        trl_compacts = use_trl_on_triton and lm_head.weight.device.type in ("cuda", "xpu") and is_triton_available()
        sharded = isinstance(lm_head.weight, DTensor) or is_deepspeed_zero3_enabled()  # TRL gathers the head
        if not fused_lm_head or router or trl_compacts or sharded:
            return previous(*args, fused_lm_head=fused_lm_head, labels=labels, shift_labels=shift_labels,
                            num_items_in_batch=num_items_in_batch, **kwargs)
        kwargs["use_cache"] = False
        hidden = backbone(self)(*args, **kwargs).last_hidden_state
        if shift_labels is None:
            hidden, targets = hidden[:, :-1], labels[:, 1:]
        else:
            targets = shift_labels
        weight, bias = lm_head.weight, lm_head.bias
        hidden, targets = hidden.to(weight.device), targets.to(weight.device)
        autocast = nullcontext()
        if cast_lm_head_to_fp32:
            hidden = hidden.float()
            autocast = torch.autocast(hidden.device.type, enabled=False)
        with autocast:
            scored, mask = score_row(hidden, targets, weight, bias, temperature=temperature, outputs=outputs,
                                     chunk_tokens=chunk_tokens)
        count = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        loss = -scored.log_probs.sum() / count
        return FusedCausalLMOutput(loss=loss, log_probs=scored.log_probs, entropy=scored.entropy,
                                   log_sum_sq_probs=scored.log_sum_sq_probs, mean_logits=scored.mean_logits,
                                   is_top1=scored.is_top1, label_mask=mask)

    model.forward = types.MethodType(_scored_forward, model)
    setattr(model, _PREVIOUS, previous)
    return None


def remove_scored_head(model: Any) -> bool:
    """Give ``model`` back the forward it had before :func:`add_scored_head` (TRL's fused one); whether it had it.

    >>> from trl_padfree.testing import tiny_llama
    >>> remove_scored_head(tiny_llama(vocab_size=32))
    False
    """
    if _forward_name(model) != "_scored_forward":
        return False
    model.forward = getattr(model, _PREVIOUS)
    setattr(model, _ATTR, None)
    return True


def _forward_name(model: Any) -> str | None:
    """The code name of the function bound as ``model.forward`` (``_fused_forward``: TRL's fused head)."""
    func = getattr(model.forward, "__func__", None)
    return getattr(getattr(func, "__code__", None), "co_name", None)
