"""``trl-padfree train --help``: the options grouped by what they set, with this launcher's defaults and texts.

The parser (:func:`~.config.build_parser`, which installs this help) is TRL's flat ``TrlParser`` over five dataclasses; its own help is
hundreds of ungrouped lines in dataclass order, and several of TRL's texts are wrong for this launcher (it applies
padding-free itself, decides activation checkpointing, threads and bf16 by machine). :func:`grouped_help` formats
the same actions in :data:`GROUPS` order (model, data, formatting, collator, launcher, training) and replaces those
texts (:data:`HELP_TEXTS`); everything else is the libraries' own help with its default.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["GROUPS", "HELP_TEXTS", "group_of", "grouped_help", "install_help"]

#: Section titles, in the order they are printed.
GROUPS: dict[str, str] = {
    "model": "model (TRL ModelConfig: which model, how it is loaded, LoRA)",
    "data": "data (where the records come from)",
    "formatting": "formatting (how a record becomes the tokens of one example)",
    "collator": "collator (trl_padfree.DataCollatorForCompletionOnlyLM: what is trained, padding-free batches)",
    "launcher": "launcher (pre-flight checks and run-time settings of trl-padfree train)",
    "training": "training (TRL SFTConfig / transformers TrainingArguments)",
}

_FORMATTING = frozenset({
    "template", "dataset_text_field", "chat_template_path", "eos_token", "pad_token", "max_length",
    "truncation_mode",
})  # fmt: skip
_COLLATOR_EXTRA = frozenset({"padding_free", "pad_to_multiple_of"})
_MODEL_EXTRA = frozenset({"trust_remote_code", "model_init_kwargs"})
#: Listed first in their section (the rest follow in the libraries' order).
_FIRST = (
    "model_name_or_path", "dtype", "attn_implementation", "use_peft", "template", "output_dir", "max_steps",
    "num_train_epochs", "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate",
)  # fmt: skip

#: This launcher's texts for options whose library text or default is wrong or misleading here.
HELP_TEXTS: dict[str, str] = {
    "padding_free": "Flatten each mini-batch into one row without padding (this project's collator does it, with "
    "position_ids and sequence boundaries for varlen attention; any attention that passes the packing probe "
    "works, not only FlashAttention). TRL's own padding_free is always turned off, since TRL refuses a custom "
    "collator with it. (default: true)",
    "attn_implementation": "auto (default): flash_attention_2 where flash-attn is usable on a CUDA GPU, else "
    "'padfree' (varlen attention on any device); a model that cannot use padfree falls back to its own attention "
    "and the packing probe decides. Or name one: padfree, sdpa, eager, flash_attention_2. (default: auto)",
    "bf16": "bf16 mixed precision. (default: true where a GPU supports bfloat16, else false; TRL's default, true, "
    "would refuse to start on a CPU-only machine)",
    "activation_checkpointing": "Recompute activations in the backward pass: less memory, ~20-30%% more time. "
    "(default: on for CUDA with a large model, >= 1e9 parameters; off on CPU and for smaller models)",
    "gradient_checkpointing": "Deprecated alias of --activation_checkpointing (transformers warns when it is "
    "used); this launcher does not turn it on by default as TRL does. (default: unset)",
    "gradient_checkpointing_kwargs": "Deprecated alias of --activation_checkpointing_kwargs. (default: unset)",
    "torch_num_threads": "CPU threads of torch during the run. (default: on CPU one per 256 units of the model's "
    "hidden size, at most the cores per process; on CUDA the cores per process; OMP_NUM_THREADS is respected)",
    "dataloader_pin_memory": "Pin data-loader memory for copies to a GPU. (default: true; false when training on "
    "the CPU)",
    "disable_tqdm": "No progress bars. (default: false on a terminal; true when stdout or stderr is not a "
    "terminal, where the Trainer prints one line per logging step instead)",
    "packing": "Not supported here (TRL's offline packing changes the optimizer steps); padding_free already "
    "removes the padding. (default: false)",
    "assistant_only_loss": "Not used here: the collator trains what follows response_template (and, for "
    "multi-turn data, every assistant turn with instruction_template). (default: false)",
    "completion_only_loss": "Not used here: the launcher labels the data itself (prompt/completion data: the "
    "completion is trained). (default: unset)",
    "dataset_kwargs": "Set by the launcher (skip_prepare_dataset: the data is tokenized and labelled before "
    "SFTTrainer sees it). (default: unset)",
}


def group_of(dest: str, sections: Mapping[str, str]) -> str:
    """The :data:`GROUPS` key of a config field; ``sections``: the key of each field by the dataclass that holds it
    (:func:`~.config.field_sections`), "training" for the rest.

    >>> from trl_padfree.launch.config import field_sections
    >>> s = field_sections()
    >>> group_of("model_name_or_path", s), group_of("train_file", s), group_of("template", s), group_of("padding_free", s)
    ('model', 'data', 'formatting', 'collator')
    >>> group_of("torch_num_threads", s), group_of("learning_rate", s)
    ('launcher', 'training')
    """
    if dest in _FORMATTING:
        return "formatting"
    if dest in _COLLATOR_EXTRA:
        return "collator"
    if dest in _MODEL_EXTRA:
        return "model"
    return sections.get(dest, "training")


def _default_text(action: argparse.Action) -> str:
    default = action.default
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return str(default).lower()
    return str(getattr(default, "value", default))


class _Formatter(argparse.HelpFormatter):
    """One option spelling (``--name``) and a short metavar; help texts as given (defaults added by the caller)."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=34, width=110)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        name = action.option_strings[0]
        if action.nargs == 0:
            return name
        if action.choices is not None:
            values = [str(getattr(c, "value", c)) for c in action.choices]
            return f"{name} {{{','.join(values)}}}" if len(",".join(values)) <= 40 else f"{name} CHOICE"
        if action.metavar:
            return f"{name} {action.metavar}"
        if action.nargs == "?" and action.const is True or getattr(action.type, "__name__", "") == "string_to_bool":
            return f"{name} [BOOL]"
        return f"{name} VALUE" if action.nargs in (None, "?") else f"{name} VALUE [VALUE ...]"


def _with_help(action: argparse.Action, texts: Mapping[str, str] = HELP_TEXTS) -> argparse.Action:
    """A copy of ``action`` whose help is this launcher's text, or the library's text plus its default."""
    copy = argparse.Action(option_strings=action.option_strings, dest=action.dest, nargs=action.nargs,
                           const=action.const, default=action.default, type=action.type, choices=action.choices,
                           help=action.help)
    if action.dest in texts:
        copy.help = texts[action.dest]
    else:
        text = " ".join((action.help or "").split())
        copy.help = f"{text} (default: {_default_text(action).replace('%', '%%')})".strip()
    return copy


def _listed(actions: Iterable[argparse.Action]) -> list[argparse.Action]:
    """The options worth a line: not --help, not the ``--no_x`` twins of boolean options."""
    return [
        a for a in actions
        if a.option_strings and a.dest != "help" and a.help != argparse.SUPPRESS
        and not a.option_strings[0].startswith("--no_")
    ]


def grouped_help(parser: Any, sections: Mapping[str, str]) -> str:
    """The whole ``--help`` text of the launcher's parser, in :data:`GROUPS` sections (``sections``: see
    :func:`group_of`)."""
    formatter = _Formatter(parser.prog)
    formatter.add_usage(parser.usage, [], [])
    formatter.add_text(
        f"{parser.description} Every option is also a YAML key (--learning_rate 1e-4 = learning_rate: 1.0e-4); "
        "both spellings work (--model_name_or_path, --model-name-or-path); booleans take true/false (or --no_x)."
    )
    # a parser may replace texts and section titles (trl-padfree dpo: launch.config.build_parser)
    texts = {**HELP_TEXTS, **getattr(parser, "help_texts", {})}
    groups = {**GROUPS, **getattr(parser, "help_groups", {})}
    by_group: dict[str, list[argparse.Action]] = {key: [] for key in groups}
    first = {dest: i for i, dest in enumerate(_FIRST)}
    for action in sorted(_listed(parser._actions), key=lambda a: first.get(a.dest, len(first))):  # stable
        by_group[group_of(action.dest, sections)].append(_with_help(action, texts))
    formatter.start_section("options")
    formatter.add_arguments([
        argparse.Action(["--config"], "config", metavar="FILE", help="YAML file of any of the options below (plus an optional "
                        "`env` mapping of environment variables); command-line values override it"),
        argparse.Action(["-h"], "help", nargs=0, help="show this help and exit"),
    ])
    formatter.end_section()
    for key, title in groups.items():
        formatter.start_section(title)
        formatter.add_arguments(by_group[key])
        formatter.end_section()
    return formatter.format_help()


def install_help(parser: Any, sections: Mapping[str, str]) -> Any:
    """Make ``parser`` print :func:`grouped_help` for ``-h``/``--help``; returns the parser."""
    parser.format_help = lambda: grouped_help(parser, sections)
    return parser
