"""SFT data for ``trl-padfree train`` and ``preview``: format into text, tokenize, label once, drop the untrainable.

The pipeline (:func:`prepare_data`), run once before training on the splits :func:`~..data.load_splits` loads (the
datasets handed to ``SFTTrainer`` are final: TRL's own preparation is skipped, and the training collator only
flattens the labels made here, :func:`training_collator`):

1. :func:`check_records` / :func:`check_template_values`: per split as loaded, no null field, no empty
   completion, no list or mapping formatted as its Python text.
2. :func:`make_formatter`: each record becomes one text, from ``template`` (a format string over the record's
   fields) or the record's own ``text`` / ``prompt`` + ``completion`` / ``messages`` (chat template); the one
   check that a ``response_template`` is there where the format needs one.
3. :class:`_Tokenize`: ``input_ids`` (EOS appended to plain text, like TRL) and ``labels`` (the prompt
   already masked for prompt/completion records). ``messages`` data without response/instruction templates:
   labels from the chat template itself (every assistant turn trained).
4. :func:`check_template`: the response template must occur in at least one of the first N examples, otherwise
   the config is wrong (a typo, a missing newline...) and the run stops before loading the model.
5. :func:`label_and_filter`: truncation to ``max_length`` and the labels of the run's one labelling collator
   (:func:`labelling_collator`), computed here once (only the untrained-turn check below labels a truncated record
   of its sample again, untruncated); examples left without a single trained token are dropped and counted. For ``messages`` data,
   :func:`warn_untrained_turns` says in one line when the templates leave assistant turns untrained.

Every failure on a record in steps 2-5 is a one-line :class:`~..config.ConfigError` naming the split, the record's
index and the fix (:func:`~..data.record_error`). A ``template`` that is not a valid format string is refused before
any data is loaded.
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
from ..data import PerRecord, RecordFailed, file_index, load_splits, map_records, record_error, stage

__all__ = ["PreparedData", "labelling_collator", "make_formatter", "prepare_data", "training_collator"]

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


def labelling_collator(cfg: LaunchConfig, tokenizer: Any) -> Any:
    """The run's collator with its templates: labels the records once, before training (a template it cannot use
    is a one-line :class:`~.config.ConfigError`)."""
    return _collator(cfg, tokenizer, cfg.training.response_template, padding_free=True)


def training_collator(cfg: LaunchConfig, tokenizer: Any) -> Any:
    """The collator ``SFTTrainer`` gets: the labels of :func:`prepare_data` as they are, batches flattened (or
    padded with ``padding_free: false``)."""
    return _collator(cfg, tokenizer, None, padding_free=cfg.padding_free)


@dataclass
class PreparedData:
    """Tokenized, labelled datasets ready for ``SFTTrainer`` (columns ``input_ids`` and ``labels``)."""

    train: Any  # datasets.Dataset
    eval: Any | None
    text_format: str
    dropped: dict[str, int] = field(default_factory=dict)
    loaded: dict[str, int] = field(default_factory=dict)
    template_missing_in_check: int = 0
    checked: int = 0


def required_fields(columns: Sequence[str], template: str | None, text_field: str,
                    response_template: str | None) -> tuple[list[str], list[str]]:
    """``(fields that must not be null, completion fields that must not be empty)`` for the data's format.

    The format is chosen as :func:`make_formatter` chooses it; the completion fields of a ``template`` are those
    placed after ``response_template`` in it.

    >>> required_fields(["instruction", "output"], "Q: {instruction}\\nA: {output}", "text", "A:")
    (['instruction', 'output'], ['output'])
    >>> required_fields(["prompt", "completion"], None, "text", None)
    (['prompt', 'completion'], ['completion'])
    """
    columns = list(columns)
    if template is not None:
        try:
            fields = [f for f in template_fields(template) if f in columns]
            at = template.find(response_template) if response_template else -1
            after = template_fields(template[at + len(response_template):]) if at >= 0 and response_template else []
        except ConfigError:
            return [], []
        return fields, [f for f in after if f in fields]
    if text_field in columns:
        return [text_field], []
    if "prompt" in columns and "completion" in columns:
        return ["prompt", "completion"], ["completion"]
    if "messages" in columns:
        return ["messages"], ["messages"]
    return [], []


def check_template_values(dataset: Any, source: str, template: str) -> None:
    """Refuse a ``{field}`` of the template whose values are lists or mappings: they would be formatted as their
    Python repr (``{'a': 1}``) and trained. ``{field[0]}`` / ``{field.key}`` pick an element and are fine.
    """
    import pyarrow as pa

    bare = {name for _, name, _, _ in string.Formatter().parse(template) if name and name.isidentifier()}
    table = dataset.with_format("arrow")
    for name in sorted(bare & set(dataset.column_names)):
        column = table[name]
        nested = pa.types.is_nested(column.type)
        if not nested and not pa.types.is_string(column.type) and not pa.types.is_large_string(column.type):
            try:  # values of mixed types (datasets' Json feature): look at them
                nested = any(isinstance(v, (list, dict)) for v in dataset[name])
            except Exception:  # noqa: BLE001  (undecodable values are reported elsewhere)
                nested = False
        if nested:
            raise ConfigError(
                f"{source}: template field {{{name}}} holds lists or mappings, which would be trained as their Python "
                f"text; pick an element ({{{name}[0]}}, {{{name}.key}}) or make {name!r} text"
            )


def check_records(dataset: Any, source: str, fields: Sequence[str], completion_fields: Sequence[str]) -> None:
    """Refuse records whose ``fields`` are null or missing, or whose completion is empty (with the record's index).

    A null would otherwise be formatted as the text ``None`` and trained.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    table = dataset.with_format("arrow")
    for name in fields:
        column = table[name]
        problems = [("is null or missing", pc.is_null(column))]
        if name in completion_fields:
            if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                problems.append(("is empty", pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(column)), 0)))
            elif pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
                problems.append(("is empty", pc.equal(pc.list_value_length(column), 0)))
        for what, mask in problems:
            bad = np.flatnonzero(pc.fill_null(mask, False).to_numpy(zero_copy_only=False))
            if len(bad):
                more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
                raise ConfigError(
                    f"{source} record {bad[0]} (counting from 0): {name!r} {what}{more}; fill it in or remove the "
                    "record"
                )


def check_chat_turns(dataset: Any, source: str) -> None:
    """Refuse a ``messages`` record that has no assistant turn, or whose last turn is not the assistant's: nothing
    of it (or nothing after its last reply) could be trained, and the record would be dropped as if its completion
    had been cut off.

    >>> from datasets import Dataset
    >>> turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    >>> check_chat_turns(Dataset.from_dict({"messages": [turns, turns[:1]]}), "train_file")
    Traceback (most recent call last):
    ...
    trl_padfree.launch.config.ConfigError: train_file record 1 (counting from 0): its messages have no assistant turn, so nothing of it would be trained; add the assistant's reply or remove the record
    """
    for index, messages in enumerate(dataset["messages"]):
        if not isinstance(messages, list) or not messages:
            continue  # (null and empty records are refused by check_records, other shapes by the formatter)
        roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
        where = f"{source} record {index} (counting from 0)"
        if "assistant" not in roles:
            raise ConfigError(f"{where}: its messages have no assistant turn, so nothing of it would be trained; add "
                              "the assistant's reply or remove the record")
        if roles[-1] != "assistant":
            raise ConfigError(f"{where}: its messages end in a {roles[-1]!r} turn that no assistant turn answers (it "
                              "would be forwarded but never trained); end the record with the assistant's reply or "
                              "drop the last turn")


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


def _chat_text(tokenizer: Any, messages: Any, add_generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def make_formatter(columns: Sequence[str], template: str | None, text_field: str, tokenizer: Any) -> tuple[str, Formatter]:
    """Pick how records become text: ``(format_name, formatter)``.

    Order: ``template`` if set; else the ``text_field`` column; else ``prompt`` + ``completion``; else
    ``messages`` (rendered with the tokenizer's chat template).
    """
    columns = list(columns)
    if template is not None:
        missing = [name for name in template_fields(template) if name not in columns]
        if missing:
            raise ConfigError(
                f"template uses field(s) {', '.join(map(repr, missing))} that the data does not have; its fields "
                f"are: {', '.join(columns)}"
            )
        return "template", lambda record: (template.format(**record), None, False)
    if text_field in columns:
        return text_field, lambda record: (str(record[text_field]), None, False)
    if "prompt" in columns and "completion" in columns:

        def prompt_completion(record: dict[str, Any]) -> tuple[str, str | None, bool]:
            prompt, completion = record["prompt"], record["completion"]
            if isinstance(prompt, list) != isinstance(completion, list):
                raise TypeError("prompt and completion must both be lists of messages (TRL's conversational "
                                "prompt/completion) or both be text")
            if isinstance(prompt, list):  # conversational prompt/completion
                _require_chat_template(tokenizer)
                return _chat_text(tokenizer, prompt + completion), _chat_text(tokenizer, prompt, True), True
            return str(prompt) + str(completion), str(prompt), False

        return "prompt+completion", prompt_completion
    if "messages" in columns:
        _require_chat_template(tokenizer)
        return "messages", lambda record: (_chat_text(tokenizer, record["messages"]), None, True)
    raise ConfigError(
        f"cannot tell how to turn the data's fields ({', '.join(columns)}) into text: set template, e.g. "
        "'### Question: {instruction}\\n### Answer: {output}', or provide a text, prompt+completion or messages field"
    )


def _require_chat_template(tokenizer: Any) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            "the data has messages but the tokenizer has no chat template: set chat_template_path to a .jinja file "
            "or use template to format the records"
        )


class _Tokenize:
    """Batched ``datasets.map`` function: records -> ``input_ids`` + ``labels`` (prompt pre-masked).

    Plain text gets the tokenizer's special tokens and an EOS at the end (as TRL does); text rendered by a chat
    template already has them.
    """

    def __init__(self, tokenizer: Any, formatter: Formatter) -> None:
        self.tokenizer = tokenizer
        self.formatter = formatter
        self.eos = tokenizer.eos_token_id

    def _encode(self, texts: list[str], chat: list[bool]) -> list[list[int]]:
        """Tokenize in (at most two) batched calls: chat-rendered texts without added special tokens."""
        out: list[list[int]] = [[] for _ in texts]
        for flag in (False, True):
            index = [i for i, c in enumerate(chat) if c is flag]
            if index:
                encoded = self.tokenizer([texts[i] for i in index], add_special_tokens=not flag)["input_ids"]
                for i, ids in zip(index, encoded, strict=True):
                    out[i] = list(ids)
        return out

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[list[int]]]:
        keys = list(batch)
        with stage("format"):
            rows = [self.formatter(dict(zip(keys, values, strict=True))) for values in zip(*batch.values(), strict=True)]
        chat = [c for _, _, c in rows]
        with stage("tokenize"):
            input_ids = self._encode([t for t, _, _ in rows], chat)
            with_prompt = [i for i, (_, p, _) in enumerate(rows) if p is not None]
            prompt_ids = self._encode([rows[i][1] for i in with_prompt], [chat[i] for i in with_prompt])
        prompt_of = dict(zip(with_prompt, prompt_ids, strict=True))
        labels = []
        for i, ids in enumerate(input_ids):
            if not chat[i] and self.eos is not None and (not ids or ids[-1] != self.eos):
                ids.append(self.eos)
            lab = list(ids)
            if i in prompt_of:
                n = len(os.path.commonprefix([prompt_of[i], ids]))
                lab[:n] = [IGNORE_INDEX] * n
            labels.append(lab)
        return {"input_ids": input_ids, "labels": labels}


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


def check_template(dataset: Any, collator: Any, tokenizer: Any, n: int, source: str = "train",
                   origin: Any = None) -> int:
    """Fail unless the response template occurs in at least one of the first ``n`` examples (untruncated): the
    one check that it is found. Returns how many of those examples lack it (they will be dropped, see
    :func:`label_and_filter`); a record the collator fails on raises :func:`~.data.record_error`.
    """
    head = dataset.select(range(min(n, len(dataset))))
    search = PerRecord(lambda batch: {"found": collator.templates_found([{"input_ids": i} for i in batch["input_ids"]])},
                        "label")
    missing = 0
    for start in range(0, len(head), 64):
        part = head[start : start + 64]["input_ids"]
        try:
            missing += int(np.count_nonzero(~search({"input_ids": part}, list(range(start, start + len(part))))["found"]))
        except RecordFailed as failed:
            index = file_index(dataset if origin is None else origin, failed.position)
            raise record_error(source, index, failed.stage, failed.error) from None
    if missing == len(head):
        first = tokenizer.decode(head[0]["input_ids"][:60])
        raise ConfigError(
            f"response_template {collator.response_template!r} was found in none of the first {len(head)} examples "
            f"(the first one starts {first!r}); make it match the formatted text exactly (spaces, newlines, case)"
        )
    return missing


class _Label:
    """Batched ``datasets.map`` function: truncate, then label with the collator (the only time labels are made)."""

    def __init__(self, collator: Any, max_length: int | None, keep_end: bool) -> None:
        self.collator = collator
        self.max_length = max_length
        self.keep_end = keep_end

    def _cut(self, seq: list[int]) -> list[int]:
        if self.max_length is None or len(seq) <= self.max_length:
            return seq
        return seq[-self.max_length :] if self.keep_end else seq[: self.max_length]

    def __call__(self, batch: dict[str, list[list[int]]]) -> dict[str, list[Any]]:
        ids = [self._cut(list(x)) for x in batch["input_ids"]]
        labels = [self._cut(list(x)) for x in batch["labels"]]
        out = self.collator([{"input_ids": i, "labels": lab} for i, lab in zip(ids, labels, strict=True)])
        flat, cu = out["labels"].reshape(-1).numpy(), out["cu_seq_lens_q"].numpy()
        new_labels = [flat[cu[k] : cu[k + 1]] for k in range(len(ids))]
        return {"input_ids": ids, "labels": [lab.tolist() for lab in new_labels],
                "trained": [bool(np.any(lab != IGNORE_INDEX)) for lab in new_labels]}


def label_and_filter(dataset: Any, collator: Any, max_length: int | None, keep_end: bool, name: str,
                     source: str | None = None, origin: Any = None,
                     inspect: Callable[[Any], None] | None = None) -> tuple[Any, int]:
    """Truncate, label with ``collator`` and drop examples with no trained token; returns ``(dataset, dropped)``.

    A record the collator fails on raises :func:`~.data.record_error` naming ``source`` (default ``name``) and its
    index in ``origin`` (the split as loaded, row for row the records of ``dataset``; default ``dataset``).
    ``inspect(labelled)``: called on the labelled split before anything is dropped.
    """
    labelled = map_records(dataset, _Label(collator, max_length, keep_end), "label", source or name,
                           origin=origin, desc=f"Labelling {name} data")
    if inspect is not None:
        inspect(labelled)
    kept = labelled.filter(lambda flags: flags, input_columns="trained", batched=True, desc=f"Filtering {name} data")
    return kept.remove_columns("trained"), len(labelled) - len(kept)


def _missing_template(text_format: str) -> ConfigError:
    """The one refusal of a missing ``response_template`` (only prompt/completion and messages data do without)."""
    fix = "response_template is missing: set the text that precedes every completion, e.g. '### Answer:'"
    if text_format == "template":
        return ConfigError(fix)
    return ConfigError(f"{fix} (only prompt/completion and messages data can do without it; this data is formatted "
                       f"as {text_format!r})")


def prepare_data(cfg: LaunchConfig, tokenizer: Any, collator: Any = None) -> PreparedData:
    """Run the whole pipeline (see the module docstring) with ``collator`` (default: :func:`labelling_collator`);
    raises :class:`ConfigError` on bad data."""
    training = cfg.training
    template = cfg.data.template
    response = cfg.training.response_template
    if template is not None:
        template_fields(template)  # a template that is not a format string: refused before any data is read
        if response is None:
            raise _missing_template("template")
    collator = labelling_collator(cfg, tokenizer) if collator is None else collator
    sources: list[str] = []  # the split names as load_splits reports them: train first, then eval

    def check(dataset: Any, source: str) -> None:
        sources.append(source)
        fields, completion = required_fields(dataset.column_names, template, training.dataset_text_field, response)
        check_records(dataset, source, fields, completion)
        if fields == ["messages"]:  # chat records, rendered by the chat template
            check_chat_turns(dataset, source)
        if template is not None:
            check_template_values(dataset, source, template)

    train_raw, eval_raw = load_splits(cfg.data, training.seed, check)
    text_format, formatter = make_formatter(train_raw.column_names, template, training.dataset_text_field, tokenizer)
    if response is None and text_format not in ("prompt+completion", "messages"):
        raise _missing_template(text_format)
    chat = text_format == "messages" and response is None  # labels from the chat template, every assistant turn

    def tokenize(raw: Any, name: str, source: str) -> Any:
        """One split's ``input_ids`` and ``labels`` (a record that fails: :func:`~..data.record_error`)."""
        from ...chat_masks import label_chats

        fn = partial(label_chats, tokenizer=tokenizer) if chat else _Tokenize(tokenizer, formatter)
        out = map_records(raw, fn, "chat" if chat else "format", source, None if chat else template,
                          remove_columns=raw.column_names, desc=f"Tokenizing {name} data")
        return out.remove_columns("completion_mask") if chat else out

    if eval_raw is not None:
        missing = sorted(set(train_raw.column_names) - set(eval_raw.column_names))
        if text_format != "template" and missing:
            raise ConfigError(f"the eval data lacks field(s) {', '.join(missing)} that the training data has")
        make_formatter(eval_raw.column_names, template, training.dataset_text_field, tokenizer)
    train_source, eval_source = sources[0], sources[-1]  # one source: eval_fraction holds records of train out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # token-count warnings of long texts; truncation is ours
        train_tok = tokenize(train_raw, "train", train_source)
        eval_tok = None if eval_raw is None else tokenize(eval_raw, "eval", eval_source)
    n_check = cfg.launch.template_check_examples
    missing_in_check, inspect = 0, None  # prompt/completion: the prompt is masked already, the collator flattens
    if response is not None:
        missing_in_check = check_template(train_tok, collator, tokenizer, n_check, train_source, train_raw)
        if text_format == "messages":
            inspect = partial(warn_untrained_turns, train_raw, train_tok, collator=collator, tokenizer=tokenizer,
                              n=n_check)
    keep_end = training.truncation_mode == "keep_end"
    train, dropped_train = label_and_filter(train_tok, collator, training.max_length, keep_end, "train",
                                            train_source, train_raw, inspect)
    if len(train) == 0:
        raise ConfigError(
            f"no training example has a trained token left (response template missing, or every completion cut "
            f"off by max_length={training.max_length}); check response_template and max_length"
        )
    dropped = {"train": dropped_train}
    loaded = {"train": len(train_raw)}
    eval_ds = None
    if eval_tok is not None:
        eval_ds, dropped["eval"] = label_and_filter(eval_tok, collator, training.max_length, keep_end, "eval",
                                                    eval_source, eval_raw)
        loaded["eval"] = len(eval_raw)
        if len(eval_ds) == 0:
            raise ConfigError("no eval example has a trained token left; check the eval data and max_length")
    return PreparedData(train, eval_ds, text_format, dropped, loaded, missing_in_check, min(n_check, len(train_tok)))
