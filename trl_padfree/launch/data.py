"""Data for ``trl-padfree train``: load, format into text, tokenize, label with the collator, drop the untrainable.

The pipeline, run once before training (the datasets handed to ``SFTTrainer`` are final: TRL's own preparation
is skipped):

1. :func:`load_splits`: local JSON/JSONL/CSV/Parquet files (``train_file``/``eval_file``) or ``dataset_name``
   (hub id or local directory) with its splits; an ``eval_fraction`` is held out with the run's seed.
2. :func:`make_formatter`: each record becomes one text, from ``template`` (a format string over the record's
   fields) or the record's own ``text`` / ``prompt`` + ``completion`` / ``messages`` (chat template).
3. :func:`tokenize_split`: ``input_ids`` (EOS appended to plain text, like TRL) and ``labels`` (the prompt
   already masked for prompt/completion records). ``messages`` data without response/instruction templates:
   :func:`tokenize_chat_split`, labels from the chat template itself (every assistant turn trained).
4. :func:`check_template`: the response template must occur in at least one of the first N examples, otherwise
   the config is wrong (a typo, a missing newline...) and the run stops before loading the model. For
   ``messages`` data, :func:`warn_untrained_turns` says in one line when the templates leave assistant turns
   untrained.
5. :func:`label_and_filter`: truncation to ``max_length`` and the collator's own labels; examples left without a
   single trained token are dropped and counted.

Every failure on a record in steps 2-5 (a chat template that refuses it, a format string that cannot format it, a
tokenizer or the collator raising on it) is a :class:`~.config.ConfigError` naming the split, the record's index
and the fix (:func:`record_error`): one line and exit code 2, never a traceback. A ``template`` that is not a valid
format string is refused before any data is loaded.
"""

from __future__ import annotations

import contextlib
import glob
import os
import string
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from .config import ConfigError, DataArguments, LaunchConfig
from .console import one_line, say
from .validate import data_builder

__all__ = [
    "PreparedData",
    "check_data_files",
    "check_records",
    "check_template",
    "check_template_values",
    "label_and_filter",
    "load_splits",
    "make_formatter",
    "prepare_data",
    "required_fields",
    "template_fields",
    "tokenize_split",
]

IGNORE_INDEX = -100
_MAP_BATCH = 256


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


_FORMAT_WORDS = {".jsonl": "JSON Lines (one JSON object per line)", ".json": "JSON", ".csv": "CSV"}


def check_data_files(key: str, pattern: str) -> None:
    """Refuse empty files, binary files posing as text and non-Parquet ``.parquet`` files, naming the file.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "train.jsonl")
    >>> with open(path, "wb") as f: _ = f.write(b"\\x00\\x01")
    >>> try: check_data_files("train_file", path)
    ... except ConfigError as exc: print(str(exc).split(": ", 1)[1])
    expected JSON Lines (one JSON object per line) in UTF-8
    """
    import codecs

    for path in sorted(glob.glob(os.path.expanduser(pattern))):
        ext = os.path.splitext(path)[1].lower()
        if os.path.isdir(path):
            raise ConfigError(
                f"{key}={pattern!r} matches the directory {path!r}: point it at data files (e.g. a glob such as "
                f"{os.path.join(path, '*' + ext)!r}), or use dataset_name for a saved dataset directory"
            )
        try:
            with open(path, "rb") as handle:
                head = handle.read(1 << 16)
                more = bool(handle.read(1))
        except OSError as exc:
            raise ConfigError(f"cannot read {key} file {path!r}: {exc.strerror or exc}") from None
        if not head:
            raise ConfigError(f"{key} file {path!r} is empty (0 bytes): it holds no records")
        if ext == ".parquet":
            if not head.startswith(b"PAR1"):
                raise ConfigError(f"{key} file {path!r} is not a Parquet file; give its real extension")
            continue
        bad = head.find(b"\x00")
        if bad < 0:
            try:
                codecs.getincrementaldecoder("utf-8")().decode(head, final=not more)
            except UnicodeDecodeError as exc:
                bad = exc.start
        if bad >= 0:
            raise ConfigError(
                f"{key} file {path!r} is not text (byte 0x{head[bad]:02x} at offset {bad}): expected "
                f"{_FORMAT_WORDS.get(ext, 'text')} in UTF-8"
            )
        if not more and not head.strip():
            raise ConfigError(f"{key} file {path!r} holds only whitespace: it has no records")


def _load_files(key: str, pattern: str) -> Any:
    import datasets
    from datasets import load_dataset

    check_data_files(key, pattern)
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its own error line would precede ours
    try:
        return load_dataset(data_builder(pattern), data_files={"data": pattern}, split="data")
    except ConfigError:
        raise
    except Exception as exc:  # datasets raises many types for unreadable files; the cause says what was wrong
        cause = exc.__cause__ or exc.__context__ or exc
        reason = one_line(cause) or type(cause).__name__
        raise ConfigError(f"could not read {key}={pattern!r}: {reason}") from None
    finally:
        datasets.logging.set_verbosity(verbosity)


def _check_hub_dataset(name: str) -> None:
    """Fail fast when ``dataset_name`` is a hub id that cannot be reached (``datasets`` retries for ~30 s)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    if _offline():
        return  # datasets then uses the local cache or fails at once
    try:
        HfApi().dataset_info(name, timeout=10)
    except RepositoryNotFoundError:  # gated repositories included
        raise ConfigError(
            f"dataset_name={name!r} is not on the Hugging Face Hub, or is private or gated (log in with `hf auth "
            "login`); check the id or set dataset_name to a local dataset directory"
        ) from None
    except HfHubHTTPError:
        return  # the hub answered: datasets reports what it says
    except Exception as exc:  # no answer: connection refused, DNS, timeout
        raise ConfigError(
            f"cannot reach the Hugging Face Hub to load dataset_name={name!r} ({one_line(exc)[:120]}); set "
            "HF_HUB_OFFLINE=1 to use a cached copy, or set dataset_name to a local dataset directory"
        ) from None


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


def load_splits(data: DataArguments, seed: int,
                check: Callable[[Any, str], None] | None = None) -> tuple[Any, Any | None]:
    """Load the training split and the eval split (or None) described by ``data``.

    ``check(dataset, source)`` is called on each split as loaded (before ``eval_fraction`` shuffles it, so that
    record indices are those of the files).
    """
    from datasets import load_dataset

    check = check or (lambda dataset, source: None)
    eval_ds = None
    if data.train_file:
        train = _load_files("train_file", data.train_file)
        check(train, "train_file")
    else:
        if not os.path.exists(os.path.expanduser(data.dataset_name)):
            _check_hub_dataset(data.dataset_name)
        try:
            splits = load_dataset(data.dataset_name, data.dataset_config)
        except Exception as exc:
            offline = " (HF_HUB_OFFLINE is set and it is not in the local cache: unset it to download the dataset, " \
                "or set dataset_name to a local dataset directory)" if _offline() else ""
            raise ConfigError(f"could not load dataset_name={data.dataset_name!r}: {one_line(exc)}{offline}") from None
        names = sorted(splits)
        for key in ("dataset_train_split", "dataset_test_split"):
            split = getattr(data, key)
            if split is not None and split not in splits:
                raise ConfigError(f"{key}={split!r} is not a split of {data.dataset_name!r}; it has: {', '.join(names)}")
        train = splits[data.dataset_train_split]
        check(train, f"dataset_name split {data.dataset_train_split!r}")
        if data.dataset_test_split is not None:
            eval_ds = splits[data.dataset_test_split]
            check(eval_ds, f"dataset_name split {data.dataset_test_split!r}")
    if data.eval_file:
        eval_ds = _load_files("eval_file", data.eval_file)
        check(eval_ds, "eval_file")
    if data.eval_fraction is not None:
        if len(train) < 2:
            raise ConfigError(f"eval_fraction needs at least 2 training records, the data has {len(train)}")
        parts = train.train_test_split(test_size=data.eval_fraction, seed=seed, shuffle=True)
        train, eval_ds = parts["train"], parts["test"]
    if data.max_train_examples is not None:
        train = train.select(range(min(data.max_train_examples, len(train))))
    if eval_ds is not None and data.max_eval_examples is not None:
        eval_ds = eval_ds.select(range(min(data.max_eval_examples, len(eval_ds))))
    if len(train) == 0:
        raise ConfigError("the training data has no records")
    if eval_ds is not None and len(eval_ds) == 0:
        raise ConfigError("the eval data has no records")
    return train, eval_ds


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.is_offline_mode())


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


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class _StageFailed(Exception):
    """An exception raised at one stage of preparing records: ``format``, ``tokenize``, ``chat`` or ``label``."""

    def __init__(self, stage: str, error: BaseException) -> None:
        super().__init__(stage, error)
        self.stage, self.error = stage, error


@contextlib.contextmanager
def _stage(name: str) -> Iterator[None]:
    """Tag any exception raised inside with the stage it was raised in (see :func:`record_error`)."""
    try:
        yield
    except _StageFailed:
        raise
    except Exception as exc:
        raise _StageFailed(name, exc) from exc


class _RecordFailed(Exception):
    """Raised out of ``datasets.map`` by :class:`_PerRecord`: the first record that fails, and why."""

    def __init__(self, position: int, stage: str, error: BaseException) -> None:
        super().__init__(position, stage, error)
        self.position, self.stage, self.error = position, stage, error


class _PerRecord:
    """A batched ``datasets.map`` function (``with_indices=True``) that names the record it fails on.

    When ``fn`` raises on a batch, the batch's records are tried one at a time and the first that fails is
    reported by a :class:`_RecordFailed` (its position in the split, the stage and the exception).
    """

    def __init__(self, fn: Callable[[dict[str, list[Any]]], dict[str, list[Any]]], stage: str) -> None:
        self.fn = fn
        self.stage = stage

    def _failure(self, exc: Exception) -> tuple[str, BaseException]:
        return (exc.stage, exc.error) if isinstance(exc, _StageFailed) else (self.stage, exc)

    def __call__(self, batch: dict[str, list[Any]], indices: list[int]) -> dict[str, list[Any]]:
        try:
            with _stage(self.stage):
                return self.fn(batch)
        except _StageFailed as exc:
            first = exc
        for j, position in enumerate(indices):
            try:
                with _stage(self.stage):
                    self.fn({key: values[j : j + 1] for key, values in batch.items()})
            except _StageFailed as exc:
                raise _RecordFailed(position, exc.stage, exc.error) from None
        raise _RecordFailed(indices[0], first.stage, first.error) from None  # only the whole batch fails


def _raised_in_a_template(error: BaseException) -> bool:
    """Whether ``error`` comes from a chat template: a jinja error, or any exception raised by template code."""
    try:
        from jinja2.exceptions import TemplateError
    except ImportError:  # pragma: no cover  (transformers needs jinja2 for chat templates)
        TemplateError = ()  # type: ignore[assignment]  # noqa: N806
    if isinstance(error, TemplateError):
        return True
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":  # jinja's compiled template code
            return True
        tb = tb.tb_next
    return False


def record_error(source: str, index: int, stage: str, error: BaseException, template: str | None = None) -> ConfigError:
    """The one-line error for a record that cannot be prepared: the split, the record's index, the cause, the fix.

    ``stage`` says what failed on it: ``format`` (the ``template`` format string, or the chat template), ``chat``
    (labels from the chat template), ``tokenize`` or ``label`` (the collator).

    >>> str(record_error("train_file", 3, "format", IndexError("string index out of range"), "{a[9]}"))[:95]
    "train_file record 3 (counting from 0): template '{a[9]}' cannot format it (IndexError: string i"
    """
    from ..chat_masks import ChatMaskError

    reason = f"{type(error).__name__}: {one_line(error)}"
    if isinstance(error, ChatMaskError):
        what = "messages data without response_template: " + one_line(error, limit=None)  # ours: names the fix
    elif _raised_in_a_template(error):
        what = (f"the chat template cannot render it ({reason}); change the record to what the template accepts, "
                "or set chat_template_path to a template that accepts it")
    elif stage == "format" and template is not None:
        what = (f"template {template!r} cannot format it ({reason}); fix the template (fields as {{name}}, literal "
                "braces as {{ and }}) or the record")
    elif stage in ("format", "chat"):
        what = f"it cannot be turned into text ({reason}); fix the record"
    elif stage == "tokenize":
        what = (f"the tokenizer fails on its text ({reason}); fix the record's text, or use a tokenizer that accepts "
                "it (model_name_or_path)")
    else:
        what = (f"the collator fails on it ({reason}); fix the record, or check response_template, "
                "instruction_template and max_length")
    return ConfigError(f"{source} record {index} (counting from 0): {what}")


def _file_index(dataset: Any, position: int) -> int:
    """The index, in file order, of the record at ``position`` of ``dataset`` (a shuffled or selected split keeps
    a mapping to the rows of the files it was loaded from)."""
    indices = getattr(dataset, "_indices", None)
    if indices is None:
        return position
    try:
        return int(indices.column(0)[position].as_py())
    except Exception:  # noqa: BLE001  (a layout this does not know: the position is the best there is)
        return position


def _map_records(dataset: Any, fn: Callable[[dict[str, list[Any]]], dict[str, list[Any]]], stage: str,
                 source: str, template: str | None = None, origin: Any = None, **map_kwargs: Any) -> Any:
    """``dataset.map(fn, batched=True)``; a record ``fn`` fails on becomes :func:`record_error` (one line).

    ``origin``: the split as loaded, row for row the same records as ``dataset`` (for their indices in file order).
    """
    try:
        return dataset.map(_PerRecord(fn, stage), batched=True, batch_size=_MAP_BATCH, with_indices=True,
                           **map_kwargs)
    except _RecordFailed as failed:
        index = _file_index(dataset if origin is None else origin, failed.position)
        raise record_error(source, index, failed.stage, failed.error, template) from None


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
        with _stage("format"):
            rows = [self.formatter(dict(zip(keys, values, strict=True))) for values in zip(*batch.values(), strict=True)]
        chat = [c for _, _, c in rows]
        with _stage("tokenize"):
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
                n = _common_prefix(prompt_of[i], ids)
                lab[:n] = [IGNORE_INDEX] * n
            labels.append(lab)
        return {"input_ids": input_ids, "labels": labels}


def tokenize_split(dataset: Any, tokenizer: Any, formatter: Formatter, name: str, source: str | None = None,
                   template: str | None = None) -> Any:
    """Tokenize one split: every original column is replaced by ``input_ids`` and ``labels``.

    A record that cannot be formatted or tokenized raises :func:`record_error` naming ``source`` (default
    ``name``) and the record; ``template``: the format string of the records, if they have one.
    """
    return _map_records(dataset, _Tokenize(tokenizer, formatter), "format", source or name, template,
                        remove_columns=dataset.column_names, desc=f"Tokenizing {name} data")


def tokenize_chat_split(dataset: Any, tokenizer: Any, formatter: Formatter, name: str, source: str | None = None,
                        template: str | None = None) -> Any:
    """``messages`` data without templates: ``input_ids`` and ``labels`` from the chat template itself.

    Every assistant turn is trained (:mod:`trl_padfree.chat_masks`); ``formatter`` and ``template`` are not needed.
    """
    from ..chat_masks import label_chats

    out = _map_records(dataset, partial(label_chats, tokenizer=tokenizer), "chat", source or name,
                       remove_columns=dataset.column_names, desc=f"Tokenizing {name} data")
    return out.remove_columns("completion_mask")


def warn_untrained_turns(raw: Any, tokenized: Any, make_collator: Callable[[], Any], tokenizer: Any, n: int) -> int:
    """One line when the templates leave assistant turns of ``messages`` data untrained (first ``n`` examples).

    Returns the number of affected examples (0 also when the chat template cannot be analysed turn by turn).
    """
    from ..chat_masks import untrained_assistant_turns

    head = range(min(n, len(raw)))
    collator = make_collator()
    affected = turns = 0
    try:
        for start in range(0, len(head), 64):
            part = tokenized.select(range(start, min(start + 64, len(head))))
            features = [{"input_ids": i} for i in part["input_ids"]]
            out = collator(features)
            flat, cu = out["labels"].reshape(-1).tolist(), out["cu_seq_lens_q"].tolist()
            for k, messages in enumerate(raw.select(range(start, start + len(part)))["messages"]):
                missing = untrained_assistant_turns(tokenizer, messages, features[k]["input_ids"],
                                                    flat[cu[k] : cu[k + 1]])
                affected += bool(missing)
                turns += missing
    except Exception:  # noqa: BLE001  (no turn-by-turn analysis, no warning; a record's errors came up in tokenizing)
        return 0
    if affected:
        say(f"warning: in {affected} of the first {len(head)} examples, {turns} assistant turn(s) get no trained "
            "token from response_template/instruction_template (without instruction_template only the last "
            "assistant turn is trained); leave both unset to train every assistant turn from the chat template")
    return affected


def check_template(dataset: Any, make_collator: Callable[[], Any], tokenizer: Any, n: int, response: str,
                   source: str = "train", origin: Any = None) -> int:
    """Fail unless the response template occurs in at least one of the first ``n`` examples (untruncated).

    Returns how many of those examples lack it (they will be dropped, see :func:`label_and_filter`). A record the
    collator fails on raises :func:`record_error` (``source``, ``origin``: as for :func:`label_and_filter`).
    """
    head = dataset.select(range(min(n, len(dataset))))
    collator = make_collator()
    collate = _PerRecord(lambda batch: collator([{"input_ids": i, "labels": lab} for i, lab in
                                                  zip(batch["input_ids"], batch["labels"], strict=True)]), "label")
    for start in range(0, len(head), 64):
        part = head[start : start + 64]
        try:
            collate({"input_ids": part["input_ids"], "labels": part["labels"]},
                    list(range(start, start + len(part["input_ids"]))))
        except _RecordFailed as failed:
            index = _file_index(dataset if origin is None else origin, failed.position)
            raise record_error(source, index, failed.stage, failed.error) from None
    missing = collator.stats.templates_not_found
    if missing == len(head):
        first = tokenizer.decode(head[0]["input_ids"][:60])
        raise ConfigError(
            f"response_template {response!r} was found in none of the first {len(head)} examples (the first one "
            f"starts {first!r}); make it match the formatted text exactly (spaces, newlines, case)"
        )
    return missing


class _Label:
    """Batched ``datasets.map`` function: truncate, then label with the collator exactly as training will."""

    def __init__(self, make_collator: Callable[[], Any], max_length: int | None, keep_end: bool) -> None:
        self.make_collator = make_collator
        self.max_length = max_length
        self.keep_end = keep_end
        self._collator: Any = None

    def _cut(self, seq: list[int]) -> list[int]:
        if self.max_length is None or len(seq) <= self.max_length:
            return seq
        return seq[-self.max_length :] if self.keep_end else seq[: self.max_length]

    def __call__(self, batch: dict[str, list[list[int]]]) -> dict[str, list[Any]]:
        if self._collator is None:
            self._collator = self.make_collator()
        ids = [self._cut(list(x)) for x in batch["input_ids"]]
        labels = [self._cut(list(x)) for x in batch["labels"]]
        out = self._collator([{"input_ids": i, "labels": lab} for i, lab in zip(ids, labels, strict=True)])
        flat = out["labels"].reshape(-1).numpy()
        cu = out["cu_seq_lens_q"].numpy()
        new_labels = [flat[cu[k] : cu[k + 1]].tolist() for k in range(len(ids))]
        trained = [bool(np.any(flat[cu[k] : cu[k + 1]] != IGNORE_INDEX)) for k in range(len(ids))]
        return {"input_ids": ids, "labels": new_labels, "trained": trained}


def label_and_filter(dataset: Any, make_collator: Callable[[], Any], max_length: int | None, keep_end: bool,
                     name: str, source: str | None = None, origin: Any = None) -> tuple[Any, int]:
    """Truncate, label with the collator and drop examples with no trained token; returns ``(dataset, dropped)``.

    A record the collator fails on raises :func:`record_error` naming ``source`` (default ``name``) and its index
    in ``origin`` (the split as loaded, row for row the records of ``dataset``; default ``dataset``).
    """
    labelled = _map_records(dataset, _Label(make_collator, max_length, keep_end), "label", source or name,
                            origin=origin, desc=f"Labelling {name} data")
    kept = labelled.filter(lambda flags: flags, input_columns="trained", batched=True, desc=f"Filtering {name} data")
    return kept.remove_columns("trained"), len(labelled) - len(kept)


def prepare_data(cfg: LaunchConfig, tokenizer: Any, make_collator: Callable[[], Any]) -> PreparedData:
    """Run the whole pipeline (see the module docstring); raises :class:`ConfigError` on bad data."""
    training = cfg.training
    template = cfg.data.template
    if template is not None:
        template_fields(template)  # a template that is not a format string: refused before any data is read
    sources: list[str] = []  # the split names as load_splits reports them: train first, then eval

    def check(dataset: Any, source: str) -> None:
        sources.append(source)
        fields, completion = required_fields(dataset.column_names, cfg.data.template, training.dataset_text_field,
                                             cfg.collator.response_template)
        check_records(dataset, source, fields, completion)
        if cfg.data.template is not None:
            check_template_values(dataset, source, cfg.data.template)

    train_raw, eval_raw = load_splits(cfg.data, training.seed, check)
    text_format, formatter = make_formatter(
        train_raw.column_names, cfg.data.template, training.dataset_text_field, tokenizer
    )
    if cfg.collator.response_template is None and text_format not in ("prompt+completion", "messages"):
        raise ConfigError(
            f"response_template is missing: set the text that precedes every completion, e.g. '### Answer:' (only "
            f"prompt/completion and messages data can do without it; this data is formatted as {text_format!r})"
        )
    # messages without templates: labels from the chat template itself, every assistant turn trained
    tokenize = tokenize_chat_split if text_format == "messages" and cfg.collator.response_template is None else (
        tokenize_split)
    if eval_raw is not None:
        missing = sorted(set(train_raw.column_names) - set(eval_raw.column_names))
        if text_format != "template" and missing:
            raise ConfigError(f"the eval data lacks field(s) {', '.join(missing)} that the training data has")
        make_formatter(eval_raw.column_names, cfg.data.template, training.dataset_text_field, tokenizer)
    train_source, eval_source = sources[0], sources[-1]  # one source: eval_fraction holds records of train out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # token-count warnings of long texts; truncation is ours
        train_tok = tokenize(train_raw, tokenizer, formatter, "train", train_source, template)
        eval_tok = None if eval_raw is None else tokenize(eval_raw, tokenizer, formatter, "eval", eval_source,
                                                           template)
    n_check = cfg.launch.template_check_examples
    if cfg.collator.response_template is None:  # prompt/completion: the prompt is masked already, the collator flattens
        missing_in_check = 0
    else:
        missing_in_check = check_template(train_tok, make_collator, tokenizer, n_check, cfg.collator.response_template,
                                          train_source, train_raw)
        if text_format == "messages":
            warn_untrained_turns(train_raw, train_tok, make_collator, tokenizer, n_check)
    keep_end = training.truncation_mode == "keep_end"
    train, dropped_train = label_and_filter(train_tok, make_collator, training.max_length, keep_end, "train",
                                            train_source, train_raw)
    if len(train) == 0:
        raise ConfigError(
            f"no training example has a trained token left (response template missing, or every completion cut "
            f"off by max_length={training.max_length}); check response_template and max_length"
        )
    dropped = {"train": dropped_train}
    loaded = {"train": len(train_raw)}
    eval_ds = None
    if eval_tok is not None:
        eval_ds, dropped["eval"] = label_and_filter(eval_tok, make_collator, training.max_length, keep_end, "eval",
                                                    eval_source, eval_raw)
        loaded["eval"] = len(eval_raw)
        if len(eval_ds) == 0:
            raise ConfigError("no eval example has a trained token left; check the eval data and max_length")
    return PreparedData(
        train=train,
        eval=eval_ds,
        text_format=text_format,
        dropped=dropped,
        loaded=loaded,
        template_missing_in_check=missing_in_check,
        checked=min(n_check, len(train_tok)),
    )
