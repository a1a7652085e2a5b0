"""``RewardTrainer``: TRL's ``RewardTrainer`` with ``RewardConfig(padding_free=True)``.

TRL 1.16's ``RewardTrainer`` pads ``chosen_ids`` and ``rejected_ids`` into ``2B`` rows, and its
sequence-classification model reads each row's score at the row's last non-pad token. ``trl.RewardConfig`` has no
``padding_free``: :class:`trl_padfree.RewardConfig` (:mod:`trl_padfree.configs`) is TRL's with it and this package's
other settings added. This trainer keeps TRL's dataset
preparation (EOS, tokenization, ``max_length`` filter), model set-up, loss (``margin``,
``center_rewards_coefficient``) and logged metrics, and replaces only the batch and the forward:

- the collator (:class:`~trl_padfree.reward_layout.DataCollatorForRewardPairs`) puts the ``2B`` sequences in one
  row with ``position_ids`` and ``cu_seq_lens``; with ``prompt_once=True`` each pair's common token prefix is
  computed once (the shared-key index of the ``"padfree"`` attention, as DPO's ``prompt_once``);
- the model runs its own forward on the row (so DDP, PEFT and gradient checkpointing work as usual); a forward hook
  on its ``score`` head keeps every position's score, and each sequence's reward is read at the token TRL's pooling
  would read in that sequence (:func:`~trl_padfree.reward_layout.pooled_index`).

Before the first step the model is probed: every token's score in the packed row must equal its score when the
sequence runs alone (:mod:`trl_padfree.reward_probe`); a leaking attention raises
:class:`~trl_padfree.probe.PackingLeakError`. With ``padding_free=False`` the trainer is TRL's, unchanged.

    from trl_padfree import RewardConfig, RewardTrainer
    config = RewardConfig(output_dir="out", padding_free=True)
    trainer = RewardTrainer(model, args=config, train_dataset=pairs, processing_class=tokenizer, prompt_once=True)
"""

from __future__ import annotations

from typing import Any

import torch
import trl
from torch import nn
from transformers.modeling_outputs import SequenceClassifierOutputWithPast

from .configs import UNSET, RewardConfig, trainer_settings
from .dpo import require_padfree_attention
from .preference import MODEL_KEYS
from .reward_layout import DataCollatorForRewardPairs
from .reward_probe import score_head, scores_of
from .trainer import LayoutProbeCallback, PadfreeTrainerMixin, checked_threads

__all__ = ["RewardCheckCallback", "RewardConfig", "RewardTrainer"]


class RewardCheckCallback(LayoutProbeCallback):
    """Runs the reward packing probe once, when training begins; raises if packed sequences leak."""

    what = "reward"
    compared = "score"

    def probe(self) -> Any:
        from .reward_probe import assert_reward_packing_safe

        return assert_reward_packing_safe


def reward_padding_free_unavailable() -> str | None:
    """One line naming the fix where the installed TRL cannot run padding-free reward training, else None.

    >>> reward_padding_free_unavailable() is None or "upgrade trl" in reward_padding_free_unavailable()
    True
    """
    from ._compat import MIN_TRL_REWARD, TRL_VERSION, trl_at_least

    if trl_at_least(MIN_TRL_REWARD):
        return None
    return (f"padding-free reward training is checked against trl >= {MIN_TRL_REWARD}'s RewardTrainer, and trl "
            f"{TRL_VERSION} is installed: upgrade trl (pip install -U 'trl>={MIN_TRL_REWARD}') or set "
            "padding_free=False")


class RewardTrainer(PadfreeTrainerMixin, trl.RewardTrainer):
    """``trl.RewardTrainer`` with a working ``padding_free`` (see the module docstring).

    ``padding_free`` is read from ``args`` (:class:`trl_padfree.RewardConfig`, or any config with that attribute),
    and so are the settings below where ``args`` is a :class:`trl_padfree.RewardConfig` (else their defaults); the
    trainer keywords still work for one release (a ``DeprecationWarning``; one that contradicts a value set in the
    config is an error):
        prompt_once: with ``padding_free``, compute each pair's common token prefix once
            (``attn_implementation="padfree"``).
        check_packing: probe the model before the first step (default True).
        torch_num_threads: the CPU thread policy of :class:`trl_padfree.SFTTrainer`.
    """

    def __init__(self, model: Any, args: Any = None, data_collator: Any = None, train_dataset: Any = None,
                 eval_dataset: Any = None, processing_class: Any = None, *rest: Any, prompt_once: Any = UNSET,
                 check_packing: Any = UNSET, torch_num_threads: Any = UNSET, **kwargs: Any) -> None:
        settings = trainer_settings("RewardTrainer", args, prompt_once=prompt_once, check_packing=check_packing,
                                    torch_num_threads=torch_num_threads)
        check_packing = settings["check_packing"]
        self.torch_num_threads = checked_threads(settings["torch_num_threads"])
        self.padfree = bool(args is not None and getattr(args, "padding_free", False))
        self.prompt_once = bool(settings["prompt_once"])
        if self.prompt_once and not self.padfree:
            raise ValueError("prompt_once=True needs RewardConfig(padding_free=True) (trl_padfree.RewardConfig).")
        if self.padfree:
            problem = reward_padding_free_unavailable()
            if problem is not None:
                raise ValueError(problem)
            if data_collator is not None:
                raise ValueError("padding_free=True builds its own batches (DataCollatorForRewardPairs); do not pass "
                                 "a data_collator, or set padding_free=False")
        super().__init__(model, args, data_collator, train_dataset, eval_dataset, processing_class, *rest, **kwargs)
        if self.padfree:
            unwrapped = self.accelerator.unwrap_model(self.model)
            score_head(unwrapped)  # refuse a model without a per-position score head now, not at the first step
            if self.prompt_once:
                require_padfree_attention(unwrapped)
            pad = self.processing_class.pad_token_id  # TRL set it (and the model's) in __init__
            multiple = self.args.pad_to_multiple_of
            self.data_collator = DataCollatorForRewardPairs(
                pad_token_id=pad, pad_to_multiple_of=multiple if isinstance(multiple, int) else None,
                prompt_once=self.prompt_once)
            if check_packing:
                self.add_callback(RewardCheckCallback(self.prompt_once))

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
        # from here on TRL's compute_loss (1.8-1.16), on the rewards read at every sequence's pooled token
        rewards_chosen, rewards_rejected = torch.chunk(logits.squeeze(-1), chunks=2)
        if "margin" in inputs:
            loss = -nn.functional.logsigmoid(rewards_chosen - rewards_rejected - inputs["margin"]).mean()
        else:
            loss = -nn.functional.logsigmoid(rewards_chosen - rewards_rejected).mean()
        if self.args.center_rewards_coefficient is not None:
            loss += self.args.center_rewards_coefficient * torch.mean((rewards_chosen + rewards_rejected) ** 2)
        if mode == "train":
            tokens = torch.tensor(int(inputs["num_tokens"]), device=logits.device)
            tp_size = getattr(self, "_tp_size", 1)  # (trl < 1.16 does not divide by it)
            self._total_train_tokens += self.accelerator.gather_for_metrics(tokens).sum().item() // tp_size
        self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
        with torch.no_grad():
            all_rewards = self.accelerator.gather(logits)
            self._metrics[mode]["min_reward"].append(all_rewards.min().item())
            self._metrics[mode]["mean_reward"].append(all_rewards.mean().item())
            self._metrics[mode]["max_reward"].append(all_rewards.max().item())
            mean_accuracy = (rewards_chosen > rewards_rejected).float().mean()
            mean_accuracy = self.accelerator.gather_for_metrics(mean_accuracy).mean().item()
            self._metrics[mode]["accuracy"].append(mean_accuracy)
            mean_margin = (rewards_chosen - rewards_rejected).mean()
            mean_margin = self.accelerator.gather_for_metrics(mean_margin).mean()
            self._metrics[mode]["margin"].append(mean_margin.item())
        if return_outputs:
            # what TRL's model call returns, with the pooled logits of every sequence (evaluation reads them)
            return loss, SequenceClassifierOutputWithPast(loss=None, logits=logits)
        return loss
