"""The TRL and transformers versions this package supports.

Supported (``pyproject.toml``): ``trl>=1.16,<2`` with ``transformers>=5.23,<6``. ``make test`` runs the suite on
the newest releases, ``make test-lowest`` on the lowest pair (trl 1.16.0, transformers 5.23.0). trl 1.16 is the
first whose DPO, KTO, GRPO and RLOO trainers and fused LM head this package builds on; transformers 5.23 is the
first with ``activation_checkpointing`` (the name the configs, the example and the docs use;
``gradient_checkpointing`` is its deprecated alias there). What differs inside the window:

- transformers 5.23's falcon builds its mask without ``position_ids``: packed examples leak under sdpa/eager
  (``trl-padfree check`` says so; 5.24 keeps them apart).

The ``MIN_TRL_*`` floors below and their ``*_unavailable`` checks date from the older floor (trl 1.8); within this
window they always pass.
"""

from __future__ import annotations

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


MIN_TRL_DPO = "1.16"
"""Padding-free DPO (:class:`trl_padfree.DPOTrainer`) builds on TRL 1.16's ``DPOTrainer``: its fused LM head with
``shift_labels`` and per-token entropy / mean logits / top-1 outputs, and its list of loss types. Older TRL releases
train DPO only padded (``padding_free=False``: TRL's trainer unchanged)."""


def dpo_padding_free_unavailable() -> str | None:
    """One line naming the fix where the installed TRL cannot run padding-free DPO, else None.

    >>> dpo_padding_free_unavailable() is None or "upgrade trl" in dpo_padding_free_unavailable()
    True
    """
    if trl_at_least(MIN_TRL_DPO):
        return None
    return (f"padding-free DPO needs trl >= {MIN_TRL_DPO} (its DPOTrainer's fused LM head and loss types), and trl "
            f"{TRL_VERSION} is installed: upgrade trl (pip install -U 'trl>={MIN_TRL_DPO}') or set padding_free=False")


MIN_TRL_REWARD = "1.8"
"""Padding-free reward training (:class:`trl_padfree.RewardTrainer`) restates ``RewardTrainer.compute_loss`` (loss,
``margin``, ``center_rewards_coefficient``, metrics), the same from trl 1.8 to 1.16 except 1.16's division of the
token count by the tensor-parallel size; its tests pass on 1.8.0 and on the newest release."""


MIN_TRL_KTO = "1.16"
"""Padding-free KTO (:class:`trl_padfree.KTOTrainer`) builds on TRL 1.16's ``KTOTrainer`` (mainline there, with its
fused LM head taking ``shift_labels`` and returning per-token entropy and mean logits), checked exact against that
release only."""


MIN_TRL_RL = "1.16"
"""Padding-free GRPO/RLOO (:class:`trl_padfree.GRPOTrainer`, :class:`trl_padfree.RLOOTrainer`) replace TRL 1.16's
single log-prob method (``_get_per_token_logps_and_entropies``) and call its fused LM head with ``shift_labels``;
older TRL releases train GRPO/RLOO only padded (``padding_free=False``: TRL's trainers unchanged)."""


def rl_padding_free_unavailable() -> str | None:
    """One line naming the fix where the installed TRL cannot run padding-free GRPO/RLOO, else None.

    >>> rl_padding_free_unavailable() is None or "upgrade trl" in rl_padding_free_unavailable()
    True
    """
    if trl_at_least(MIN_TRL_RL):
        return None
    return (f"padding-free GRPO/RLOO needs trl >= {MIN_TRL_RL} (its trainers' single log-prob method and fused LM "
            f"head), and trl {TRL_VERSION} is installed: upgrade trl (pip install -U 'trl>={MIN_TRL_RL}') or set "
            "padding_free=False")
