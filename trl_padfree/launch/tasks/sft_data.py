"""SFT data for ``trl-padfree train`` and ``preview`` (:func:`prepare_data`), prepared once and handed to
``SFTTrainer`` final: records checked, made text, tokenized with the prompt masked (``messages`` without templates:
labels from the chat template), truncated and labelled by the run's collator, examples without a trained token dropped.
"""

from __future__ import annotations

import contextlib
import os
import string
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from ...exception_text import one_line
from ..config import ConfigError, LaunchConfig
from ..console import say
from ..data import check_kinds, load_splits, map_records
from ..steps import Records

__all__ = ["PreparedData", "make_formatter", "prepare_data", "training_collator"]

IGNORE_INDEX = -100


def training_collator(cfg: LaunchConfig, tokenizer: Any, labelling: bool = False) -> Any:
    """``SFTTrainer``'s collator: the labels of :func:`prepare_data` as they are, batches flattened (or padded);
    ``labelling``: the padding-free one with the run's templates that makes those labels."""
    from trl_padfree.collator import DataCollatorForCompletionOnlyLM

    response = cfg.training.response_template if labelling else None
    instruction = cfg.training.instruction_template if response is not None else None
    try:  # (pad_to_multiple_of: padded and padding-free alike, the padding a segment of its own)
        return DataCollatorForCompletionOnlyLM(response, instruction, tokenizer=tokenizer, on_template_not_found="ignore",
                                               padding_free=labelling or cfg.padding_free,
                                               pad_to_multiple_of=cfg.training.pad_to_multiple_of)
    except ValueError as exc:
        raise ConfigError(f"collator settings rejected: {one_line(exc)}") from None


@dataclass
class PreparedData(Records):
    """Tokenized, labelled datasets ready for ``SFTTrainer`` (columns ``input_ids`` and ``labels``)."""

    loaded: dict[str, int] = field(default_factory=dict)
    template_missing_in_check: int = 0
    checked: int = 0


def check_records(dataset: Any, source: str, template: str | None, text_field: str, response: str | None) -> None:
    """Refuse, naming the record: a null or missing field of the format (it would be trained as the text ``None``),
    an empty completion (with ``template``: a field after ``response``), a chat that leaves no assistant reply to
    train, prompt/completion records of both kinds, a bare ``{field}`` of ``template`` holding lists or mappings."""
    columns = dataset.column_names
    if template is not None:  # (a valid format string: prepare_data checked it)
        fields = [f for f in template_fields(template) if f in columns]
        at = template.find(response) if response else -1
        completion = template_fields(template[at + len(response):]) if at >= 0 and response else []
    elif text_field in columns:
        fields, completion = [text_field], []
    else:
        fields = next((list(k) for k in (("prompt", "completion"), ("messages",)) if set(k) <= set(columns)), [])
        completion = fields[-1:]

    def problem(record: dict[str, Any]) -> tuple[str, str] | None:
        for name, value in record.items():
            if value is None or (name in completion and isinstance(value, (str, list)) and not
                                 (value.strip() if isinstance(value, str) else value)):
                return f"{name!r} is {'null or missing' if value is None else 'empty'}", "fill it in or remove the record"
        messages = record.get("messages") if fields == ["messages"] else None
        roles = [m.get("role") if isinstance(m, dict) else None for m in messages] if isinstance(messages, list) else []
        if roles and "assistant" not in roles:
            return ("its messages have no assistant turn, so nothing of it would be trained", "add the assistant's "
                    "reply or remove the record")
        if roles and roles[-1] != "assistant":
            return (f"its messages end in a {roles[-1]!r} turn that no assistant turn answers (it would be forwarded "
                    "but never trained)", "end the record with the assistant's reply or drop the last turn")
        return None

    def records() -> Iterator[dict[str, Any]]:  # (in batches: a large dataset is not held as Python objects)
        for batch in dataset.select_columns(fields).iter(batch_size=4096):
            yield from ({f: batch[f][k] for f in fields} for k in range(len(batch[fields[0]])))

    bare = {name for _, name, _, _ in string.Formatter().parse(template or "") if name and name.isidentifier()}
    bad, nested = [], set()  # ({field[0]} / {field.key} pick an element of a field's lists or mappings, and are fine)
    for index, record in enumerate(records() if fields else []):
        if what := problem(record):
            bad.append((index, what))
        nested |= {name for name in bare & record.keys() if isinstance(record[name], (list, dict))}
    if bad:
        (index, (what, fix)), more = bad[0], f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise ConfigError(f"{source} record {index} (counting from 0): {what}{more}; {fix}")
    if template is None and fields == ["prompt", "completion"]:  # all text, or all chat messages (as TRL's)
        check_kinds(records(), source, fields)
    if nested:
        name = sorted(nested)[0]
        raise ConfigError(f"{source}: template field {{{name}}} holds lists or mappings, which would be trained as "
                          f"their Python text; pick an element ({{{name}[0]}}, {{{name}.key}}) or make {name!r} text")


def template_fields(template: str) -> list[str]:
    """Names of the record fields a ``template`` (a ``str.format`` string) uses.

    >>> template_fields("### Question: {instruction}\\n### Answer: {output}")
    ['instruction', 'output']
    >>> template_fields("{a[0]} {b.x} {{literal}}")
    ['a', 'b']
    """
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise ConfigError(f"template {template!r} is not a valid format string ({exc}); write each field as "
                          "{name} with its closing brace, and literal braces as {{ and }}") from None
    if any(name == "" or name.isdigit() for name in names):
        raise ConfigError("template fields must be named, e.g. {instruction}; positional {} is not allowed")
    return list(dict.fromkeys(name.split(".", 1)[0].split("[", 1)[0] for name in names))


#: A formatter maps one record to ``(text, prompt_text_or_None, rendered_by_chat_template)``.
Formatter = Callable[[dict[str, Any]], tuple[str, str | None, bool]]
_NO_CHAT_TEMPLATE = ("the data has messages but the tokenizer has no chat template: set chat_template_path to a .jinja "
                     "file or use template to format the records")


def make_formatter(columns: Sequence[str], template: str | None, text_field: str, tokenizer: Any) -> tuple[str, Formatter]:
    """How records become text, ``(format_name, formatter)``: ``template`` if set; else the ``text_field`` column;
    else ``prompt`` + ``completion``; else ``messages`` (the tokenizer's chat template)."""

    def chat_text(messages: Any, add_generation_prompt: bool = False) -> str:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(_NO_CHAT_TEMPLATE)
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def prompt_completion(record: dict[str, Any]) -> tuple[str, str | None, bool]:
        prompt, completion = record["prompt"], record["completion"]  # (of one kind: check_records)
        if isinstance(prompt, list):  # conversational prompt/completion
            return chat_text(prompt + completion), chat_text(prompt, True), True
        return str(prompt) + str(completion), str(prompt), False

    if template is not None:
        if missing := [name for name in template_fields(template) if name not in columns]:
            raise ConfigError(f"template uses field(s) {', '.join(map(repr, missing))} that the data does not have; "
                              f"its fields are: {', '.join(columns)}")
        return "template", lambda record: (template.format(**record), None, False)
    if text_field in columns:
        return text_field, lambda record: (str(record[text_field]), None, False)
    if "prompt" in columns and "completion" in columns:
        return "prompt+completion", prompt_completion
    if "messages" in columns and not getattr(tokenizer, "chat_template", None):
        raise ConfigError(_NO_CHAT_TEMPLATE)
    if "messages" in columns:
        return "messages", lambda record: (chat_text(record["messages"]), None, True)
    raise ConfigError(
        f"cannot tell how to turn the data's fields ({', '.join(columns)}) into text: set template, e.g. "
        "'### Question: {instruction}\\n### Answer: {output}', or provide a text, prompt+completion or messages field"
        + ("; these are preference pairs: train them with trl-padfree dpo or reward (preview: --task dpo)"
           if {"chosen", "rejected"} <= set(columns) else ""))


def _tokenize(tokenizer: Any, formatter: Formatter) -> list[tuple[str, Callable]]:
    """:func:`~..data.map_records`' steps from records to ``input_ids`` + ``labels`` (the prompt masked). Plain text
    gets the tokenizer's special tokens and an EOS at the end (as TRL does); a chat template's text has them."""
    eos = tokenizer.eos_token_id

    def format_texts(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return {"rows": [formatter(dict(zip(batch, values, strict=True))) for values in zip(*batch.values(), strict=True)]}

    def tokenize(formatted: dict[str, list[Any]]) -> dict[str, list[list[int]]]:
        texts, prompts, chat = zip(*formatted["rows"], strict=True)
        special = not chat[0]  # (all records of a dataset are of one kind: check_records)
        encode = partial(tokenizer, add_special_tokens=special, verbose=False)  # (no warning of long texts: we truncate)
        input_ids = [list(ids) for ids in encode(list(texts))["input_ids"]]
        prompt_ids = encode(list(prompts))["input_ids"] if prompts[0] is not None else []
        labels = []
        for i, ids in enumerate(input_ids):
            if special and eos is not None and (not ids or ids[-1] != eos):
                ids.append(eos)
            n = len(os.path.commonprefix([prompt_ids[i], ids])) if prompt_ids else 0
            labels.append([IGNORE_INDEX] * n + ids[n:])
        return {"input_ids": input_ids, "labels": labels}

    return [("format", format_texts), ("tokenize", tokenize)]


def check_templates(tokenized: Any, collator: Any, tokenizer: Any, n: int, chats: Any = None) -> int:
    """Fail unless the response template occurs in one of the first ``n`` examples (untruncated); returns how many
    of them lack it (they will be dropped). ``chats``: the ``messages`` records as loaded, if they are, to say in one
    line when the templates leave assistant turns untrained (not when the chat template cannot be analysed)."""
    from ...chat_masks import untrained_assistant_turns

    head = [list(ids) for ids in tokenized.select(range(min(n, len(tokenized))))["input_ids"]]
    found = collator.templates_found([{"input_ids": ids} for ids in head]).tolist()  # (the tokenizer's ids: no error)
    if not any(found):
        raise ConfigError(
            f"response_template {collator.response_template!r} was found in none of the first {len(head)} examples "
            f"(the first one starts {tokenizer.decode(head[0][:60])!r}); make it match the formatted text "
            "exactly (spaces, newlines, case)")
    missing: list[int] = []
    with contextlib.suppress(Exception):  # (no turn-by-turn analysis, no warning; a record's errors came up before)
        if chats is not None:
            out = collator([{"input_ids": ids} for ids in head])
            flat, cu = out["labels"].reshape(-1).tolist(), out["cu_seq_lens_q"].tolist()
            chat_head = chats.select(range(len(head)))["messages"]
            missing = [untrained_assistant_turns(tokenizer, messages, head[k], flat[cu[k] : cu[k + 1]])
                       for k, messages in enumerate(chat_head)]
    if any(missing):
        say(f"warning: in {sum(map(bool, missing))} of the first {len(head)} examples, {sum(missing)} assistant "
            "turn(s) get no trained token from response_template/instruction_template (without instruction_template "
            "only the last assistant turn is trained); leave both unset to train every assistant turn from the chat "
            "template")
    return len(found) - sum(found)


def _labeller(collator: Any, max_length: int | None, keep_end: bool) -> Callable[[dict[str, list[Any]]], dict]:
    """Batched: truncate, label with ``collator`` (labels are made only here), flag examples with a trained token."""

    def cut(seq: list[int]) -> list[int]:  # (a slice of a shorter sequence is all of it)
        return list(seq if max_length is None else seq[-max_length:] if keep_end else seq[:max_length])

    def label(batch: dict[str, list[list[int]]]) -> dict[str, list[Any]]:
        ids, labels = [cut(x) for x in batch["input_ids"]], [cut(x) for x in batch["labels"]]
        out = collator([{"input_ids": i, "labels": lab} for i, lab in zip(ids, labels, strict=True)])
        flat, cu = out["labels"].reshape(-1).numpy(), out["cu_seq_lens_q"].numpy()
        new = [flat[cu[k] : cu[k + 1]] for k in range(len(ids))]
        return {"input_ids": ids, "labels": [lab.tolist() for lab in new],
                "trained": [bool(np.any(lab != IGNORE_INDEX)) for lab in new]}

    return label


def prepare_data(cfg: LaunchConfig, tokenizer: Any, collator: Any = None) -> PreparedData:
    """The whole pipeline (see the module docstring) with ``collator`` (default: the run's, with its templates)."""
    from ...chat_masks import label_chats

    training, template = cfg.training, cfg.launch.template
    response, text_field = training.response_template, training.dataset_text_field
    if template is not None:
        template_fields(template)  # a template that is not a format string: refused before any data is read
    if collator is None:  # the run's collator with its templates labels the records once, here
        collator = training_collator(cfg, tokenizer, labelling=True)
    where: dict[str, tuple[str, Sequence[int]]] = {}  # each split's source and its records' indices in the files
    check = partial(check_records, template=template, text_field=text_field, response=response)
    raw = dict(zip(("train", "eval"), load_splits(cfg.launch, training.seed, check, where), strict=True))
    text_format, formatter = make_formatter(raw["train"].column_names, template, text_field, tokenizer)
    if response is None and text_format not in ("prompt+completion", "messages"):
        only = "" if text_format == "template" else (" (only prompt/completion and messages data can do without it; "
                                                     f"this data is formatted as {text_format!r})")
        raise ConfigError(f"response_template is missing: set the text that precedes every completion, e.g. "
                          f"'### Answer:'{only}")
    needed = template_fields(template) if template is not None else raw["train"].column_names
    if raw["eval"] is not None and (missing := sorted(set(needed) - set(raw["eval"].column_names))):
        raise ConfigError(f"the eval data lacks field(s) {', '.join(missing)} that the training data has")
    chat = text_format == "messages" and response is None  # labels from the chat template, every assistant turn
    steps = [("format", partial(label_chats, tokenizer=tokenizer))] if chat else _tokenize(tokenizer, formatter)
    tokenized = {name: map_records(split, steps, *where[name], template=None if chat else template,
                                   remove_columns=split.column_names, desc=f"Tokenizing {name} data")
                 .select_columns(["input_ids", "labels"]) for name, split in raw.items() if split is not None}
    n_check = cfg.launch.template_check_examples
    data = PreparedData(None, None, text_format, checked=min(n_check, len(tokenized["train"])))
    if response is not None:  # (prompt/completion without it: the prompt is masked already)
        chats = raw["train"] if text_format == "messages" else None
        data.template_missing_in_check = check_templates(tokenized["train"], collator, tokenizer, n_check, chats)
    label = _labeller(collator, training.max_length, training.truncation_mode == "keep_end")
    for name, tok in tokenized.items():
        labelled = map_records(tok, [("label", label)], *where[name], desc=f"Labelling {name} data")
        kept = labelled.filter(lambda flags: flags, input_columns="trained", batched=True,
                               desc=f"Filtering {name} data").remove_columns("trained")
        data.dropped[name], data.loaded[name] = len(labelled) - len(kept), len(tok)
        setattr(data, name, kept)
        if len(kept) == 0:
            raise ConfigError(
                f"no training example has a trained token left (response template missing, or every completion cut "
                f"off by max_length={training.max_length}); check response_template and max_length" if name == "train"
                else "no eval example has a trained token left; check the eval data and max_length")
    return data
