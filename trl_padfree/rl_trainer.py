"""``GRPOTrainer`` and ``RLOOTrainer``: TRL's, with their log-prob forwards padding-free (one implementation).

TRL computes every per-token log-prob (policy, old policy, reference) in ``_get_per_token_logps_and_entropies`` on
chunks of padded rows. With ``padding_free`` each chunk is laid out as one flat row
(:func:`~trl_padfree.rl_packing.pack_completion_rows`; with ``prompt_once`` rows of one prompt share it), the model
runs once on it (:meth:`PaddingFreeRLMixin.packed_scores`) and the values go back into the ``[N, logits_to_keep]``
tensors TRL's loss reads (:func:`~trl_padfree.rl_packing.scatter_scores`). Generation, rewards, advantages, losses
and metrics stay TRL's. See docs/rl.md.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections import Counter
from typing import Any

import torch
import trl

from ._compat import quiet_gradient_checkpointing_warning
from .configs import PADFREE_CONFIGS, UNSET, trainer_keywords
from .preference import MODEL_KEYS
from .rl_packing import pack_completion_rows, scatter_scores
from .trainer import PadfreeTrainerMixin

__all__ = ["GRPOTrainer", "PaddingFreeRLMixin", "RLOOTrainer"]

#: Keyword arguments of TRL's log-prob method that carry images / processor outputs (not covered: TRL pads those).
MULTIMODAL_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                   "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")


class PaddingFreeRLMixin(PadfreeTrainerMixin):
    """The packed ``_get_per_token_logps_and_entropies`` of TRL's GRPO/RLOO trainers (see the module docstring).

    Its settings (``padding_free``, ``prompt_once``, ``check_packing``, ``torch_num_threads``, ``scored_lm_head``)
    are fields of :class:`trl_padfree.GRPOConfig` / ``RLOOConfig``, described there (``args``; with TRL's config,
    their defaults, and ``padding_free`` its attribute if it has one); the trainer keywords still work for one
    release (a ``DeprecationWarning``; one that contradicts a value set in the config is an error).
    ``self.lm_head_state`` / ``self.ref_lm_head_state``: ``"scored"`` or ``"trl: <why>"``.

    ``pack_totals`` counts, over every packed forward of this trainer, rows and tokens (padded, real, forwarded,
    shared: :class:`~trl_padfree.rl_packing.PackStats` fields) by kind (``"train"`` with grad, ``"no_grad"``).
    """

    padfree: bool = False
    prompt_once: bool = False
    #: whether TRL passes ``args.cast_lm_head_to_fp32`` to its fused head (GRPO does, RLOO has no such option)
    casts_lm_head_to_fp32: bool = False

    def __init__(self, *args: Any, padding_free: bool | None = None, **kwargs: Any) -> None:
        trl_class = next(c for c in type(self).__mro__ if c.__module__.split(".")[0] == "trl")
        given = trainer_keywords(trl_class.__name__, kwargs)  # (not TRL's: out of kwargs before binding them)
        config = inspect.signature(trl_class.__init__).bind_partial(None, *args, **kwargs).arguments.get("args")
        # a package config: its field (or the keyword); another config: the keyword, else its padding_free attribute
        padfree = None
        if not isinstance(config, tuple(PADFREE_CONFIGS.values())):
            if padding_free is not None and not isinstance(padding_free, bool):
                raise TypeError(f"padding_free must be True, False or None, got {padding_free!r}")
            from_config = getattr(config, "padding_free", None)
            if padding_free is not None and from_config is not None and bool(from_config) != padding_free:
                raise ValueError(f"padding_free={padding_free} contradicts the config's padding_free="
                                 f"{bool(from_config)}; set one of them (or both alike)")
            padfree = bool(padding_free if padding_free is not None else from_config)
        settings = self._padfree_settings(trl_class.__name__, config, {}, padfree,
                                          padding_free=UNSET if padding_free is None else padding_free, **given)
        self.pack_totals: dict[str, Counter] = {"train": Counter(), "no_grad": Counter()}
        trl_class.__init__(self, *args, **kwargs)
        if not self.padfree:
            self.lm_head_state = self.ref_lm_head_state = "trl: padding_free=False"
            return
        cast = bool(getattr(self.args, "cast_lm_head_to_fp32", False)) if self.casts_lm_head_to_fp32 else False
        self._padfree_setup("group", settings["check_packing"], ("log_probs", "entropy"),
                            temperature=float(self.temperature), cast_lm_head_to_fp32=cast)

    def train(self, *args: Any, **kwargs: Any) -> Any:
        with quiet_gradient_checkpointing_warning():  # (TRL's generation)
            return super().train(*args, **kwargs)

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
            self.pack_totals[kind].update(dataclasses.asdict(packed["stats"]))
            out = self.packed_scores(model, packed, compute_aux_loss)
            logps.append(scatter_scores(out.log_probs, packed, logits_to_keep))
            if compute_entropy:
                entropies.append(scatter_scores(out.entropy, packed, logits_to_keep))
            if compute_aux_loss:
                aux.append(out.aux_loss)
        return (torch.cat(logps, dim=0), torch.cat(entropies, dim=0) if compute_entropy else None,
                torch.stack(aux).mean() if compute_aux_loss else None)


class GRPOTrainer(PaddingFreeRLMixin, trl.GRPOTrainer):
    """``trl.GRPOTrainer`` with ``padding_free`` (settings: :class:`PaddingFreeRLMixin`)."""

    casts_lm_head_to_fp32 = True  # TRL's GRPOTrainer gives its fused head args.cast_lm_head_to_fp32


class RLOOTrainer(PaddingFreeRLMixin, trl.RLOOTrainer):
    """``trl.RLOOTrainer`` with ``padding_free`` (settings: :class:`PaddingFreeRLMixin`)."""
