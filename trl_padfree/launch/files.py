"""Files of a run that are written whole or not at all: a JSON file replaced atomically, a directory moved into
place only once it is complete, and the syncs that make both survive a crash (best effort where the filesystem does
not support them).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

__all__ = ["fsync_path", "move_into", "read_json", "remove_if_empty", "write_json_atomic"]


def fsync_path(path: str) -> None:
    """Flush a file or directory to disk (best effort where the filesystem does not support it)."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(path) and hasattr(os, "O_DIRECTORY") else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json_atomic(path: str, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON to ``path``: a temporary file in the same directory, synced, then renamed.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> write_json_atomic(os.path.join(d, "x.json"), {"a": 1}); read_json(os.path.join(d, "x.json"))
    {'a': 1}
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
    try:
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the run's other files are not
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, default=str)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_path(directory)


def read_json(path: str) -> dict[str, Any] | None:
    """The JSON mapping in ``path``, or None if it is missing, unreadable or not a mapping."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def move_into(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst``, replacing a directory already at ``dst`` only once ``src`` is in place."""
    if os.path.isdir(dst) and not os.path.islink(dst):
        old = f"{src}.replaced"
        os.rename(dst, old)
        os.rename(src, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, dst)


def remove_if_empty(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass
