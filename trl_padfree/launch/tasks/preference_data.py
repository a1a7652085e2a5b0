"""The preference records of ``trl-padfree dpo``, also read by ``reward`` and ``kto``: their checks, before the model
loads, record by record and in the files, and their prompts tokenized as TRL's ``DPOTrainer`` tokenizes them.

- :func:`check_preference_records`: ``chosen`` / ``rejected`` (and ``prompt``) in every record, all of one kind;
- :func:`check_one_kind_in_files`: JSON / JSON Lines files whose records mix plain text and chat messages are
  refused, naming the mix (``datasets`` would load such a column as whatever pandas makes of it: the text ``" 47"``
  as the number 47, messages as text, or fail inside TRL);
- :func:`tokenized_prompts`: every pair tokenized as TRL's ``DPOTrainer`` tokenizes it (its ``_tokenize`` and
  ``common_prefix_length``; implicit prompts extracted as TRL does), so that a chat template that cannot render a
  record is one line naming the record, and the pairs TRL drops under ``truncation_mode: keep_start`` (a prompt of
  ``max_length`` tokens or more leaves no response token) are counted; a split left empty is refused with the
  count and the setting to change (:func:`check_truncation`).
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Sequence
from typing import Any

from ..config import ConfigError

__all__ = [
    "check_one_kind_in_files",
    "check_preference_records",
    "check_truncation",
    "mixed_kinds_error",
    "tokenized_prompts",
    "value_kind",
]

FIELDS = ("prompt", "chosen", "rejected")
_WORDS = {"text": "plain text", "messages": "chat messages (conversational)"}


def value_kind(value: Any) -> str | None:
    """``"text"``, ``"messages"`` (a list of ``{"role", "content"}`` dicts) or None (anything else).

    >>> value_kind(" 47"), value_kind([{"role": "user", "content": "hi"}]), value_kind(47)
    ('text', 'messages', None)
    """
    if isinstance(value, str):
        return "text"
    if isinstance(value, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
        return "messages"
    return None


def mixed_kinds_error(source: str, index: int, name: str, kind: str, first_index: int, first_kind: str) -> ConfigError:
    """The one line for a record of another kind than the first record's."""
    return ConfigError(
        f"{source} record {index} (counting from 0): {name!r} is {_WORDS[kind]}, but in record {first_index} it is "
        f"{_WORDS[first_kind]}: the data mixes plain-text and conversational pairs, which TRL tokenizes differently "
        "(EOS only on text); use one kind: convert the records of one kind, or put them in separate files and runs"
    )


def check_preference_records(dataset: Any, source: str) -> None:
    """Every record has ``chosen`` and ``rejected`` (and ``prompt`` when the responses do not hold it), all of one
    kind: text, or lists of chat messages. A bad record is a :class:`ConfigError` naming it and the fix."""
    columns = list(dataset.column_names)
    missing = [c for c in ("chosen", "rejected") if c not in columns]
    if missing:
        raise ConfigError(
            f"{source}: preference records need 'chosen' and 'rejected' (and usually 'prompt'); missing "
            f"{', '.join(repr(m) for m in missing)} (columns: {', '.join(columns)})"
        )
    fields = [c for c in ("prompt", "chosen", "rejected") if c in columns]
    first: tuple[int, str] | None = None
    for index, record in enumerate(dataset.select_columns(fields)):
        kinds = set()
        for name in fields:
            value = record[name]
            kind = value_kind(value)
            if kind is None:
                raise ConfigError(
                    f"{source} record {index} (counting from 0): {name!r} must be a string or a list of chat "
                    f"messages ({{'role', 'content'}}), got {type(value).__name__}; fix the record"
                )
            if first is None:
                first = (index, kind)
            elif kind != first[1] and first[0] != index:
                raise mixed_kinds_error(source, index, name, kind, *first)
            kinds.add(kind)
            if not value and name != "prompt":
                raise ConfigError(f"{source} record {index} (counting from 0): {name!r} is empty; drop the record "
                                  "or fill it in")
        if len(kinds) > 1:
            raise ConfigError(
                f"{source} record {index} (counting from 0): mixes text and chat messages across "
                f"{', '.join(fields)}; use one kind"
            )


def _json_type(value: Any) -> str:
    """The JSON name of ``value``'s type: ``null``, ``number``, ``object``, ... (a list that is not of messages:
    ``a list of something else``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, dict):
        return "an object"
    return "a list of something else than messages"


def _records(path: str) -> Any:
    with open(path, encoding="utf-8") as handle:
        if path.endswith(".jsonl"):
            for line in handle:
                if line.strip():
                    yield json.loads(line)
        else:
            data = json.load(handle)
            yield from (data if isinstance(data, list) else [])


def check_one_kind_in_files(key: str, pattern: str) -> None:
    """Refuse JSON / JSON Lines files (``pattern``, as ``train_file``) whose records mix text and chat messages, or
    hold anything else in ``prompt`` / ``chosen`` / ``rejected``.

    Read with the ``json`` module, before ``datasets`` coerces a mixed column. Files of other formats hold one type
    per column and are checked record by record after loading (:func:`check_preference_records`).
    Unreadable files are left to the loader's own error.
    """
    paths = sorted(glob.glob(os.path.expanduser(pattern))) or [os.path.expanduser(pattern)]
    first: tuple[int, str] | None = None
    index = 0
    for path in paths:
        if not path.endswith((".jsonl", ".json")) or not os.path.isfile(path):
            return
        try:
            for record in _records(path):
                if isinstance(record, dict):
                    for name in FIELDS:
                        if name not in record:
                            continue
                        kind = value_kind(record[name])
                        if kind is None:
                            raise ConfigError(
                                f"{key} record {index} (counting from 0): {name!r} must be a string or a list of "
                                f"chat messages ({{'role', 'content'}}), got {_json_type(record[name])}; fix the "
                                "record"
                            )
                        if first is None:
                            first = (index, kind)
                        elif kind != first[1]:
                            raise mixed_kinds_error(key, index, name, kind, *first)
                index += 1
        except (ValueError, UnicodeDecodeError) as exc:
            if isinstance(exc, ConfigError):
                raise
            return  # not valid JSON: the loader says so in its own line


def _trl_tokenization() -> Any:
    try:
        from trl.data_utils import _tokenize, common_prefix_length, extract_prompt
    except ImportError:  # an older TRL without these helpers: the pre-check is skipped (TRL still tokenizes)
        return None
    return _tokenize, common_prefix_length, extract_prompt


def tokenized_prompts(dataset: Any, tokenizer: Any, source: str, max_length: int | None) -> list[int] | None:
    """The prompt length (tokens) of every pair as TRL's ``DPOTrainer`` tokenizes it (None: TRL too old to tell).

    Plain-text pairs: the prompts are tokenized in one batch; only a pair whose prompt has ``max_length`` tokens or
    more is tokenized with its responses (TRL keeps ``prompt_ids`` up to where prompt and prompt + response
    diverge), so the lengths are TRL's from ``max_length`` up (where they decide what is dropped) and, below it, an
    upper bound of TRL's. Conversational pairs are rendered with the chat template, each; a record the template cannot render
    is a :class:`ConfigError` naming it (:func:`~..data.record_error`).
    """
    helpers = _trl_tokenization()
    if helpers is None:
        return None
    _tokenize, common_prefix_length, extract_prompt = helpers
    from ..data import file_index, record_error

    eos = tokenizer.eos_token or ""
    has_prompt = "prompt" in dataset.column_names

    def example_of(record: dict[str, Any]) -> dict[str, Any]:
        return record if has_prompt else {**record, **extract_prompt(record)}

    def full_prompt_len(example: dict[str, Any], prompt_ids: Sequence[int], kwargs: dict[str, Any]) -> int:
        lengths = []
        for name in ("chosen", "rejected"):
            response = example[name]
            if isinstance(response, str) and not response.endswith(eos):
                response += eos
            full = _tokenize(tokenizer, example["prompt"] + response, **kwargs)["input_ids"]
            lengths.append(common_prefix_length(list(prompt_ids), list(full)))
        return min(lengths)

    def chat_kwargs(record: dict[str, Any]) -> dict[str, Any]:
        tools = record.get("tools")
        tools = json.loads(tools) if isinstance(tools, str) else tools
        return {"tools": tools, **(record.get("chat_template_kwargs") or {})}

    first = dataset[0]
    conversational = value_kind(first["chosen"]) == "messages"
    lengths: list[int] = []
    if not conversational:
        prompts = [example_of(r)["prompt"] for r in dataset] if not has_prompt else list(dataset["prompt"])
        ids = tokenizer(text=prompts)["input_ids"]
        for position, prompt_ids in enumerate(ids):
            length = len(prompt_ids)
            if max_length is not None and length >= max_length:
                length = full_prompt_len(example_of(dataset[position]), prompt_ids, {})
            lengths.append(length)
        return lengths
    for position, record in enumerate(dataset):
        try:
            example = example_of(record)
            kwargs = chat_kwargs(record)
            prompt_ids = _tokenize(tokenizer, example["prompt"], add_generation_prompt=True, **kwargs)["input_ids"]
            lengths.append(full_prompt_len(example, prompt_ids, kwargs))
        except ConfigError:
            raise
        except Exception as exc:  # a chat template raises anything (jinja errors, raise_exception, ...)
            raise record_error(source, file_index(dataset, position), "format", exc) from None
    return lengths


def check_truncation(lengths: list[int] | None, source: str, what: str, max_length: int | None,
                     truncation_mode: str) -> int:
    """How many pairs TRL drops (``keep_start``: the prompt alone has ``max_length`` tokens or more); a split left
    empty raises a :class:`ConfigError` with the count and the settings to change.

    >>> check_truncation([3, 9, 12], "train_file", "training", 10, "keep_start")
    1
    >>> check_truncation([12, 14], "train_file", "training", 2, "keep_start")
    Traceback (most recent call last):
    ...
    trl_padfree.launch.config.ConfigError: train_file: all 2 training pairs would be dropped: ...
    """
    if lengths is None or max_length is None or truncation_mode != "keep_start":
        return 0
    dropped = sum(length >= max_length for length in lengths)
    if dropped == len(lengths):
        raise ConfigError(
            f"{source}: all {dropped} {what} pairs would be dropped: with truncation_mode keep_start (the default) "
            f"a pair whose prompt alone has max_length={max_length} tokens or more has no response token left, and "
            f"TRL drops it (the shortest prompt has {min(lengths)} tokens); raise max_length above {min(lengths)} "
            "(or set max_length: null, no truncation)"
        )
    return dropped
