"""What :class:`trl_padfree.GRPOTrainer` and :class:`trl_padfree.RLOOTrainer` add to TRL's: packed log-probs.

TRL's RL trainers compute every per-token log-prob (policy with grad, old policy, reference) in one method,
``_get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, batch_size, ...)``, on chunks
of ``batch_size`` padded rows. With ``padding_free`` the override here lays each chunk out as one flat row
(:func:`~trl_padfree.rl_packing.pack_completion_rows`; with ``prompt_once`` rows of the same prompt share it), runs
the model once on it (:meth:`PaddingFreeRLMixin.packed_scores`, the one place the head is called) and puts the per-token log-probs and entropies back into the ``[N, logits_to_keep]`` tensors TRL's loss code
reads (:func:`~trl_padfree.rl_packing.scatter_scores`; 0 at padded positions, as TRL's head returns there).
The head is the scored-positions LM head (:mod:`trl_padfree.scored_head`, on by default: ``scored_lm_head``):
policy (its old-policy pass too) and reference project only the completion positions of the row, with TRL's
``temperature`` and outputs (policy: log-probs and entropies; reference: log-probs), in bounded chunks; TRL's fused
head where that head is not exact for the model (``lm_head_state`` / ``ref_lm_head_state`` say which).
Generation, rewards, advantages, the losses and the metrics stay TRL's. Micro-batches are TRL's, so ``bnpo``'s
per-micro-batch normalisation is unchanged; ``prompt_once`` shares only what a chunk holds.

``padding_free`` and the other settings are fields of :class:`trl_padfree.GRPOConfig` /
:class:`trl_padfree.RLOOConfig` (TRL's have no ``padding_free``); with another config, its ``padding_free``
attribute is read, if any. The trainer keywords (``padding_free``, ``prompt_once``, ...) still work for one release
(a ``DeprecationWarning`` naming the config field).
"""

from __future__ import annotations

import inspect
from collections import Counter
from typing import Any

import torch

from .configs import UNSET, is_padfree_config, trainer_settings
from .preference import MODEL_KEYS
from .rl_packing import PackStats, pack_completion_rows, scatter_scores
from .trainer import (
    LayoutProbeCallback,
    PadfreeTrainerMixin,
    checked_switch,
    checked_threads,
    install_scored_head,
)

__all__ = ["PaddingFreeRLMixin", "RLPackingCheckCallback", "resolve_padding_free"]

#: Keyword arguments of TRL's log-prob method that carry images / processor outputs (not covered: TRL pads those).
MULTIMODAL_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                   "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")


def resolve_padding_free(padding_free: bool | None, args: Any) -> bool:
    """The ``padding_free`` setting: the trainer argument, else the config's ``padding_free`` attribute, else False.

    >>> from types import SimpleNamespace
    >>> resolve_padding_free(None, SimpleNamespace(padding_free=True)), resolve_padding_free(True, None)
    (True, True)
    >>> resolve_padding_free(False, SimpleNamespace(padding_free=True))
    Traceback (most recent call last):
    ...
    ValueError: padding_free=False contradicts the config's padding_free=True; set one of them (or both alike)
    """
    from_config = getattr(args, "padding_free", None) if args is not None else None
    if padding_free is not None and not isinstance(padding_free, bool):
        raise TypeError(f"padding_free must be True, False or None, got {padding_free!r}")
    if padding_free is not None and from_config is not None and bool(from_config) != padding_free:
        raise ValueError(f"padding_free={padding_free} contradicts the config's padding_free={bool(from_config)}; "
                         "set one of them (or both alike)")
    return bool(padding_free if padding_free is not None else from_config)


class RLPackingCheckCallback(LayoutProbeCallback):
    """Runs the GRPO/RLOO packing probe once, when training begins; raises ``PackingLeakError`` if rows leak."""

    what = "RL"

    def probe(self) -> Any:
        from .rl_probe import assert_group_packing_safe

        return assert_group_packing_safe


class PaddingFreeRLMixin(PadfreeTrainerMixin):
    """The packed ``_get_per_token_logps_and_entropies`` of TRL's GRPO/RLOO trainers (see the module docstring).

    ``pack_totals`` counts, over every packed forward of this trainer, rows and tokens (padded, real, forwarded,
    shared: :class:`~trl_padfree.rl_packing.PackStats` fields) by kind (``"train"`` with grad, ``"no_grad"``).
    """

    padfree: bool = False
    prompt_once: bool = False
    #: whether TRL passes ``args.cast_lm_head_to_fp32`` to its fused head (GRPO does, RLOO has no such option)
    casts_lm_head_to_fp32: bool = False

    def _padfree_init(self, trl_class: type, args: tuple, kwargs: dict, *, padding_free: Any, prompt_once: Any,
                      check_packing: Any, torch_num_threads: Any, scored_lm_head: Any = UNSET) -> None:
        bound = inspect.signature(trl_class.__init__).bind_partial(None, *args, **kwargs).arguments
        config = bound.get("args")
        settings = trainer_settings(
            trl_class.__name__, config, padding_free=UNSET if padding_free is None else padding_free,
            prompt_once=prompt_once, check_packing=check_packing, torch_num_threads=torch_num_threads,
            scored_lm_head=scored_lm_head)
        check_packing = settings["check_packing"]
        self.torch_num_threads = checked_threads(settings["torch_num_threads"])
        self.scored_lm_head = checked_switch("scored_lm_head", settings["scored_lm_head"])
        # a package config: its field (or the keyword); another config: its padding_free attribute, as before
        self.padfree = (settings["padding_free"] if is_padfree_config(config)
                        else resolve_padding_free(padding_free, config))
        self.prompt_once = bool(settings["prompt_once"])
        if self.prompt_once and not self.padfree:
            raise ValueError("prompt_once=True needs padding_free=True (set both in trl_padfree.GRPOConfig / "
                             "RLOOConfig).")
        if self.padfree:
            from ._compat import rl_padding_free_unavailable

            if (problem := rl_padding_free_unavailable()) is not None:
                raise ValueError(problem)
        self.pack_totals: dict[str, Counter] = {"train": Counter(), "no_grad": Counter()}
        trl_class.__init__(self, *args, **kwargs)
        if not self.padfree:
            self.lm_head_state = self.ref_lm_head_state = "trl: padding_free=False"
            return
        self._install_scored_heads()
        from .dpo import refuse_shared_prompt_aux_loss, require_padfree_attention

        models = [m for m in (self.model, getattr(self, "ref_model", None)) if m is not None]
        if self.prompt_once:
            refuse_shared_prompt_aux_loss(self, "prompt_once=True (siblings must not see each other)")
            for m in models:
                require_padfree_attention(self.accelerator.unwrap_model(m),
                                          "prompt_once=True (siblings must not see each other)")
        if check_packing:
            ref = getattr(self, "ref_model", None)
            self.add_callback(RLPackingCheckCallback(
                self.prompt_once, [self.accelerator.unwrap_model(ref)] if ref is not None else []))

    def _install_scored_heads(self) -> None:
        """The scored-positions head on the policy and the reference, over the fused heads TRL added in its
        ``__init__``, with the same temperature and outputs (``lm_head_state`` / ``ref_lm_head_state``)."""
        temperature = float(self.temperature)
        cast = bool(getattr(self.args, "cast_lm_head_to_fp32", False)) if self.casts_lm_head_to_fp32 else False
        main = self.is_world_process_zero()
        self.lm_head_state = install_scored_head(self.model, ("log_probs", "entropy"), self.scored_lm_head, main,
                                                 temperature=temperature, cast_lm_head_to_fp32=cast)
        self.ref_lm_head_state = None
        if getattr(self, "ref_model", None) is not None:
            self.ref_lm_head_state = install_scored_head(
                self.accelerator.unwrap_model(self.ref_model), ("log_probs",), self.scored_lm_head, main,
                temperature=temperature, cast_lm_head_to_fp32=cast)

    def packed_scores(self, model: Any, packed: dict[str, Any], compute_aux_loss: bool = False) -> Any:
        """The model on one packed row with the fused-head call: ``log_probs`` / ``entropy`` ``(1, T)`` per position.

        The one place the LM head is called: ``model(..., shift_labels=..., fused_lm_head=True)``, scored by the
        scored-positions head where :meth:`_install_scored_heads` gave it, else by TRL's fused head.
        """
        device = self.accelerator.device
        inputs = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in packed.items()
                  if k in MODEL_KEYS}
        if compute_aux_loss:
            inputs["output_router_logits"] = True
        with self.accelerator.autocast():
            return model(**inputs, shift_labels=packed["shift_labels"].to(device), use_cache=False,
                         fused_lm_head=True)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **extra):
        if not self.padfree:
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **extra)
        given = sorted(k for k, v in extra.items() if v is not None)
        unknown = sorted(set(extra) - set(MULTIMODAL_KEYS))
        if given or unknown:
            raise ValueError(f"padding-free GRPO/RLOO covers text-only models; this batch has {given or unknown}. "
                             "Set padding_free=False for vision-language models.")
        batch_size = batch_size or input_ids.size(0)
        kind = "train" if torch.is_grad_enabled() else "no_grad"
        logps, entropies, aux = [], [], []
        for start in range(0, input_ids.size(0), batch_size):
            end = min(start + batch_size, input_ids.size(0))
            packed = pack_completion_rows(input_ids[start:end], attention_mask[start:end], logits_to_keep,
                                          prompt_once=self.prompt_once)
            self._count(kind, packed["stats"])
            out = self.packed_scores(model, packed, compute_aux_loss)
            logps.append(scatter_scores(out.log_probs, packed, logits_to_keep))
            if compute_entropy:
                entropies.append(scatter_scores(out.entropy, packed, logits_to_keep))
            if compute_aux_loss:
                aux.append(out.aux_loss)
        return (torch.cat(logps, dim=0), torch.cat(entropies, dim=0) if compute_entropy else None,
                torch.stack(aux).mean() if compute_aux_loss else None)

    def _count(self, kind: str, stats: PackStats) -> None:
        totals = self.pack_totals[kind]
        for name in ("rows", "padded_tokens", "real_tokens", "forwarded_tokens", "shared_tokens"):
            totals[name] += getattr(stats, name)
