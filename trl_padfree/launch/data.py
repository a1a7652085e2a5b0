"""The records of every launch task: :func:`load_splits` (local files or ``dataset_name``, an ``eval_fraction`` held
out with the run's seed) and :func:`map_records`, a ``datasets.map`` whose failure on a record is one
:class:`~.config.ConfigError` line naming the split, the record's index in file order and the fix
(:func:`record_error`). What each task does with the records: :mod:`.tasks.sft_data`, :mod:`.tasks.preference_data`.
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Callable, Iterator
from typing import Any

from .config import ConfigError, LaunchArguments
from .console import one_line

__all__ = ["DATA_EXTENSIONS", "RecordFailed", "check_data_files", "data_builder", "file_index",
           "load_splits", "map_records", "record_error", "stage"]

#: Local data formats and the ``datasets`` builder that reads each.
DATA_EXTENSIONS: dict[str, str] = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
_FORMAT_WORDS = {".jsonl": "JSON Lines (one JSON object per line)", ".json": "JSON", ".csv": "CSV"}


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
                f"{os.path.join(path, '*' + ext)!r}), or use dataset_name for a saved dataset directory")
        try:
            with open(path, "rb") as handle:
                head, more = handle.read(1 << 16), bool(handle.read(1))
        except OSError as exc:
            raise ConfigError(f"cannot read {key} file {path!r}: {exc.strerror or exc}") from None
        if not head:
            raise ConfigError(f"{key} file {path!r} is empty (0 bytes): it holds no records")
        if ext == ".parquet":
            if not head.startswith(b"PAR1"):
                raise ConfigError(f"{key} file {path!r} is not a Parquet file; give its real extension")
            continue
        bad = head.find(b"\x00")
        try:
            if bad < 0:
                codecs.getincrementaldecoder("utf-8")().decode(head, final=not more)
        except UnicodeDecodeError as exc:
            bad = exc.start
        if bad >= 0:
            raise ConfigError(f"{key} file {path!r} is not text (byte 0x{head[bad]:02x} at offset {bad}): expected "
                              f"{_FORMAT_WORDS.get(ext, 'text')} in UTF-8")
        if not more and not head.strip():
            raise ConfigError(f"{key} file {path!r} holds only whitespace: it has no records")


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


def load_splits(data: LaunchArguments, seed: int,
                check: Callable[[Any, str], None] | None = None) -> tuple[Any, Any | None]:
    """The training split and the eval split (or None) of ``data``; ``check(dataset, source)`` runs on each split as
    loaded (before ``eval_fraction`` shuffles it, so that record indices are those of the files)."""
    loaded: list[Any] = []

    def add(dataset: Any, source: str) -> None:
        (check or (lambda *_: None))(dataset, source)
        loaded.append(dataset)

    if data.train_file:
        add(_load_files("train_file", data.train_file), "train_file")
    else:
        splits = _load_dataset_name(data)
        for split in (data.dataset_train_split, data.dataset_test_split):
            if split is not None:
                add(splits[split], f"dataset_name split {split!r}")
    if data.eval_file:
        add(_load_files("eval_file", data.eval_file), "eval_file")
    train, eval_ds = loaded[0], loaded[-1] if len(loaded) > 1 else None
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


class RecordFailed(Exception):
    """An exception raised while preparing records, with its stage (``format``, ``tokenize``, ``chat`` or
    ``label``) and, once :func:`map_records` found it, the position of the first record that fails."""

    def __init__(self, stage: str, error: BaseException, position: int | None = None) -> None:
        super().__init__(stage, error, position)
        self.stage, self.error, self.position = stage, error, position


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Tag any exception raised inside with the stage it was raised in (see :func:`record_error`)."""
    try:
        yield
    except RecordFailed:
        raise
    except Exception as exc:
        raise RecordFailed(name, exc) from exc


def _raised_in_a_template(error: BaseException) -> bool:
    """Whether ``error`` comes from a chat template: a jinja error, or any exception raised by template code."""
    from jinja2.exceptions import TemplateError

    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != "<template>":  # jinja's compiled template code
        tb = tb.tb_next
    return isinstance(error, TemplateError) or tb is not None


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


def file_index(dataset: Any, position: int) -> int:
    """The index, in file order, of the record at ``position`` of ``dataset`` (a shuffled or selected split keeps
    a mapping to the rows of the files it was loaded from; ``datasets`` has no public accessor for it)."""
    try:
        return int(dataset._indices.column(0)[position].as_py())
    except Exception:  # noqa: BLE001  (no mapping, or a layout this does not know: the position is the best there is)
        return position


def map_records(dataset: Any, fn: Callable[[dict[str, list[Any]]], dict[str, list[Any]]], stage_name: str,
                source: str, template: str | None = None, origin: Any = None, **map_kwargs: Any) -> Any:
    """``dataset.map(fn, batched=True)``; a record ``fn`` fails on becomes :func:`record_error` (one line): when a
    batch fails, its records are tried one at a time. ``origin``: the split as loaded, row for row the same records
    as ``dataset`` (for their indices in file order)."""

    def per_record(batch: dict[str, list[Any]], indices: list[int]) -> dict[str, list[Any]]:
        try:
            with stage(stage_name):
                return fn(batch)
        except RecordFailed as exc:
            first = exc
        for j, position in enumerate(indices):
            try:
                with stage(stage_name):
                    fn({key: values[j : j + 1] for key, values in batch.items()})
            except RecordFailed as exc:
                raise RecordFailed(exc.stage, exc.error, position) from None
        raise RecordFailed(first.stage, first.error, indices[0]) from None  # only the whole batch fails

    try:
        return dataset.map(per_record, batched=True, batch_size=256, with_indices=True, **map_kwargs)
    except RecordFailed as failed:
        index = file_index(dataset if origin is None else origin, failed.position)
        raise record_error(source, index, failed.stage, failed.error, template) from None
