"""The TRL and transformers versions this package supports.

Supported (``pyproject.toml``): ``trl>=1.16,<2`` with ``transformers>=5.23,<6``. ``make test`` runs the suite on
the newest releases, ``make test-lowest`` on the lowest pair (trl 1.16.0, transformers 5.23.0). trl 1.16 is the
first whose DPO, KTO, GRPO and RLOO trainers and fused LM head this package builds on; transformers 5.23 is the
first with ``activation_checkpointing`` (the name the configs, the example and the docs use;
``gradient_checkpointing`` is its deprecated alias there). What differs inside the window:

- transformers 5.23's falcon builds its mask without ``position_ids``: packed examples leak under sdpa/eager
  (``trl-padfree check`` says so; 5.24 keeps them apart).

The ``MIN_TRL_*`` floors below and their ``*_unavailable`` checks (:func:`needs_trl`) date from the older floor
(trl 1.8); within this window they always pass, so the trainers no longer call them (the tests' skip marks and the
launch still read them).
"""

from __future__ import annotations

from functools import partial
from importlib.metadata import version

from packaging.version import Version

MIN_TRL = "1.16"
MIN_TRANSFORMERS = "5.23"

TRL_VERSION = Version(version("trl"))
TRANSFORMERS_VERSION = Version(version("transformers"))


def trl_at_least(v: str) -> bool:
    """Whether the installed TRL is ``v`` or newer.

    >>> trl_at_least(MIN_TRL)
    True
    """
    return TRL_VERSION >= Version(v)


def transformers_at_least(v: str) -> bool:
    """Whether the installed transformers is ``v`` or newer.

    >>> transformers_at_least(MIN_TRANSFORMERS)
    True
    """
    return TRANSFORMERS_VERSION >= Version(v)


def needs_trl(floor: str, what: str, fix: str = " or set padding_free=False") -> str | None:
    """One line naming the fix where the installed TRL is older than ``floor``, which ``what`` needs; else None.

    >>> needs_trl(MIN_TRL, "padding-free DPO") is None
    True
    >>> needs_trl("99", "padding-free DPO (its fused LM head)").startswith("padding-free DPO (its fused LM head) needs "
    ...                                                                    "trl >= 99, and trl ")
    True
    """
    if trl_at_least(floor):
        return None
    return f"{what} needs trl >= {floor}, and trl {TRL_VERSION} is installed: upgrade trl (pip install -U 'trl>={floor}'){fix}"


# Padding-free DPO builds on TRL 1.16's DPOTrainer (its fused LM head with shift_labels and per-token outputs, its
# loss types); KTO on 1.16's KTOTrainer; GRPO/RLOO replace 1.16's single log-prob method and call its fused head;
# the reward trainer restates RewardTrainer.compute_loss, the same from trl 1.8 to 1.16 (but 1.16's division of the
# token count by the tensor-parallel size); the scored LM head returns 1.16's FusedCausalLMOutput.
MIN_TRL_DPO = MIN_TRL_KTO = MIN_TRL_RL = MIN_TRL_SCORED_HEAD = "1.16"
MIN_TRL_REWARD = "1.8"

dpo_padding_free_unavailable = partial(needs_trl, MIN_TRL_DPO, "padding-free DPO (its DPOTrainer's fused LM head and "
                                       "loss types)")
rl_padding_free_unavailable = partial(needs_trl, MIN_TRL_RL, "padding-free GRPO/RLOO (its trainers' single log-prob "
                                      "method and fused LM head)")
kto_padding_free_unavailable = partial(needs_trl, MIN_TRL_KTO, "padding-free KTO (its KTOTrainer's fused LM head)")
reward_padding_free_unavailable = partial(needs_trl, MIN_TRL_REWARD, "padding-free reward training (checked against "
                                          "its RewardTrainer)")
scored_head_unavailable = partial(needs_trl, MIN_TRL_SCORED_HEAD, "the scored LM head (its fused LM head's "
                                  "outputs)", "")
