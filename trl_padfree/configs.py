"""This package's settings as fields of TRL's config classes: ``SFTConfig``, ``DPOConfig``, ``GRPOConfig``,
``RLOOConfig``, ``RewardConfig``, ``KTOConfig``.

Each is TRL's dataclass of the same name with the package's fields added (``padding_free`` where TRL has none,
``prompt_once``, ``scored_lm_head``, ``check_packing``, ``torch_num_threads``; for SFT also the collator's templates
and the token budget), typed and documented as TRL's fields are, so ``trl.TrlParser`` reads them from a YAML file
(``--config``) or the command line like any other field. This package's trainers read them from ``args``; their
former keyword arguments of the same names still work for one release, with a ``DeprecationWarning`` naming the
config field (:func:`trainer_settings`).

    >>> from trl_padfree import DPOConfig
    >>> cpu = {"output_dir": "out", "report_to": "none", "bf16": False}  # (TRL's bf16=True needs a GPU)
    >>> config = DPOConfig(padding_free=True, prompt_once=True, **cpu)
    >>> config.prompt_once, config.check_packing, config.torch_num_threads, config.scored_lm_head
    (True, True, 'auto', True)
    >>> DPOConfig(prompt_once=True, **cpu)
    Traceback (most recent call last):
    ...
    ValueError: DPOConfig(prompt_once=True) needs padding_free=True (the prompt is shared inside a padding-free row): set padding_free=True, or prompt_once=False

``SFTConfig.padding_free`` is this package's: True flattens every mini-batch with
:class:`~trl_padfree.DataCollatorForCompletionOnlyLM` (built by :class:`trl_padfree.SFTTrainer` from
``response_template`` / ``instruction_template`` when no ``data_collator`` is passed); TRL's own padding-free mode,
which refuses any custom collator, is off while this package's trainer builds TRL's. (The stock ``trl.SFTTrainer``
given this config would read ``padding_free`` as its own mode and ignore the package's fields: use
:class:`trl_padfree.SFTTrainer`.)
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any

import trl

__all__ = [
    "DPOConfig", "GRPOConfig", "KTOConfig", "PADFREE_CONFIGS", "RLOOConfig", "RewardConfig", "SFTConfig", "UNSET",
    "checked_setting", "trainer_keywords", "trainer_settings",
]  # fmt: skip


class _Unset:
    """The default of a deprecated trainer keyword: not passed (the value then comes from ``args``)."""

    def __repr__(self) -> str:
        return "<from args>"


#: A trainer keyword that was not passed.
UNSET: Any = _Unset()

_NULL_WORDS = frozenset({"none", "null", "~"})


def checked_setting(owner: str, name: str, value: Any) -> Any:
    """A setting of this package given to ``owner`` (a config or trainer), checked; text from YAML or the command
    line read as the value it spells. A bad value is a ``ValueError`` naming the fix."""
    if name == "torch_num_threads":
        if isinstance(value, str) and value != "auto":
            text = value.strip()
            value = None if text.lower() in _NULL_WORDS else int(text) if text.isdigit() else value
        if value is not None and value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"torch_num_threads must be 'auto', a positive integer or None, got {value!r}")
        return value
    if name == "max_tokens_per_batch":
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{owner}(max_tokens_per_batch={value!r}): give a positive number of real tokens per "
                             "mini-batch, or None for per_device_train_batch_size examples")
        return value
    if not isinstance(value, bool):
        raise ValueError(f"{owner}({name}={value!r}): {name} must be True or False, got {value!r}")
    return value


def _validate(config: Any) -> None:
    """The checks every config of this package runs in ``__post_init__`` (one line naming the fix)."""
    name = type(config).__name__
    for setting in ("padding_free", "prompt_once", "check_packing", "scored_lm_head", "torch_num_threads",
                    "max_tokens_per_batch"):
        if hasattr(config, setting):
            setattr(config, setting, checked_setting(name, setting, getattr(config, setting)))
    if getattr(config, "prompt_once", False) and not config.padding_free:
        raise ValueError(f"{name}(prompt_once=True) needs padding_free=True (the prompt is shared inside a "
                         "padding-free row): set padding_free=True, or prompt_once=False")


@dataclass
class _PadfreeFields:
    """The fields every config of this package adds to TRL's, declared once (a dataclass mixin before TRL's class)."""

    padding_free: bool = field(
        default=False,
        metadata={"help": "Run the trainer's forwards on flat rows without padding (needs a varlen attention such "
                          "as attn_implementation='padfree'). (default: false)"},
    )
    check_packing: bool = field(
        default=True,
        metadata={"help": "Probe the model once before the first step (trl_padfree.probe): stop the run if packed "
                          "sequences see each other under its attention. (default: true)"},
    )
    torch_num_threads: int | str | None = field(
        default="auto",
        metadata={"help": "torch CPU threads during train(): 'auto' (the count trl_padfree.threads picks unless "
                          "OMP_NUM_THREADS, MKL_NUM_THREADS or torch.set_num_threads chose one), a positive "
                          "integer, or null for torch's own choice. (default: auto)"},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        _validate(self)


def _scored_lm_head() -> Any:
    return field(
        default=True,
        metadata={"help": "Score the loss with the scored-positions LM head (trl_padfree.scored_head: only the "
                          "scored positions are projected, on every device); false: TRL's own LM head. "
                          "(default: true)"},
    )


@dataclass
class _PromptOnceFields(_PadfreeFields):
    """The trainers whose examples share a prompt (a pair's, a group's): ``prompt_once`` (not SFT's)."""

    prompt_once: bool = field(
        default=False,
        metadata={"help": "With padding_free, forward each prompt (a pair's or group's shared prefix) once "
                          "(needs attn_implementation='padfree'). (default: false)"},
    )


@dataclass
class _ScoredHeadFields(_PromptOnceFields):
    scored_lm_head: bool = _scored_lm_head()


@dataclass
class SFTConfig(_PadfreeFields, trl.SFTConfig):
    """``trl.SFTConfig`` with the settings of :class:`trl_padfree.SFTTrainer` and its collator.

    ``padding_free`` here is this package's (see the module docstring).

    >>> cpu = {"output_dir": "out", "report_to": "none", "bf16": False}
    >>> config = SFTConfig(padding_free=True, response_template="### Answer:", **cpu)
    >>> config.padding_free, config.response_template, config.max_tokens_per_batch
    (True, '### Answer:', None)
    >>> SFTConfig(max_tokens_per_batch=0, **cpu)
    Traceback (most recent call last):
    ...
    ValueError: SFTConfig(max_tokens_per_batch=0): give a positive number of real tokens per mini-batch, or None for per_device_train_batch_size examples
    """

    scored_lm_head: bool = _scored_lm_head()
    padding_free: bool = field(
        default=False,
        metadata={"help": "Flatten every mini-batch into one row without padding with this package's collator "
                          "(trl_padfree.DataCollatorForCompletionOnlyLM, built by trl_padfree.SFTTrainer from "
                          "response_template when no data_collator is passed), run with a varlen attention "
                          "(attn_implementation='padfree'). Not TRL's own padding-free mode. (default: false)"},
    )
    response_template: str | None = field(
        default=None,
        metadata={"help": "Text that precedes every completion, e.g. '### Answer:': tokens up to it are not "
                          "trained (the collator trl_padfree.SFTTrainer builds). (default: null)"},
    )
    instruction_template: list[str] | None = field(
        default=None,
        metadata={"help": "Multi-turn data: the text (or several) that starts every non-assistant turn, e.g. "
                          "'### Question:'; every assistant turn is then trained. (default: null)"},
    )
    max_tokens_per_batch: int | None = field(
        default=None,
        metadata={"help": "Token-budget batching: each training mini-batch of a rank holds as many whole examples "
                          "as fit this many real tokens (trl_padfree.TokenBudgetBatchSampler), instead of "
                          "per_device_train_batch_size examples. (default: null, fixed-size batches)"},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.instruction_template, str):
            self.instruction_template = [self.instruction_template]
        if self.padding_free and self.packing:
            raise ValueError("SFTConfig(padding_free=True, packing=True): padding_free flattens each mini-batch with "
                             "this package's collator, which TRL's packing refuses; set packing=False (same examples, "
                             "same steps, no padding)")


@dataclass
class DPOConfig(_ScoredHeadFields, trl.DPOConfig):
    """``trl.DPOConfig`` with the settings of :class:`trl_padfree.DPOTrainer` (TRL 1.16 ignores ``padding_free``;
    this trainer honours it)."""


@dataclass
class GRPOConfig(_ScoredHeadFields, trl.GRPOConfig):
    """``trl.GRPOConfig`` with the settings of :class:`trl_padfree.GRPOTrainer`."""


@dataclass
class RLOOConfig(_ScoredHeadFields, trl.RLOOConfig):
    """``trl.RLOOConfig`` with the settings of :class:`trl_padfree.RLOOTrainer`."""


@dataclass
class RewardConfig(_PromptOnceFields, trl.RewardConfig):
    """``trl.RewardConfig`` with the settings of :class:`trl_padfree.RewardTrainer` (a sequence classifier: no
    LM head, so no ``scored_lm_head``)."""


@dataclass
class KTOConfig(_ScoredHeadFields, trl.KTOConfig):
    """``trl.KTOConfig`` with the settings of :class:`trl_padfree.KTOTrainer`."""


#: This package's config class of each of its trainers, by trainer name.
PADFREE_CONFIGS: dict[str, type] = {
    c.__name__.replace("Config", "Trainer"): c for c in (SFTConfig, DPOConfig, GRPOConfig, RLOOConfig, RewardConfig,
                                                         KTOConfig)}


def _caller_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside this module and the trainers' ``__init__`` chain: the line
    that built the trainer (a user's script: Python shows the warning there; the package's own launch: hidden)."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename == __file__
                                 or frame.f_code.co_name in ("__init__", "_padfree_settings")):
        frame, level = frame.f_back, level + 1
    return level


def trainer_keywords(trainer: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the deprecated keywords of ``trainer`` (its config's fields of the same names) out of ``kwargs``, for
    :func:`trainer_settings` (:data:`UNSET` where not passed)."""
    fields = {f.name for f in dataclasses.fields(PADFREE_CONFIGS[trainer])}
    names = ("prompt_once", "check_packing", "torch_num_threads", "scored_lm_head", "max_tokens_per_batch")
    return {name: kwargs.pop(name, UNSET) for name in names if name in fields}


def trainer_settings(trainer: str, args: Any, **given: Any) -> dict[str, Any]:
    """The package's settings of ``trainer`` (e.g. ``"DPOTrainer"``): each from ``args`` where it is this package's
    config (else the field's default), or from the deprecated trainer keyword in ``given`` (:data:`UNSET`: not
    passed), which warns, naming the config field.

    A keyword that contradicts a value the config was given (not its default) is a ``ValueError`` naming both.

    >>> cpu = {"output_dir": "out", "report_to": "none", "bf16": False}
    >>> trainer_settings("DPOTrainer", DPOConfig(padding_free=True, prompt_once=True, **cpu),
    ...                  prompt_once=UNSET, check_packing=UNSET)
    {'prompt_once': True, 'check_packing': True}
    >>> trainer_settings("DPOTrainer", DPOConfig(check_packing=False, **cpu), check_packing=True)
    Traceback (most recent call last):
    ...
    ValueError: DPOTrainer(check_packing=True) conflicts with DPOConfig(check_packing=False): set check_packing once, in DPOConfig (the trainer keyword is deprecated)
    """
    config_class = PADFREE_CONFIGS[trainer]
    defaults = {f.name: f.default for f in dataclasses.fields(config_class)}
    own = isinstance(args, config_class)
    settings: dict[str, Any] = {}
    for name, keyword in given.items():
        value = getattr(args, name) if own else defaults[name]
        if keyword is not UNSET:
            warnings.warn(
                f"{trainer}({name}=...) is deprecated and will be removed in the next release: set {name} in "
                f"trl_padfree.{config_class.__name__}({name}=...) and pass it as args",
                DeprecationWarning, stacklevel=_caller_stacklevel())
            keyword = checked_setting(trainer, name, keyword)
            if own and value != defaults[name] and value != keyword:
                raise ValueError(f"{trainer}({name}={keyword!r}) conflicts with {config_class.__name__}({name}="
                                 f"{value!r}): set {name} once, in {config_class.__name__} (the trainer keyword "
                                 "is deprecated)")
            value = keyword
        settings[name] = value
    return settings
