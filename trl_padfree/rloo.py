"""``RLOOTrainer``: TRL's ``RLOOTrainer`` whose log-prob forwards run padding-free (:mod:`trl_padfree.rl_trainer`).

    from trl import RLOOConfig
    from trl_padfree import RLOOTrainer
    trainer = RLOOTrainer(model, reward_funcs=reward, args=RLOOConfig(output_dir="out"), train_dataset=prompts,
                          padding_free=True, prompt_once=True)  # prompt_once: attn_implementation="padfree"

With ``padding_free=False`` (the default) the trainer is TRL's, unchanged.
"""

from __future__ import annotations

from typing import Any

import trl

from .rl_trainer import PaddingFreeRLMixin

__all__ = ["RLOOTrainer"]


class RLOOTrainer(PaddingFreeRLMixin, trl.RLOOTrainer):
    """``trl.RLOOTrainer`` with ``padding_free`` (see :mod:`trl_padfree.rl_trainer`).

    Extra arguments:
        padding_free: run the policy, old-policy and reference forwards on one flat row per micro-batch (None:
            the config's ``padding_free`` attribute, else False).
        prompt_once: with ``padding_free``, rows of the same prompt in a micro-batch share one forwarded copy of it
            (needs ``attn_implementation="padfree"``).
        check_packing: probe the model(s) before the first step (default True).
        torch_num_threads: the CPU thread policy of :class:`trl_padfree.SFTTrainer`.
        scored_lm_head: with ``padding_free``, score policy, old policy and reference with
            :mod:`trl_padfree.scored_head` (only the completion positions are projected, on every device; default
            True); False: TRL's fused head. ``self.lm_head_state`` / ``self.ref_lm_head_state``: ``"scored"`` or
            ``"trl: <why>"``.
    """

    def __init__(self, *args: Any, padding_free: bool | None = None, prompt_once: bool = False,
                 check_packing: bool = True, torch_num_threads: int | str | None = "auto",
                 scored_lm_head: bool = True, **kwargs: Any) -> None:
        self._padfree_init(trl.RLOOTrainer, args, kwargs, padding_free=padding_free, prompt_once=prompt_once,
                           check_packing=check_packing, torch_num_threads=torch_num_threads,
                           scored_lm_head=scored_lm_head)
