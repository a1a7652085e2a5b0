"""``RLOOTrainer``: TRL's ``RLOOTrainer`` whose log-prob forwards run padding-free (:mod:`trl_padfree.rl_trainer`).

    from trl_padfree import RLOOConfig, RLOOTrainer
    config = RLOOConfig(output_dir="out", padding_free=True, prompt_once=True)  # prompt_once: attn "padfree"
    trainer = RLOOTrainer(model, reward_funcs=reward, args=config, train_dataset=prompts)

With ``padding_free=False`` (the default) the trainer is TRL's, unchanged.
"""

from __future__ import annotations

from typing import Any

import trl

from .configs import UNSET
from .rl_trainer import PaddingFreeRLMixin

__all__ = ["RLOOTrainer"]


class RLOOTrainer(PaddingFreeRLMixin, trl.RLOOTrainer):
    """``trl.RLOOTrainer`` with ``padding_free`` (see :mod:`trl_padfree.rl_trainer`).

    Its settings are fields of :class:`trl_padfree.RLOOConfig` (``args``; with TRL's ``RLOOConfig``, the defaults below);
    the trainer keywords still work for one release (a ``DeprecationWarning``; one that contradicts a value set in
    the config is an error):
        padding_free: run the policy, old-policy and reference forwards on one flat row per micro-batch (default
            False; with another config, its ``padding_free`` attribute if it has one).
        prompt_once: with ``padding_free``, rows of the same prompt in a micro-batch share one forwarded copy of it
            (needs ``attn_implementation="padfree"``).
        check_packing: probe the model(s) before the first step (default True).
        torch_num_threads: the CPU thread policy of :class:`trl_padfree.SFTTrainer`.
        scored_lm_head: with ``padding_free``, score policy, old policy and reference with
            :mod:`trl_padfree.scored_head` (only the completion positions are projected, on every device; default
            True); False: TRL's fused head. ``self.lm_head_state`` / ``self.ref_lm_head_state``: ``"scored"`` or
            ``"trl: <why>"``.
    """

    def __init__(self, *args: Any, padding_free: bool | None = None, prompt_once: Any = UNSET,
                 check_packing: Any = UNSET, torch_num_threads: Any = UNSET, scored_lm_head: Any = UNSET,
                 **kwargs: Any) -> None:
        self._padfree_init(trl.RLOOTrainer, args, kwargs, padding_free=padding_free, prompt_once=prompt_once,
                           check_packing=check_packing, torch_num_threads=torch_num_threads,
                           scored_lm_head=scored_lm_head)
