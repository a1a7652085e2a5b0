"""``DPOTrainer``: TRL's ``DPOTrainer`` where ``DPOConfig(padding_free=True)`` works again (TRL 1.16 pads).

TRL's datasets, tokenization, reference handling, loss types and metrics are kept; the batch is one row
(:class:`~trl_padfree.preference.DataCollatorForPreference`, with ``prompt_once`` each pair's prompt computed once),
policy and reference score it through the fused-LM-head call, and the losses are TRL's restated on segment sums
(:mod:`trl_padfree.dpo_loss`). See docs/dpo.md. With ``padding_free=False`` the trainer is TRL's, unchanged.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch
import trl
from accelerate.utils import is_peft_model

from ._compat import quiet_gradient_checkpointing_warning
from .dpo_loss import F_DIVERGENCE_TYPES, LOSS_TYPES, PairStats, f_divergence_scores, pair_loss
from .preference import MODEL_KEYS, DataCollatorForPreference, segment_sum
from .trainer import PadfreeTrainerMixin, tokenizer_of

__all__ = ["DPOTrainer", "check_dpo_arguments"]

def check_dpo_arguments(model: Any, ref_model: Any, args: Any, processing_class: Any, peft_config: Any = None) -> None:
    """Refuse, naming the fix, what TRL's ``DPOTrainer`` would fail on later with an unrelated message.

    - ``ref_model`` that is not a model (e.g. a path: TRL fails with "'str' object has no attribute 'modules'");
    - a model built from a config (no name or path) with no ``processing_class`` (TRL tries to load a tokenizer
      named ``''``), or with no ``ref_model`` where TRL would load the reference from that name;
    - an ``f_divergence_type`` TRL does not know (TRL accepts it and fails at the first step).

    >>> check_dpo_arguments(None, "ref/path", None, object())
    Traceback (most recent call last):
    ...
    TypeError: ref_model must be a model (a transformers PreTrainedModel) or None, got the string 'ref/path', a path ...
    """
    if isinstance(ref_model, (str, os.PathLike)):
        missing = "" if os.path.exists(ref_model) else ", a path that does not exist"
        raise TypeError(
            f"ref_model must be a model (a transformers PreTrainedModel) or None, got the string {str(ref_model)!r}"
            f"{missing}: load it first, ref_model=AutoModelForCausalLM.from_pretrained(path), or pass "
            "ref_model=None to use a copy of the starting weights"
        )
    if ref_model is not None and not isinstance(ref_model, torch.nn.Module):
        raise TypeError(f"ref_model must be a model (a transformers PreTrainedModel) or None, got "
                        f"{type(ref_model).__name__}")
    if model is not None and not isinstance(model, (str, os.PathLike)):
        name = getattr(getattr(model, "config", None), "_name_or_path", None)
        if not name:
            if processing_class is None:
                raise ValueError(
                    "DPOTrainer needs processing_class=tokenizer for this model: it was built from a config, so it "
                    "has no name or path to load a tokenizer from; pass the tokenizer, e.g. "
                    "processing_class=AutoTokenizer.from_pretrained(...)"
                )
            reference_needed = not (is_peft_model(model) or peft_config is not None
                                    or (args is not None and getattr(args, "precompute_ref_log_probs", False)))
            if ref_model is None and reference_needed:
                raise ValueError(
                    "DPOTrainer needs ref_model= for this model: it was built from a config, so it has no name or "
                    "path to load the reference from; pass ref_model=copy.deepcopy(model) (before training), or "
                    "save the model and pass its directory as model"
                )
    divergence = getattr(args, "f_divergence_type", "reverse_kl") if args is not None else "reverse_kl"
    if divergence not in F_DIVERGENCE_TYPES:
        raise ValueError(f"f_divergence_type={divergence!r} is not one TRL knows; use one of "
                         f"{', '.join(F_DIVERGENCE_TYPES)} (reverse_kl is standard DPO)")


def flat_forward(model: Any, inputs: dict[str, Any], prefix: str = "", **extra: Any) -> Any:
    """TRL's fused-LM-head model call on a flat row of ``inputs`` (``prefix``: which row, e.g. KTO's ``"KL_"``)."""
    kwargs = {k: inputs[prefix + k] for k in MODEL_KEYS if prefix + k in inputs}
    return model(**kwargs, **extra, shift_labels=inputs[prefix + "shift_labels"], use_cache=False, fused_lm_head=True)


def log_entropy_and_tokens(trainer: Any, mode: str, outputs: Any, index: torch.Tensor, n: int, scored: torch.Tensor,
                           num_tokens: int) -> None:
    """TRL 1.16's ``entropy`` and ``num_tokens`` metrics of a flat row, from segment sums (gathered across ranks)."""
    gather = trainer.accelerator.gather_for_metrics
    entropy = gather(segment_sum(outputs.entropy.detach(), index, n).sum()).sum()
    tokens = gather(scored.sum()).sum()
    trainer._metrics[mode]["entropy"].append((entropy / tokens).item() if tokens > 0 else 0.0)
    if mode == "train":
        num = gather(torch.tensor(int(num_tokens), device=scored.device)).sum().item()
        trainer._total_train_tokens += num // trainer._tp_size
    trainer._metrics[mode]["num_tokens"] = [trainer._total_train_tokens]


@contextlib.contextmanager
def reference_forward(trainer: Any, model: Any = None) -> Iterator[Any]:
    """The reference of ``trainer`` (DPO, KTO) for a forward without gradients: ``model`` if given, else its
    ``ref_model``, else the PEFT policy with its adapters off (or the ``"ref"`` adapter on), as TRL picks it;
    gradient checkpointing off during the forward, as in TRL."""
    from trl.models.utils import disable_gradient_checkpointing
    from trl.trainer.utils import use_adapter

    adapter: Any = contextlib.nullcontext()
    if model is None:
        model = trainer.ref_model
        if model is None and is_peft_model(trainer.model):
            model = trainer.model
    if model is trainer.model and is_peft_model(trainer.model) and trainer.ref_model is None:
        unwrapped = trainer.accelerator.unwrap_model(trainer.model)
        adapter = use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None)
    with torch.no_grad(), quiet_gradient_checkpointing_warning(), adapter:
        with disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs):
            yield model


class DPOTrainer(PadfreeTrainerMixin, trl.DPOTrainer):
    """``trl.DPOTrainer`` with a working ``padding_free``; the settings are :class:`trl_padfree.DPOConfig` fields
    (the trainer keywords still work for one release, with a ``DeprecationWarning``). ``self.lm_head_state`` /
    ``self.ref_lm_head_state``: ``"scored"`` or ``"trl: <why>"``."""

    def __init__(self, model: Any, ref_model: Any = None, args: Any = None, data_collator: Any = None,
                 train_dataset: Any = None, eval_dataset: Any = None, processing_class: Any = None,
                 *rest: Any, **kwargs: Any) -> None:
        settings = self._padfree_settings("DPOTrainer", args, kwargs)
        check_dpo_arguments(model, ref_model, args, processing_class, kwargs.get("peft_config"))
        if self.padfree:
            unknown = [t for t in (args.loss_type if isinstance(args.loss_type, list) else [args.loss_type])
                       if t not in LOSS_TYPES]
            if unknown:
                raise ValueError(f"padding-free DPO does not know loss type(s) {unknown}; known: {list(LOSS_TYPES)}")
            if data_collator is None:
                tok = tokenizer_of(processing_class, model)
                pad = getattr(args, "pad_token", None) or tok.pad_token or tok.eos_token
                data_collator = DataCollatorForPreference(
                    pad_token_id=tok.convert_tokens_to_ids(pad), max_length=args.max_length,
                    truncation_mode=args.truncation_mode,
                    # ("auto" is TRL's Neuron-only setting: 128 there, nothing elsewhere)
                    pad_to_multiple_of=args.pad_to_multiple_of if isinstance(args.pad_to_multiple_of, int) else None,
                    prompt_once=self.prompt_once)
            args.padding_free = False  # TRL would log that it is unavailable and pad; the flat batch is ours
        try:
            super().__init__(model, ref_model, args, data_collator, train_dataset, eval_dataset, processing_class,
                             *rest, **kwargs)
        finally:
            if self.padfree:
                args.padding_free = True
        if self.padfree:  # the outputs TRL's own fused head computes here (DPOTrainer.__init__)
            self._padfree_setup("preference", settings["check_packing"], ("log_probs", "entropy", "mean_logits",
                                "is_top1") + (("log_sum_sq_probs",) if self.use_weighting else ()))

    # ---- forward ----------------------------------------------------------------------------------------------
    def _sequence_logps(self, per_token: torch.Tensor, inputs: dict[str, Any],
                        scored: torch.Tensor | None = None) -> torch.Tensor:
        """``(2B,)`` log-probability sums (TRL's ``ld_alpha`` weighting of the tails when it is set); ``scored``:
        the scored tokens per sequence, when the caller has counted them already."""
        n = 2 * int(inputs["num_pairs"])
        index = inputs["score_index"]
        if self.ld_alpha is None:
            return segment_sum(per_token, index, n)
        if scored is None:
            scored = segment_sum(torch.ones_like(per_token), index, n)
        chosen, rejected = scored.chunk(2)
        shared = torch.minimum(chosen, rejected).repeat(2)
        rank = inputs["score_rank"].to(per_token.dtype)
        tail = rank > shared[index.clamp(min=0)]
        weights = torch.where(tail, torch.as_tensor(self.ld_alpha, dtype=per_token.dtype), 1.0)
        return segment_sum(per_token * weights, index, n)

    def _reference_logps(self, inputs: dict[str, Any], model: Any = None) -> torch.Tensor:
        with reference_forward(self, model) as ref:
            out = flat_forward(ref, inputs)
        return self._sequence_logps(out.log_probs, inputs)

    def compute_ref_log_probs(self, model: Any, inputs: dict[str, Any]) -> Any:
        if "shift_labels" not in inputs:
            return super().compute_ref_log_probs(model, inputs)
        with self.accelerator.autocast():
            return self._reference_logps(inputs, model).chunk(2, dim=0)

    # ---- loss ----------------------------------------------------------------------------------------------
    def _compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool) -> Any:
        if "shift_labels" not in inputs:
            return super()._compute_loss(model, inputs, return_outputs)
        mode = "train" if self.model.training else "eval"
        extra = {"output_router_logits": True} if self.aux_loss_enabled else {}
        outputs = flat_forward(model, inputs, **extra)
        pairs, index = int(inputs["num_pairs"]), inputs["score_index"]
        n = 2 * pairs
        per_token = outputs.log_probs
        scored = segment_sum(torch.ones_like(per_token), index, n)  # scored tokens per sequence (counted once)
        logps = self._sequence_logps(per_token, inputs, scored)
        chosen_logps, rejected_logps = logps.chunk(2)
        if self.precompute_ref_logps:
            ref_chosen, ref_rejected = inputs["ref_chosen_logps"], inputs["ref_rejected_logps"]
        else:
            ref_chosen, ref_rejected = self._reference_logps(inputs).chunk(2)
        lens = inputs["completion_lens"].to(per_token.device)
        stats = PairStats(chosen_logps, rejected_logps, ref_chosen, ref_rejected, *lens.chunk(2))
        stats.chosen_scores, stats.rejected_scores = f_divergence_scores(
            stats.chosen_logratios, stats.rejected_logratios, self.f_divergence_type, self.f_alpha_divergence_coef
        )
        if "sft" in self.loss_types:
            chosen_sum = segment_sum(per_token, index, n)[:pairs].sum()
            stats.sft_loss = -chosen_sum / scored[:pairs].sum()
        weights = None
        if self.use_weighting:
            with torch.no_grad():
                aligned = segment_sum(per_token - outputs.log_sum_sq_probs, index, n) / scored.clamp_min(1)
                w = torch.exp(aligned)
                weights = w[:pairs] * w[pairs:]
        loss = 0.0
        for loss_type, loss_weight in zip(self.loss_types, self.loss_weights, strict=True):
            per_pair = pair_loss(loss_type, stats, beta=self.beta, label_smoothing=self.label_smoothing,
                                 discopop_tau=self.args.discopop_tau)
            if weights is not None:
                per_pair = per_pair * weights
            loss = loss + per_pair.mean() * loss_weight
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * outputs.aux_loss
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(outputs.aux_loss).mean().item())
        self._log_metrics(mode, inputs, outputs, stats, scored)
        if return_outputs:
            return loss, outputs
        return loss

    def _log_metrics(self, mode: str, inputs: dict[str, Any], outputs: Any, stats: PairStats,
                     scored: torch.Tensor) -> None:
        """TRL 1.16's metrics, from segment sums (same names, same gathering across ranks)."""
        gather = self.accelerator.gather_for_metrics
        pairs, index = int(inputs["num_pairs"]), inputs["score_index"]
        n = 2 * pairs
        log_entropy_and_tokens(self, mode, outputs, index, n, scored, inputs["num_tokens"])
        logits = segment_sum(outputs.mean_logits.detach(), index, n)
        for name, part, count in (("chosen", logits[:pairs], scored[:pairs]),
                                  ("rejected", logits[pairs:], scored[pairs:])):
            total, count_all = gather(part.sum()).sum().item(), gather(count.sum()).sum().item()
            self._metrics[mode][f"logits/{name}"].append(total / count_all if count_all > 0 else 0.0)
        top1 = segment_sum(outputs.is_top1.detach().to(scored.dtype), index, n)[:pairs].sum()
        correct, total = gather(top1).sum(), gather(scored[:pairs].sum()).sum()
        self._metrics[mode]["mean_token_accuracy"].append((correct / total).item() if total > 0 else 0.0)
        chosen, rejected = self.beta * stats.chosen_logratios.detach(), self.beta * stats.rejected_logratios.detach()
        for name, value in (("rewards/chosen", chosen), ("rewards/rejected", rejected),
                            ("rewards/accuracies", (chosen > rejected).float()), ("rewards/margins", chosen - rejected),
                            ("logps/chosen", stats.chosen_logps.detach()),
                            ("logps/rejected", stats.rejected_logps.detach())):
            self._metrics[mode][name].append(self.accelerator.gather(value).mean().item())
