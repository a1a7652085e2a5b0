"""The records of every launch task: :func:`load_splits` (local files or ``dataset_name``, ``eval_fraction`` held out
with the run's seed) and :func:`map_records`, a ``datasets.map`` whose failure on a record is one line naming the split,
the record's index in its file and the fix (:func:`record_error`).
"""

from __future__ import annotations

import glob
import os
import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..exception_text import one_line
from .config import ConfigError, LaunchArguments

#: Local data formats and the ``datasets`` builder that reads each.
DATA_EXTENSIONS: dict[str, str] = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
_FORMAT_WORDS = {".jsonl": "JSON Lines (one JSON object per line)", ".json": "JSON", ".csv": "CSV"}
_KINDS = {"text": "plain text", "messages": "chat messages (conversational)"}


def data_builder(path: str) -> str:
    """The ``datasets`` builder name for a local data file (by extension).

    >>> data_builder("data/train.jsonl"), data_builder("x.parquet")
    ('json', 'parquet')
    """
    ext = os.path.splitext(path)[1].lower()
    if ext not in DATA_EXTENSIONS:
        raise ConfigError(f"unsupported data file {path!r}: use one of {', '.join(DATA_EXTENSIONS)} (or dataset_name "
                          "for a hub dataset or a local dataset directory)")
    return DATA_EXTENSIONS[ext]


def check_data_files(key: str, pattern: str) -> None:
    """Refuse directories, empty files and binary files posing as text, naming the file (``datasets``' own errors on
    them name neither; on a file that is no Parquet it is clear: :func:`_load_files` makes it one line)."""
    for path in sorted(glob.glob(os.path.expanduser(pattern))):
        ext = os.path.splitext(path)[1].lower()
        if os.path.isdir(path):
            raise ConfigError(
                f"{key}={pattern!r} matches the directory {path!r}: point it at data files (e.g. a glob such as "
                f"{os.path.join(path, '*' + ext)!r}), or use dataset_name for a saved dataset directory")
        try:
            with open(path, "rb") as handle:
                head, more = handle.read(1 << 16), bool(handle.read(1))
        except OSError as exc:
            raise ConfigError(f"cannot read {key} file {path!r}: {exc.strerror or exc}") from None
        if not more and not head.strip():
            raise ConfigError(f"{key} file {path!r} is empty ({len(head)} bytes{', all whitespace' if head else ''}): "
                              "it holds no records")
        if ext == ".parquet":
            continue
        try:
            if (bad := head.find(b"\x00")) < 0:
                head[: -3 if more else None].decode("utf-8")  # (a character cut at the end of the head is no error)
        except UnicodeDecodeError as exc:
            bad = exc.start
        if bad >= 0:
            raise ConfigError(f"{key} file {path!r} is not text (byte 0x{head[bad]:02x} at offset {bad}): expected "
                              f"{_FORMAT_WORDS.get(ext, 'text')} in UTF-8")


def value_kind(value: Any) -> str | None:
    """``"text"``, ``"messages"`` (a list of ``{"role", "content"}`` dicts) or None (anything else)."""
    if isinstance(value, str):
        return "text"
    if isinstance(value, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
        return "messages"
    return None


def check_kinds(records: Iterable[Any], source: str, fields: Sequence[str], required: Sequence[str] = ()) -> None:
    """Every record's ``fields`` (those it has) a string or a list of chat messages, all of one kind, the
    ``required`` ones not empty; else a :class:`ConfigError` naming the record and the fix."""
    first: tuple[int, str, str] | None = None  # (record, field, kind) of the first value
    for index, record in enumerate(records):
        for name in [name for name in fields if isinstance(record, dict) and name in record]:
            value, where = record[name], f"{source} record {index} (counting from 0)"
            kind = value_kind(value)
            if kind is None:
                got = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", dict: "an object"}
                raise ConfigError(f"{where}: {name!r} must be a string or a list of chat messages ({{'role', 'content'}}"
                                  f"), got {got.get(type(value), 'a list of something else than messages')}; fix the "
                                  "record")
            first = first or (index, name, kind)
            if kind != first[2]:
                raise ConfigError(
                    f"{where}: {name!r} is {_KINDS[kind]}, but in record {first[0]} {first[1]!r} is {_KINDS[first[2]]}"
                    ": the data mixes plain-text and conversational records, which TRL tokenizes differently (a chat "
                    "template, EOS); use one kind: convert the records of one kind, or put them in separate files "
                    "and runs")
            if not value and name in required:
                raise ConfigError(f"{where}: {name!r} is empty; drop the record or fill it in")


def _load_files(key: str, pattern: str) -> Any:
    import datasets

    check_data_files(key, pattern)
    builder, verbosity = data_builder(pattern), datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its own error line would precede ours
    try:
        return datasets.load_dataset(builder, data_files={"data": pattern}, split="data")
    except Exception as exc:  # datasets raises many types for unreadable files; the cause says what was wrong
        cause = exc.__cause__ or exc.__context__ or exc
        raise ConfigError(f"could not read {key}={pattern!r}: {one_line(cause)}") from None
    finally:
        datasets.logging.set_verbosity(verbosity)


def _load_dataset_name(data: LaunchArguments) -> Any:
    """``dataset_name``'s splits; an unreachable hub fails at once (``datasets`` would retry for ~30 s)."""
    from datasets import load_dataset
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    name, offline = data.dataset_name, constants.is_offline_mode()
    if not os.path.exists(os.path.expanduser(name)) and not offline:
        try:
            HfApi().dataset_info(name, timeout=10)
        except RepositoryNotFoundError:  # gated repositories included
            raise ConfigError(f"dataset_name={name!r} is not on the Hugging Face Hub, or is private or gated (log in "
                              "with `hf auth login`); check the id or set dataset_name to a local dataset directory"
                              ) from None
        except HfHubHTTPError:
            pass  # the hub answered: datasets reports what it says
        except Exception as exc:  # no answer: connection refused, DNS, timeout
            raise ConfigError(f"cannot reach the Hugging Face Hub to load dataset_name={name!r} ({one_line(exc)[:120]}"
                              "); set HF_HUB_OFFLINE=1 to use a cached copy, or set dataset_name to a local dataset "
                              "directory") from None
    try:
        splits = load_dataset(name, data.dataset_config)
    except Exception as exc:
        hint = (" (HF_HUB_OFFLINE is set and it is not in the local cache: unset it to download the dataset, or "
                "set dataset_name to a local dataset directory)") if offline else ""
        raise ConfigError(f"could not load dataset_name={name!r}: {one_line(exc)}{hint}") from None
    for key in ("dataset_train_split", "dataset_test_split"):
        split = getattr(data, key)
        if split is not None and split not in splits:
            raise ConfigError(f"{key}={split!r} is not a split of {name!r}; it has: {', '.join(sorted(splits))}")
    return splits


def load_splits(data: LaunchArguments, seed: int, check: Callable[[Any, str], None] = lambda *_: None,
                where: dict[str, tuple[str, Sequence[int]]] | None = None) -> tuple[Any, Any | None]:
    """The training split and the eval split (or None) of ``data``. ``check(dataset, source)`` runs on each split as
    loaded; ``where`` (if given) gets each split's ``(source, index in the file of each of its records)``."""
    from datasets import Dataset

    if data.train_file:
        loaded = [(_load_files("train_file", data.train_file), "train_file")]
    else:
        splits = _load_dataset_name(data)
        loaded = [(splits[split], f"dataset_name split {split!r}")
                  for split in (data.dataset_train_split, data.dataset_test_split) if split is not None]
    if data.eval_file:
        loaded.append((_load_files("eval_file", data.eval_file), "eval_file"))
    for dataset, source in loaded:
        check(dataset, source)
    chosen = {name: (*loaded[i], range(len(loaded[i][0]))) for name, i in (("train", 0), ("eval", -1))[: len(loaded)]}
    if data.eval_fraction is not None:  # held out by index, so that each record keeps its index in the file
        dataset, source, rows = chosen["train"]
        if len(rows) < 2:
            raise ConfigError(f"eval_fraction needs at least 2 training records, the data has {len(rows)}")
        parts = Dataset.from_dict({"row": list(rows)}).train_test_split(test_size=data.eval_fraction, seed=seed)
        chosen = {name: (dataset, source, parts[part]["row"]) for name, part in (("train", "train"), ("eval", "test"))}
    out: dict[str, Any] = {"eval": None}
    for name, (dataset, source, rows) in chosen.items():
        rows = list(rows)[: data.max_train_examples if name == "train" else data.max_eval_examples]
        if not rows:
            raise ConfigError(f"the {'training' if name == 'train' else 'eval'} data has no records")
        out[name] = dataset.select(rows)
        if where is not None:
            where[name] = (source, rows)
    return out["train"], out["eval"]


def record_error(source: str, index: int, stage: str, error: BaseException, template: str | None = None) -> ConfigError:
    """The one-line error for a record that cannot be prepared, naming the split, the record's index, the cause and the
    fix; ``stage``: what failed on it, ``format`` (``template``, or the chat template), ``tokenize`` or ``label``.

    >>> str(record_error("train_file", 3, "format", IndexError("string index out of range"), "{a[9]}"))[:95]
    "train_file record 3 (counting from 0): template '{a[9]}' cannot format it (IndexError: string i"
    """
    from jinja2.exceptions import TemplateError

    from ..chat_masks import ChatMaskError

    reason = f"{type(error).__name__}: {one_line(error)}"
    frames = traceback.walk_tb(error.__traceback__)  # (jinja runs a template's compiled code as "<template>")
    if isinstance(error, ChatMaskError):
        what = "messages data without response_template: " + one_line(error, limit=None)  # ours: names the fix
    elif isinstance(error, TemplateError) or any(frame.f_code.co_filename == "<template>" for frame, _ in frames):
        what = (f"the chat template cannot render it ({reason}); change the record to what the template accepts, "
                "or set chat_template_path to a template that accepts it")
    elif stage == "format" and template is not None:
        what = (f"template {template!r} cannot format it ({reason}); fix the template (fields as {{name}}, literal "
                "braces as {{ and }}) or the record")
    elif stage == "format":
        what = f"it cannot be turned into text ({reason}); fix the record"
    elif stage == "tokenize":
        what = (f"the tokenizer fails on its text ({reason}); fix the record's text, or use a tokenizer that accepts "
                "it (model_name_or_path)")
    else:
        what = (f"the collator fails on it ({reason}); fix the record, or check response_template, "
                "instruction_template and max_length")
    return ConfigError(f"{source} record {index} (counting from 0): {what}")


def map_records(dataset: Any, steps: Sequence[tuple[str, Callable]], source: str, index: Sequence[int],
                template: str | None = None, **map_kwargs: Any) -> Any:
    """``dataset.map`` of ``steps`` (``(stage, function of a batch)``, :func:`record_error`'s stages) in turn, in
    batches; the first record a step fails on is :func:`record_error` (``index``: each record's index in its file)."""

    def apply(batch: dict[str, list[Any]]) -> tuple[Any, tuple[str, Exception] | None]:
        for stage, fn in steps:
            try:
                batch = fn(batch)
            except Exception as exc:  # noqa: BLE001  (whatever a record makes a step raise is reported below)
                return None, (stage, exc)
        return batch, None

    def per_batch(batch: dict[str, list[Any]], positions: list[int]) -> dict[str, list[Any]]:
        out, failure = apply(batch)
        if failure is None:
            return out
        at = positions[0]  # (the batch's failure, where no record fails alone)
        for j, position in enumerate(positions):
            if (alone := apply({key: values[j : j + 1] for key, values in batch.items()})[1]) is not None:
                at, failure = position, alone
                break
        raise record_error(source, index[at], *failure, template)

    return dataset.map(per_batch, batched=True, batch_size=256, with_indices=True, **map_kwargs)
