"""SFT data for ``trl-padfree train`` and ``preview`` (:func:`prepare_data`), prepared once before training; the
datasets handed to ``SFTTrainer`` are final (TRL's own preparation is skipped, the training collator only flattens).
In order: :func:`check_records`, :func:`make_formatter` (a record -> one text), :func:`_tokenize` (``input_ids``,
``labels`` with the prompt masked; ``messages`` without templates: labels from the chat template),
:func:`check_template` (the response template in one of the first N examples, else the config is wrong),
:func:`_labeller` (truncation, the run's collator's labels; examples without a trained token dropped and counted).
Every failure on a record is one :class:`~..config.ConfigError` line naming the split, the record's index and the
fix (:func:`~..data.record_error`).
"""

from __future__ import annotations

import os
import string
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from ..config import ConfigError, LaunchConfig
from ..console import one_line, say
from ..data import load_splits, map_records, stage
from ..steps import Records

__all__ = ["PreparedData", "make_formatter", "prepare_data", "training_collator"]

IGNORE_INDEX = -100


def _collator(cfg: LaunchConfig, tokenizer: Any, response_template: str | None, padding_free: bool) -> Any:
    from trl_padfree.collator import DataCollatorForCompletionOnlyLM

    instruction = cfg.training.instruction_template if response_template is not None else None
    if instruction is not None and len(instruction) == 1:
        instruction = instruction[0]
    kwargs: dict[str, Any] = {"tokenizer": tokenizer, "padding_free": padding_free, "on_template_not_found": "ignore"}
    if isinstance(cfg.training.pad_to_multiple_of, int):  # padded and padding-free alike (its own segment)
        kwargs["pad_to_multiple_of"] = cfg.training.pad_to_multiple_of
    try:
        return DataCollatorForCompletionOnlyLM(response_template, instruction, **kwargs)
    except ValueError as exc:
        raise ConfigError(f"collator settings rejected: {one_line(exc)}") from None


def training_collator(cfg: LaunchConfig, tokenizer: Any) -> Any:
    """The collator ``SFTTrainer`` gets: the labels of :func:`prepare_data` as they are, batches flattened (or
    padded with ``padding_free: false``)."""
    return _collator(cfg, tokenizer, None, padding_free=cfg.padding_free)


@dataclass
class PreparedData(Records):
    """Tokenized, labelled datasets ready for ``SFTTrainer`` (columns ``input_ids`` and ``labels``)."""

    loaded: dict[str, int] = field(default_factory=dict)
    template_missing_in_check: int = 0
    checked: int = 0


def check_records(dataset: Any, source: str, template: str | None, text_field: str, response: str | None) -> None:
    """Refuse, naming the record: a null or missing field of the format (it would be trained as the text ``None``),
    an empty completion (with ``template``: a field after ``response``), a chat that leaves no assistant reply to
    train, a bare ``{field}`` of ``template`` holding lists or mappings (trained as their Python text).

    >>> from datasets import Dataset
    >>> turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    >>> check_records(Dataset.from_dict({"messages": [turns, turns[:1]]}), "train_file", None, "text", None)
    Traceback (most recent call last):
    ...
    trl_padfree.launch.config.ConfigError: train_file record 1 (counting from 0): its messages have no assistant turn, so nothing of it would be trained; add the assistant's reply or remove the record
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    columns, table = dataset.column_names, dataset.with_format("arrow")
    if template is not None:  # (a valid format string: prepare_data checked it)
        fields = [f for f in template_fields(template) if f in columns]
        at = template.find(response) if response else -1
        completion = template_fields(template[at + len(response):]) if at >= 0 and response else []
    elif text_field in columns:
        fields, completion = [text_field], []
    else:
        fields = next((list(k) for k in (("prompt", "completion"), ("messages",)) if set(k) <= set(columns)), [])
        completion = fields[-1:]

    def where(index: int) -> str:
        return f"{source} record {index} (counting from 0)"

    for name in fields:
        column, kind = table[name], table[name].type
        problems = [("is null or missing", pc.is_null(column))]
        if name in completion and (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            problems.append(("is empty", pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(column)), 0)))
        elif name in completion and (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
            problems.append(("is empty", pc.equal(pc.list_value_length(column), 0)))
        for what, mask in problems:
            bad = np.flatnonzero(pc.fill_null(mask, False).to_numpy(zero_copy_only=False))
            if len(bad):
                more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
                raise ConfigError(f"{where(bad[0])}: {name!r} {what}{more}; fill it in or remove the record")
    for index, messages in enumerate(dataset["messages"] if fields == ["messages"] else []):
        roles = [m.get("role") if isinstance(m, dict) else None for m in messages if isinstance(messages, list)]
        if roles and "assistant" not in roles:
            raise ConfigError(f"{where(index)}: its messages have no assistant turn, so nothing of it would be "
                              "trained; add the assistant's reply or remove the record")
        if roles and roles[-1] != "assistant":
            raise ConfigError(f"{where(index)}: its messages end in a {roles[-1]!r} turn that no assistant turn answers"
                              " (it would be forwarded but never trained); end the record with the assistant's reply "
                              "or drop the last turn")
    bare = {name for _, name, _, _ in string.Formatter().parse(template or "") if name and name.isidentifier()}
    for name in sorted(bare & set(columns)):  # ({field[0]} / {field.key} pick an element and are fine)
        nested = pa.types.is_nested(table[name].type)
        if not nested and not pa.types.is_string(table[name].type) and not pa.types.is_large_string(table[name].type):
            try:  # values of mixed types (datasets' Json feature): look at them
                nested = any(isinstance(v, (list, dict)) for v in dataset[name])
            except Exception:  # noqa: BLE001  (undecodable values are reported elsewhere)
                nested = False
        if nested:
            raise ConfigError(
                f"{source}: template field {{{name}}} holds lists or mappings, which would be trained as their Python "
                f"text; pick an element ({{{name}[0]}}, {{{name}.key}}) or make {name!r} text")


def template_fields(template: str) -> list[str]:
    """Names of the record fields a ``template`` (a ``str.format`` string) uses.

    >>> template_fields("### Question: {instruction}\\n### Answer: {output}")
    ['instruction', 'output']
    >>> template_fields("{a[0]} {b.x} {{literal}}")
    ['a', 'b']
    """
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigError(f"template {template!r} is not a valid format string ({exc}); write each field as "
                          "{name} with its closing brace, and literal braces as {{ and }}") from None
    names: list[str] = []
    for _, name, _, _ in parsed:
        if name is None:
            continue
        if name == "" or name.isdigit():
            raise ConfigError("template fields must be named, e.g. {instruction}; positional {} is not allowed")
        base = name.split(".", 1)[0].split("[", 1)[0]
        if base not in names:
            names.append(base)
    return names


#: A formatter maps one record to ``(text, prompt_text_or_None, rendered_by_chat_template)``.
Formatter = Callable[[dict[str, Any]], tuple[str, str | None, bool]]


def make_formatter(columns: Sequence[str], template: str | None, text_field: str, tokenizer: Any) -> tuple[str, Formatter]:
    """Pick how records become text: ``(format_name, formatter)``. Order: ``template`` if set; else the
    ``text_field`` column; else ``prompt`` + ``completion``; else ``messages`` (the tokenizer's chat template)."""
    columns = list(columns)

    def has_chat_template() -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError("the data has messages but the tokenizer has no chat template: set chat_template_path "
                              "to a .jinja file or use template to format the records")

    def chat_text(messages: Any, add_generation_prompt: bool = False) -> str:
        has_chat_template()
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def prompt_completion(record: dict[str, Any]) -> tuple[str, str | None, bool]:
        prompt, completion = record["prompt"], record["completion"]
        if isinstance(prompt, list) != isinstance(completion, list):
            raise TypeError("prompt and completion must both be lists of messages (TRL's conversational "
                            "prompt/completion) or both be text")
        if isinstance(prompt, list):  # conversational prompt/completion
            return chat_text(prompt + completion), chat_text(prompt, True), True
        return str(prompt) + str(completion), str(prompt), False

    if template is not None:
        missing = [name for name in template_fields(template) if name not in columns]
        if missing:
            raise ConfigError(f"template uses field(s) {', '.join(map(repr, missing))} that the data does not have; "
                              f"its fields are: {', '.join(columns)}")
        return "template", lambda record: (template.format(**record), None, False)
    if text_field in columns:
        return text_field, lambda record: (str(record[text_field]), None, False)
    if "prompt" in columns and "completion" in columns:
        return "prompt+completion", prompt_completion
    if "messages" in columns:
        has_chat_template()
        return "messages", lambda record: (chat_text(record["messages"]), None, True)
    raise ConfigError(
        f"cannot tell how to turn the data's fields ({', '.join(columns)}) into text: set template, e.g. "
        "'### Question: {instruction}\\n### Answer: {output}', or provide a text, prompt+completion or messages field"
    )


def _tokenize(tokenizer: Any, formatter: Formatter) -> Callable[[dict[str, list[Any]]], dict[str, list[Any]]]:
    """Batched ``datasets.map`` function: records -> ``input_ids`` + ``labels`` (prompt masked). Plain text gets the
    tokenizer's special tokens and an EOS at the end (as TRL does); text from a chat template already has them."""

    def encode(texts: list[str], chat: list[bool]) -> list[list[int]]:  # (at most two batched calls)
        out: list[list[int]] = [[] for _ in texts]
        for flag in (False, True):
            index = [i for i, c in enumerate(chat) if c is flag]
            encoded = tokenizer([texts[i] for i in index], add_special_tokens=not flag)["input_ids"] if index else []
            for i, ids in zip(index, encoded, strict=True):
                out[i] = list(ids)
        return out

    def tokenize(batch: dict[str, list[Any]]) -> dict[str, list[list[int]]]:
        with stage("format"):
            rows = [formatter(dict(zip(batch, values, strict=True))) for values in zip(*batch.values(), strict=True)]
        chat = [c for _, _, c in rows]
        with stage("tokenize"):
            input_ids = encode([t for t, _, _ in rows], chat)
            with_prompt = [i for i, (_, p, _) in enumerate(rows) if p is not None]
            prompt_of = dict(zip(with_prompt, encode([rows[i][1] for i in with_prompt], [chat[i] for i in with_prompt]),
                                 strict=True))
        labels = []
        for i, ids in enumerate(input_ids):
            if not chat[i] and tokenizer.eos_token_id is not None and (not ids or ids[-1] != tokenizer.eos_token_id):
                ids.append(tokenizer.eos_token_id)
            n = len(os.path.commonprefix([prompt_of[i], ids])) if i in prompt_of else 0
            labels.append([IGNORE_INDEX] * n + ids[n:])
        return {"input_ids": input_ids, "labels": labels}

    return tokenize


def warn_untrained_turns(raw: Any, tokenized: Any, labelled: Any, collator: Any, tokenizer: Any, n: int) -> int:
    """One line when the templates leave assistant turns of ``messages`` data untrained (first ``n`` examples of
    ``labelled``; ``raw`` and ``tokenized``: row for row the same records, as loaded and untruncated). A record that
    truncation shortened is judged on its untruncated labels (``collator``), as the templates label it. Returns
    the number of affected examples (0 also when the chat template cannot be analysed turn by turn)."""
    from ...chat_masks import untrained_assistant_turns

    count = min(n, len(raw))
    affected = turns = 0
    try:
        rows = zip(raw.select(range(count))["messages"], tokenized.select(range(count))["input_ids"],
                   labelled.select(range(count))["labels"], strict=True)
        for messages, ids, labels in rows:
            if len(labels) != len(ids):  # truncated: the untruncated labels
                labels = collator([{"input_ids": ids}])["labels"].reshape(-1).tolist()
            missing = untrained_assistant_turns(tokenizer, messages, ids, labels)
            affected += bool(missing)
            turns += missing
    except Exception:  # noqa: BLE001  (no turn-by-turn analysis, no warning; a record's errors came up in tokenizing)
        return 0
    if affected:
        say(f"warning: in {affected} of the first {count} examples, {turns} assistant turn(s) get no trained "
            "token from response_template/instruction_template (without instruction_template only the last "
            "assistant turn is trained); leave both unset to train every assistant turn from the chat template")
    return affected


def check_template(dataset: Any, collator: Any, tokenizer: Any, n: int, source: str, origin: Any) -> int:
    """Fail unless the response template occurs in one of the first ``n`` examples (untruncated); returns how many
    of them lack it (they will be dropped). ``origin``: the split as loaded, for a failing record's index."""
    head = dataset.select(range(min(n, len(dataset))))

    def find(batch: dict[str, list[Any]]) -> dict[str, list[bool]]:
        return {"found": collator.templates_found([{"input_ids": ids} for ids in batch["input_ids"]]).tolist()}

    found = map_records(head, find, "label", source, origin=origin, keep_in_memory=True,
                        remove_columns=head.column_names)["found"]
    if not any(found):
        raise ConfigError(
            f"response_template {collator.response_template!r} was found in none of the first {len(head)} examples "
            f"(the first one starts {tokenizer.decode(head[0]['input_ids'][:60])!r}); make it match the formatted text "
            "exactly (spaces, newlines, case)")
    return len(found) - sum(found)


def _labeller(collator: Any, max_length: int | None, keep_end: bool) -> Callable[[dict[str, list[Any]]], dict]:
    """Batched ``datasets.map`` function: truncate, label with ``collator`` (the only time labels are made) and
    flag the examples left with a trained token (``trained``)."""

    def cut(seq: list[int]) -> list[int]:
        if max_length is None or len(seq) <= max_length:
            return list(seq)
        return list(seq[-max_length:] if keep_end else seq[:max_length])

    def label(batch: dict[str, list[list[int]]]) -> dict[str, list[Any]]:
        ids, labels = [cut(x) for x in batch["input_ids"]], [cut(x) for x in batch["labels"]]
        out = collator([{"input_ids": i, "labels": lab} for i, lab in zip(ids, labels, strict=True)])
        flat, cu = out["labels"].reshape(-1).numpy(), out["cu_seq_lens_q"].numpy()
        new = [flat[cu[k] : cu[k + 1]] for k in range(len(ids))]
        return {"input_ids": ids, "labels": [lab.tolist() for lab in new],
                "trained": [bool(np.any(lab != IGNORE_INDEX)) for lab in new]}

    return label


def _missing_template(text_format: str) -> ConfigError:
    """The one refusal of a missing ``response_template`` (only prompt/completion and messages data do without)."""
    only = "" if text_format == "template" else (" (only prompt/completion and messages data can do without it; this "
                                                 f"data is formatted as {text_format!r})")
    return ConfigError(f"response_template is missing: set the text that precedes every completion, e.g. "
                       f"'### Answer:'{only}")


def prepare_data(cfg: LaunchConfig, tokenizer: Any, collator: Any = None) -> PreparedData:
    """Run the whole pipeline (see the module docstring) with ``collator`` (default: the run's, with its templates);
    raises :class:`ConfigError` on bad data."""
    from ...chat_masks import label_chats

    training, template = cfg.training, cfg.launch.template
    response, text_field = training.response_template, training.dataset_text_field
    if template is not None:
        template_fields(template)  # a template that is not a format string: refused before any data is read
        if response is None:
            raise _missing_template("template")
    if collator is None:  # the run's collator with its templates labels the records once, here
        collator = _collator(cfg, tokenizer, response, padding_free=True)
    sources: list[str] = []  # the split names as load_splits reports them: train first, then eval

    def check(dataset: Any, source: str) -> None:
        sources.append(source)
        check_records(dataset, source, template, text_field, response)

    train_raw, eval_raw = load_splits(cfg.launch, training.seed, check)
    text_format, formatter = make_formatter(train_raw.column_names, template, text_field, tokenizer)
    if response is None and text_format not in ("prompt+completion", "messages"):
        raise _missing_template(text_format)
    chat = text_format == "messages" and response is None  # labels from the chat template, every assistant turn
    if eval_raw is not None:
        missing = sorted(set(train_raw.column_names) - set(eval_raw.column_names))
        if text_format != "template" and missing:
            raise ConfigError(f"the eval data lacks field(s) {', '.join(missing)} that the training data has")
        make_formatter(eval_raw.column_names, template, text_field, tokenizer)
    splits = {"train": (train_raw, sources[0]), "eval": (eval_raw, sources[-1])}  # (eval_fraction: one source)
    tokenized = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # token-count warnings of long texts; truncation is ours
        for name, (raw, source) in splits.items():
            if raw is not None:
                fn = partial(label_chats, tokenizer=tokenizer) if chat else _tokenize(tokenizer, formatter)
                out = map_records(raw, fn, "chat" if chat else "format", source, None if chat else template,
                                  remove_columns=raw.column_names, desc=f"Tokenizing {name} data")
                tokenized[name] = out.remove_columns("completion_mask") if chat else out
    n_check, missing_in_check = cfg.launch.template_check_examples, 0
    if response is not None:  # (prompt/completion without it: the prompt is masked already)
        missing_in_check = check_template(tokenized["train"], collator, tokenizer, n_check, sources[0], train_raw)
    data = PreparedData(None, None, text_format, template_missing_in_check=missing_in_check,
                        checked=min(n_check, len(tokenized["train"])))
    label = _labeller(collator, training.max_length, training.truncation_mode == "keep_end")
    for name, tok in tokenized.items():
        raw, source = splits[name]
        labelled = map_records(tok, label, "label", source, origin=raw, desc=f"Labelling {name} data")
        if name == "train" and response is not None and text_format == "messages":
            warn_untrained_turns(train_raw, tok, labelled, collator, tokenizer, n_check)
        kept = labelled.filter(lambda flags: flags, input_columns="trained", batched=True,
                               desc=f"Filtering {name} data").remove_columns("trained")
        data.dropped[name] = len(labelled) - len(kept)
        data.loaded[name] = len(raw)
        setattr(data, name, kept)
        if len(kept) == 0 and name == "train":
            raise ConfigError(f"no training example has a trained token left (response template missing, or every "
                              f"completion cut off by max_length={training.max_length}); check response_template "
                              "and max_length")
        if len(kept) == 0:
            raise ConfigError("no eval example has a trained token left; check the eval data and max_length")
    return data
