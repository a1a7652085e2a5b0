"""``KTOTrainer``: TRL's ``KTOTrainer`` with ``KTOConfig(padding_free=True)`` (TRL 1.16 pads twice per batch).

TRL's dataset preparation, reference handling, losses and metrics are kept; the completion sequences and the "KL"
sequences are each laid out in one row (:class:`DataCollatorForUnpairedFlat`), every model call is TRL's
fused-LM-head call on a row, and per-sequence values are segment sums. With ``prompt_once`` the reference runs one
row, each prompt once for its completion and its KL completion (its forwards have no gradient, so they can share);
the policy keeps two rows. See docs/reward.md. With ``padding_free=False`` the trainer is TRL's, unchanged.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import torch
import torch.nn.functional as F
import trl

from .configs import KTOConfig
from .dpo import flat_forward, log_entropy_and_tokens, reference_forward
from .preference import MODEL_KEYS, DataCollatorForPreference, PreferenceLayout, segment_sum, truncate_pair
from .trainer import PadfreeTrainerMixin

__all__ = ["DataCollatorForUnpairedFlat", "KTOConfig", "KTOTrainer"]


@dataclass
class DataCollatorForUnpairedFlat:
    """Padding-free counterpart of TRL's ``DataCollatorForUnpairedPreference`` (same inputs, same truncation:
    ``prompt + completion`` cut to ``max_length`` from the end).

    Returns, for the completion sequences, the model inputs of :data:`~trl_padfree.preference.MODEL_KEYS` with
    ``shift_labels`` / ``score_index`` (sequence ``i``'s scored positions) and ``num_tokens``; the same with a
    ``KL_`` prefix for the KL sequences when the examples have ``KL_completion_ids``; ``label`` (B,),
    ``num_sequences`` and ``ref_logps`` / ``ref_KL_logps`` when the examples have them. With
    ``reference_prompt_once`` (and KL completions, no precomputed reference log-probs) also a ``pair_`` row for the
    reference: each prompt once, followed by its completion and (sharing the prompt's keys) its KL completion,
    laid out as :class:`~trl_padfree.preference.DataCollatorForPreference` lays out a prompt-once pair.

    >>> rows = [{"prompt_ids": [1, 2, 3], "completion_ids": [4, 5], "KL_completion_ids": [6], "label": True},
    ...         {"prompt_ids": [7, 8], "completion_ids": [9], "KL_completion_ids": [4, 5], "label": False}]
    >>> flat = DataCollatorForUnpairedFlat(pad_token_id=0)(rows)
    >>> flat["input_ids"].tolist(), flat["shift_labels"].tolist(), flat["score_index"].tolist()
    ([[1, 2, 3, 4, 5, 7, 8, 9]], [[-100, -100, 4, 5, -100, -100, 9, -100]], [[-1, -1, 0, 0, -1, -1, 1, -1]])
    >>> flat["KL_input_ids"].tolist(), flat["KL_cu_seq_lens_q"].tolist(), flat["label"].tolist()
    ([[1, 2, 3, 6, 7, 8, 4, 5]], [0, 4, 8], [True, False])
    """

    pad_token_id: int
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    reference_prompt_once: bool = False
    return_tensors: str = "pt"

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        DataCollatorForPreference.check_batch(examples, "DataCollatorForUnpairedFlat", "KTO examples",
                                              ("prompt_ids", "completion_ids", "label"), "KTOTrainer",
                                              "prompt/completion")
        out: dict[str, Any] = {}
        rows = DataCollatorForPreference(pad_token_id=self.pad_token_id, pad_to_multiple_of=self.pad_to_multiple_of)
        for prefix, key in (("", "completion_ids"), ("KL_", "KL_completion_ids")):
            if key not in examples[0]:
                continue
            layout = PreferenceLayout.empty()
            num_tokens = 0
            for i, ex in enumerate(examples):
                prompt, completion = truncate_pair(ex["prompt_ids"], ex[key], self.max_length, "keep_start")
                if not prompt and not completion:
                    raise ValueError(f"example {i} has no tokens ({key}); drop empty examples from the dataset")
                layout.segment(prompt, completion, i)
                num_tokens += len(prompt) + len(completion)
            batch = rows._tensors(layout)
            batch.pop("score_rank")
            out.update({prefix + k: v for k, v in batch.items()})
            out[prefix + "num_tokens"] = num_tokens
        out["num_sequences"] = len(examples)
        if self.reference_prompt_once and "KL_completion_ids" in examples[0] and "ref_logps" not in examples[0]:
            # the reference's row: each prompt once, its completion then its KL completion (DPO's prompt-once pair)
            pairs = DataCollatorForPreference(pad_token_id=self.pad_token_id, max_length=self.max_length,
                                              pad_to_multiple_of=self.pad_to_multiple_of, prompt_once=True)
            batch = pairs([{"prompt_ids": ex["prompt_ids"], "chosen_ids": ex["completion_ids"],
                            "rejected_ids": ex["KL_completion_ids"]} for ex in examples])
            out.update({"pair_" + k: batch[k] for k in (*MODEL_KEYS, "shift_labels", "score_index") if k in batch})
        for key in ("ref_logps", "ref_KL_logps"):
            if key in examples[0]:
                out[key] = torch.tensor([ex[key] for ex in examples])
        out["label"] = torch.tensor([ex["label"] for ex in examples])
        return out


class KTOTrainer(PadfreeTrainerMixin, trl.KTOTrainer):
    """``trl.KTOTrainer`` with a working ``padding_free``; the settings are :class:`trl_padfree.KTOConfig` fields
    (the trainer keywords still work for one release, with a ``DeprecationWarning``). A training set's
    ``precompute_ref_log_probs`` pass is TRL's, padded."""

    def __init__(self, model: Any, ref_model: Any = None, args: Any = None, data_collator: Any = None,
                 train_dataset: Any = None, eval_dataset: Any = None, processing_class: Any = None, *rest: Any,
                 **kwargs: Any) -> None:
        settings = self._padfree_settings("KTOTrainer", args, kwargs)
        if self.padfree and data_collator is not None:
            raise ValueError("padding_free=True builds its own batches (DataCollatorForUnpairedFlat); do not pass a "
                             "data_collator, or set padding_free=False")
        super().__init__(model, ref_model, args, data_collator, train_dataset, eval_dataset, processing_class,
                         *rest, **kwargs)
        self.lm_head_state = self.ref_lm_head_state = "trl: padding_free=False"
        if self.padfree:
            if self._is_vision_dataset:
                raise ValueError("padding-free KTO covers text data only; set padding_free=False for vision data")
            multiple = self.args.pad_to_multiple_of
            # (training-set reference log-probs, if precomputed, came from TRL's padded pass in __init__)
            self.data_collator = DataCollatorForUnpairedFlat(
                pad_token_id=self._tokenizer.pad_token_id, max_length=self.args.max_length,
                pad_to_multiple_of=multiple if isinstance(multiple, int) else None,
                reference_prompt_once=self.prompt_once and self.calculate_KL)
            # the outputs TRL's own fused heads compute here (KTOTrainer.__init__)
            self._padfree_setup("preference", settings["check_packing"], ("log_probs", "entropy", "mean_logits"))

    # ---- forward -------------------------------------------------------------------------------------------
    def _sequence_logps(self, per_token: torch.Tensor, inputs: dict[str, Any], prefix: str = "") -> torch.Tensor:
        return segment_sum(per_token, inputs[prefix + "score_index"], int(inputs["num_sequences"]))

    def _kl_logps(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor | None:
        if not self.calculate_KL:
            return None
        with torch.no_grad():
            return self._sequence_logps(flat_forward(model, inputs, "KL_").log_probs, inputs, "KL_")

    def _reference_logps(self, inputs: dict[str, Any], model: Any = None) -> tuple[torch.Tensor, Any]:
        """``(completion log-probs (B,), KL log-probs (B,) or None)`` of the reference."""
        with reference_forward(self, model) as model:
            if "pair_shift_labels" in inputs:  # prompt once: completion and KL sequence in one forward
                out = flat_forward(model, inputs, "pair_")
                n = int(inputs["num_sequences"])
                logps, kl = segment_sum(out.log_probs, inputs["pair_score_index"], 2 * n).chunk(2)
            else:
                kl = self._kl_logps(model, inputs)
                logps = self._sequence_logps(flat_forward(model, inputs).log_probs, inputs)
        return logps, kl

    def compute_ref_log_probs(self, model: Any, inputs: dict[str, Any]) -> Any:
        if "shift_labels" not in inputs:
            return super().compute_ref_log_probs(model, inputs)
        with self.accelerator.autocast():
            return self._reference_logps(inputs, model)

    # ---- loss ----------------------------------------------------------------------------------------------
    def _compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool) -> Any:
        if "shift_labels" not in inputs:
            return super()._compute_loss(model, inputs, return_outputs)
        mode = "train" if self.model.training else "eval"
        device = self.accelerator.device
        batch = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
        labels = batch["label"]
        num_chosen = labels.sum().to(device)
        num_rejected = (len(labels) - num_chosen).to(device)

        KL_logps = self._kl_logps(model, batch)
        extra = {"output_router_logits": True} if self.aux_loss_enabled else {}
        outputs = flat_forward(model, batch, **extra)
        index, n = batch["score_index"], int(batch["num_sequences"])
        completion_logps = self._sequence_logps(outputs.log_probs, batch)
        scored = segment_sum(torch.ones_like(outputs.log_probs), index, n)

        bool_labels = torch.as_tensor(labels, dtype=torch.bool, device=completion_logps.device)
        chosen_idx = torch.nonzero(bool_labels, as_tuple=False).view(-1)
        rejected_idx = torch.nonzero(~bool_labels, as_tuple=False).view(-1)
        chosen_logps = completion_logps.index_select(0, chosen_idx)
        rejected_logps = completion_logps.index_select(0, rejected_idx)

        if self.precompute_ref_logps:
            ref_logps = batch["ref_logps"]
            ref_KL_logps = batch["ref_KL_logps"] if self.calculate_KL else None
        else:
            ref_logps, ref_KL_logps = self._reference_logps(batch)
        ref_chosen_logps = ref_logps.index_select(0, chosen_idx)
        ref_rejected_logps = ref_logps.index_select(0, rejected_idx)

        # from here on TRL 1.16's _compute_loss, on the segment sums
        if self.calculate_KL:
            kl = (KL_logps - ref_KL_logps).mean().detach()
            kl = self.accelerator.gather_for_metrics(kl).mean().clamp(min=0)
        else:
            kl = torch.zeros(1).to(chosen_logps.device)

        def side(logps: torch.Tensor, ref: torch.Tensor, chosen: bool) -> tuple[torch.Tensor, torch.Tensor]:
            if logps.shape[0] == 0 and ref.shape[0] == 0:
                return torch.Tensor([]).to(device), torch.Tensor([]).to(device)
            ratios = logps - ref
            if self.loss_type == "kto":  # else TRL's other unpaired loss, "apo_zero_unpaired"
                losses = 1 - F.sigmoid(self.beta * ((ratios - kl) if chosen else (kl - ratios)))
            else:
                losses = 1 - F.sigmoid(self.beta * ratios) if chosen else F.sigmoid(self.beta * ratios)
            return losses, self.beta * ratios.detach()

        chosen_losses, chosen_rewards = side(chosen_logps, ref_chosen_logps, True)
        rejected_losses, rejected_rewards = side(rejected_logps, ref_rejected_logps, False)
        losses = torch.cat((self.desirable_weight * chosen_losses, self.undesirable_weight * rejected_losses), 0)
        self._metrics[mode]["kl"].append(kl.item())
        self._log_metrics(mode, batch, outputs, scored, (chosen_idx, rejected_idx), (num_chosen, num_rejected),
                          (chosen_rewards, rejected_rewards), (chosen_logps, rejected_logps))
        loss = losses.nanmean()
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * outputs.aux_loss
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(outputs.aux_loss).mean().item())
        if return_outputs:
            # as TRL: the fused head builds no logits, so evaluation's logits take one more forward (of the row:
            # (1, T, vocab), not TRL's (B, T, vocab))
            warnings.warn("`return_outputs=True`, and the logits it passes to `compute_metrics`, are deprecated in TRL "
                          "and recomputed with an extra forward pass.", FutureWarning, stacklevel=2)
            with torch.no_grad():
                outputs = model(**{k: batch[k] for k in MODEL_KEYS if k in batch}, use_cache=False)
            return loss, outputs
        return loss

    def prediction_step(self, model: Any, inputs: dict[str, Any], prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None) -> Any:
        """TRL's, with the logits and labels of a flat batch given back per sequence, as TRL's padded batch gives them:
        ``(B, T, vocab)`` logits and ``(B, T)`` input ids, right-padded to the batch's longest sequence (rounded up to
        ``pad_to_multiple_of``), so that ``compute_metrics`` sees one row per example (the row itself is
        ``(1, total tokens)``, and evaluation would concatenate one such row per batch). Padded positions: logits
        -100 (the Trainer's own padding value across batches), ids ``pad_token_id`` (TRL's)."""
        loss, logits, labels = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        if logits is None or "cu_seq_lens_q" not in inputs:
            return loss, logits, labels
        n = int(inputs["num_sequences"])
        bounds = inputs["cu_seq_lens_q"].tolist()[: n + 1]
        width = max(end - start for start, end in pairwise(bounds))
        multiple = self.args.pad_to_multiple_of
        if isinstance(multiple, int) and multiple > 1:
            width = -(-width // multiple) * multiple
        rows = logits.new_full((n, width, logits.shape[-1]), -100.0)
        ids = labels.new_full((n, width), self._tokenizer.pad_token_id)
        for i, (start, end) in enumerate(pairwise(bounds)):
            rows[i, : end - start] = logits[0, start:end]
            ids[i, : end - start] = labels[0, start:end]
        return loss, rows, ids

    def _log_metrics(self, mode: str, batch: dict[str, Any], outputs: Any, scored: torch.Tensor, idx: tuple,
                     counts: tuple, rewards: tuple, logps: tuple) -> None:
        """TRL 1.16's metrics, from segment sums (same names, same gathering across ranks)."""
        gather = self.accelerator.gather_for_metrics
        index, n = batch["score_index"], int(batch["num_sequences"])
        chosen_idx, rejected_idx = idx
        log_entropy_and_tokens(self, mode, outputs, index, n, scored, batch["num_tokens"])
        logits = segment_sum(outputs.mean_logits.detach(), index, n)
        for name, rows in (("chosen", chosen_idx), ("rejected", rejected_idx)):
            total = gather(logits.index_select(0, rows).sum()).sum().item()
            tokens = gather(scored.index_select(0, rows).sum()).sum().item()
            if tokens > 0:
                self._metrics[mode][f"logits/{name}"].append(total / tokens)
        all_num = [gather(c).sum().item() for c in counts]
        for name, num, reward, logp in zip(("chosen", "rejected"), all_num, rewards, logps, strict=True):
            if num > 0:
                self._metrics[mode][f"rewards/{name}"].append(gather(reward.nansum()).nansum().item() / num)
                self._metrics[mode][f"logps/{name}"].append(gather(logp.detach().nansum()).nansum().item() / num)
        if all_num[0] > 0 and all_num[1] > 0:
            self._metrics[mode]["rewards/margins"].append(
                self._metrics[mode]["rewards/chosen"][-1] - self._metrics[mode]["rewards/rejected"][-1])
