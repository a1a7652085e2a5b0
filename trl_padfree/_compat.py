"""The TRL and transformers versions this package supports.

Supported (``pyproject.toml``): ``trl>=1.16,<2`` with ``transformers>=5.23,<5.26``. ``make test`` runs the suite on
the newest releases, ``make test-lowest`` on the lowest pair (trl 1.16.0, transformers 5.23.0). trl 1.16 is the
first whose DPO, KTO, GRPO and RLOO trainers and fused LM head this package builds on; transformers 5.23 is the
first with ``activation_checkpointing`` (the name the configs, the example and the docs use;
``gradient_checkpointing`` is its deprecated alias there). What differs inside the window:

- transformers 5.23's falcon builds its mask without ``position_ids``: packed examples leak under sdpa/eager
  (``trl-padfree check`` says so; 5.24 keeps them apart).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from importlib.metadata import version

from packaging.version import Version

MIN_TRL = "1.16"
MIN_TRANSFORMERS = "5.23"

TRL_VERSION = Version(version("trl"))
TRANSFORMERS_VERSION = Version(version("transformers"))


@contextlib.contextmanager
def quiet_gradient_checkpointing_warning() -> Iterator[None]:
    """Inside the block, transformers' FutureWarning that ``is_gradient_checkpointing`` is deprecated is not shown:
    TRL's DPO helper and generation and peft's model wrapping still read it, and no setting avoids it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield
