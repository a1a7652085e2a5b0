"""The preference records of ``trl-padfree dpo``, ``reward`` and ``kto``: checked before the model loads; what TRL's
trainer drops, read from the trainer once built."""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

from ..config import ConfigError
from ..console import say
from ..data import check_kinds, load_splits, record_error, value_kind

__all__ = ["check_chat_renders", "check_kinds", "check_one_kind_in_files", "check_preference_records",
           "dropped_by_trainer", "load_checked", "prepared_by_trl", "value_kind"]

FIELDS = ("prompt", "chosen", "rejected")


def check_preference_records(dataset: Any, source: str) -> None:
    """Every record has ``chosen`` and ``rejected`` (and usually ``prompt``), all text or all chat messages."""
    columns = dataset.column_names
    if missing := [c for c in ("chosen", "rejected") if c not in columns]:
        raise ConfigError(f"{source}: preference records need 'chosen' and 'rejected' (and usually 'prompt'); missing "
                          f"{', '.join(map(repr, missing))} (columns: {', '.join(columns)})")
    fields = [c for c in FIELDS if c in columns]
    check_kinds(dataset.select_columns(fields), source, fields, ("chosen", "rejected"))


def check_one_kind_in_files(key: str, pattern: str) -> None:
    """:func:`check_kinds` on the records of JSON / JSON Lines files as written, before ``datasets`` coerces a mixed
    column (the text ``" 47"`` as the number 47); unreadable files are left to the loader's own error."""
    paths = sorted(glob.glob(os.path.expanduser(pattern))) or [os.path.expanduser(pattern)]
    if not all(path.endswith((".jsonl", ".json")) and os.path.isfile(path) for path in paths):
        return

    def records() -> Iterator[Any]:
        try:
            for path in paths:
                with open(path, encoding="utf-8") as handle:
                    if path.endswith(".jsonl"):
                        yield from (json.loads(line) for line in handle if line.strip())
                    elif isinstance(data := json.load(handle), list):
                        yield from data
        except (ValueError, UnicodeDecodeError):
            return  # not valid JSON: the loader says so in its own line

    check_kinds(records(), key, (*FIELDS, "completion"))


def check_chat_renders(dataset: Any, tokenizer: Any, source: str, index: Sequence[int]) -> None:
    """Each conversational record rendered by the chat template, so that one it cannot render is one line naming it
    (``index``: each record's index in its file) rather than an error of TRL's while the trainer tokenizes."""
    for position, record in enumerate(dataset):
        prompt = record["prompt"] if isinstance(record.get("prompt"), list) else []
        try:
            for name in ("chosen", "rejected", "completion"):
                if isinstance(record.get(name), list):
                    tokenizer.apply_chat_template([*prompt, *record[name]], tokenize=False, **_chat_kwargs(record))
        except Exception as exc:  # a chat template raises anything (jinja errors, raise_exception, ...)
            raise record_error(source, index[position], "format", exc) from None


def _chat_kwargs(record: dict[str, Any]) -> dict[str, Any]:
    """A record's chat template arguments as TRL's trainers pass them: ``tools`` (JSON text or not) and
    ``chat_template_kwargs``."""
    tools = record.get("tools")
    return {"tools": json.loads(tools) if isinstance(tools, str) else tools, **(record.get("chat_template_kwargs") or {})}


def prepared_by_trl(trainer_class: Any, dataset: Any, tokenizer: Any, training: Any) -> Any:
    """``dataset`` (or None) as TRL's ``trainer_class`` (``DPOTrainer``, ``KTOTrainer``, ``RewardTrainer``) prepares
    it when built, with TRL's public data functions: for ``preview``, which builds no trainer (tests/test_preview.py
    compares the two)."""
    import trl

    reward, kto = trainer_class.__name__ == "RewardTrainer", trainer_class.__name__ == "KTOTrainer"
    if dataset is None:
        return None
    if not reward and "prompt" not in dataset.column_names:
        dataset = dataset.map(trl.extract_prompt)
    if kto and "chosen" in dataset.column_names:
        dataset = trl.unpair_preference_dataset(dataset)
    responses = ("completion",) if kto else ("chosen", "rejected")

    def tokenize(record: dict[str, Any]) -> dict[str, list[int]]:
        chat = trl.is_conversational(record)

        def ids(value: Any, **more: Any) -> list[int]:
            if chat:
                return list(tokenizer.apply_chat_template(value, return_dict=True, **_chat_kwargs(record), **more)
                            ["input_ids"])
            return tokenizer(value)["input_ids"]

        prompt, eos = record.get("prompt", [] if chat else ""), tokenizer.eos_token
        full = {name: ids(prompt + record[name] if chat or record[name].endswith(eos) else prompt + record[name] + eos)
                for name in responses}
        if reward:
            return {f"{name}_ids": full[name] for name in responses}
        prompt_ids = ids(prompt, add_generation_prompt=True) if chat else ids(prompt)
        cut = min(len(os.path.commonprefix([prompt_ids, seq])) for seq in full.values())
        return {"prompt_ids": prompt_ids[:cut], **{f"{name}_ids": full[name][cut:] for name in responses}}

    dataset, limit = dataset.map(tokenize), training.max_length
    if limit is not None and reward:
        return dataset.filter(lambda r: len(r["chosen_ids"]) <= limit and len(r["rejected_ids"]) <= limit)
    if limit is not None and (kto or training.truncation_mode == "keep_start"):
        return dataset.filter(lambda r: len(r["prompt_ids"]) < limit)
    return dataset


def load_checked(cfg: Any, tokenizer: Any, check: Any) -> tuple[Any, Any | None, bool]:
    """``(train, eval or None, conversational)``: the splits, loaded and checked (``check(dataset, source)``)."""
    for key in ("train_file", "eval_file"):
        if getattr(cfg.launch, key, None):
            check_one_kind_in_files(key, getattr(cfg.launch, key))
    where: dict[str, Any] = {}
    splits = dict(zip(("train", "eval"), load_splits(cfg.launch, cfg.training.seed, check, where), strict=True))
    chat = {split: value_kind(data[0]["chosen" if "chosen" in data.column_names else "completion"]) == "messages"
            for split, data in splits.items() if data is not None}  # (each split of one kind: TRL's own rule)
    if any(chat.values()) and getattr(tokenizer, "chat_template", None) is None:
        raise ConfigError(f"the records are chat messages but the tokenizer of {cfg.model.model_name_or_path!r} has "
                          "no chat template; set chat_template_path to a .jinja file, or use text records")
    for split in [split for split, is_chat in chat.items() if is_chat]:
        check_chat_renders(splits[split], tokenizer, *where[split])
    return splits["train"], splits["eval"], chat["train"]


def dropped_by_trainer(cfg: Any, trainer: Any, data: Any, unit: str = "pairs", per_record: int = 1,
                       rule: str = "whose prompt alone has max_length={} tokens or more",
                       why: str = "no response token is left") -> None:
    """Say how many records of each split TRL's ``trainer`` (or a ``(train, eval)`` pair of datasets as it would
    prepare them) left out, ``rule`` saying which and ``why``, into ``data.dropped``; a split left empty is a
    :class:`ConfigError`. ``per_record``: 2 where KTO unpairs each pair."""
    rule = rule.format(cfg.training.max_length)
    kept = trainer if isinstance(trainer, tuple) else (trainer.train_dataset, trainer.eval_dataset)
    for split, before, after in zip(("train", "eval"), (data.train, data.eval), kept, strict=True):
        if before is None or after is None or not hasattr(after, "__len__"):
            continue
        loaded = len(before) * per_record
        data.dropped[split] = loaded - len(after)
        if len(after) == 0:
            source = f"{split}_file" if getattr(cfg.launch, f"{split}_file", None) else f"the {split} data"
            raise ConfigError(
                f"{source}: all {len(before)} {'training' if split == 'train' else 'eval'} {unit} would be dropped: TRL "
                f"drops one {rule} ({why}); raise max_length (or set max_length: null, no limit)")
        if data.dropped[split]:
            say(f"dropped {data.dropped[split]} of {loaded} {split} {unit if per_record == 1 else 'examples'} {rule} "
                f"({why}; TRL drops them)")
