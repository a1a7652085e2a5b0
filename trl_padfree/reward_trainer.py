"""``RewardTrainer``: TRL's ``RewardTrainer`` with ``RewardConfig(padding_free=True)`` (TRL pads ``2B`` rows).

TRL's dataset preparation, model set-up, loss and metrics are kept; the ``2B`` sequences go in one row
(:class:`~trl_padfree.reward_layout.DataCollatorForRewardPairs`; with ``prompt_once`` each pair's common token prefix
once), the model runs its own forward on it, a forward hook on its ``score`` head keeps every position's score, and
each reward is read where TRL's pooling reads it (:func:`~trl_padfree.reward_layout.pooled_index`). See
docs/reward.md. With ``padding_free=False`` the trainer is TRL's, unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import trl
from torch import nn
from transformers.modeling_outputs import SequenceClassifierOutputWithPast

from .configs import RewardConfig
from .preference import MODEL_KEYS
from .reward_layout import DataCollatorForRewardPairs, score_head, scores_of
from .trainer import PadfreeTrainerMixin

__all__ = ["RewardConfig", "RewardTrainer"]


class RewardTrainer(PadfreeTrainerMixin, trl.RewardTrainer):
    """``trl.RewardTrainer`` with a working ``padding_free``; the settings are :class:`trl_padfree.RewardConfig`
    fields (the trainer keywords still work for one release, with a ``DeprecationWarning``)."""

    def __init__(self, model: Any, args: Any = None, data_collator: Any = None, train_dataset: Any = None,
                 eval_dataset: Any = None, processing_class: Any = None, *rest: Any, **kwargs: Any) -> None:
        settings = self._padfree_settings("RewardTrainer", args, kwargs)
        if self.padfree and data_collator is not None:
            raise ValueError("padding_free=True builds its own batches (DataCollatorForRewardPairs); do not pass a "
                             "data_collator, or set padding_free=False")
        super().__init__(model, args, data_collator, train_dataset, eval_dataset, processing_class, *rest, **kwargs)
        if self.padfree:
            score_head(self.accelerator.unwrap_model(self.model))  # refuse a model without a score head now
            multiple = self.args.pad_to_multiple_of
            self.data_collator = DataCollatorForRewardPairs(
                pad_token_id=self.processing_class.pad_token_id,  # (TRL set it, and the model's, in __init__)
                pad_to_multiple_of=multiple if isinstance(multiple, int) else None, prompt_once=self.prompt_once)
            self._padfree_setup("reward", settings["check_packing"])

    def _flat_rewards(self, model: nn.Module, inputs: dict[str, Any]) -> tuple[Any, torch.Tensor]:
        """The model's outputs on the row and the ``(2B, num_labels)`` rewards read at ``score_positions``."""
        kwargs = {k: inputs[k] for k in MODEL_KEYS if k in inputs}
        outputs, scores = scores_of(model, {**kwargs, "use_cache": False})
        return outputs, scores.index_select(0, inputs["score_positions"].to(scores.device))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if "score_positions" not in inputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self.count_real_tokens(inputs)  # (TRL's compute_loss, which the tokens/s log wraps, is not called)
        mode = "train" if self.model.training else "eval"
        outputs, logits = self._flat_rewards(model, inputs)
        # from here on TRL 1.16's compute_loss, on the rewards read at every sequence's pooled token
        rewards_chosen, rewards_rejected = torch.chunk(logits.squeeze(-1), chunks=2)
        if "margin" in inputs:
            loss = -nn.functional.logsigmoid(rewards_chosen - rewards_rejected - inputs["margin"]).mean()
        else:
            loss = -nn.functional.logsigmoid(rewards_chosen - rewards_rejected).mean()
        if self.args.center_rewards_coefficient is not None:
            loss += self.args.center_rewards_coefficient * torch.mean((rewards_chosen + rewards_rejected) ** 2)
        if mode == "train":
            tokens = torch.tensor(int(inputs["num_tokens"]), device=logits.device)
            self._total_train_tokens += self.accelerator.gather_for_metrics(tokens).sum().item() // self._tp_size
        self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
        with torch.no_grad():
            all_rewards = self.accelerator.gather(logits)
            for name, value in (("min_reward", all_rewards.min()), ("mean_reward", all_rewards.mean()),
                                ("max_reward", all_rewards.max())):
                self._metrics[mode][name].append(value.item())
            for name, value in (("accuracy", (rewards_chosen > rewards_rejected).float().mean()),
                                ("margin", (rewards_chosen - rewards_rejected).mean())):
                self._metrics[mode][name].append(self.accelerator.gather_for_metrics(value).mean().item())
        if return_outputs:
            # what TRL's model call returns, with the pooled logits of every sequence (evaluation reads them)
            return loss, SequenceClassifierOutputWithPast(loss=None, logits=logits)
        return loss
