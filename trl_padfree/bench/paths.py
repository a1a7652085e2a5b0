"""Output paths of ``trl-padfree bench`` (SFT and DPO alike): checked before any work starts."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["unwritable_dir"]


def unwritable_dir(path: Path) -> str | None:
    """Why ``path`` cannot be (created as) a writable directory, or None. Creates nothing.

    >>> import tempfile, pathlib
    >>> with tempfile.NamedTemporaryFile() as f:
    ...     print(unwritable_dir(pathlib.Path(f.name)) == "it is a file, not a directory",
    ...           unwritable_dir(pathlib.Path(f.name) / "sub") == f"{f.name} is a file, not a directory")
    True True
    """
    if path.exists():
        if not path.is_dir():
            return "it is a file, not a directory"
        return None if os.access(path, os.W_OK | os.X_OK) else "it is not writable"
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is a file, not a directory"
    return None if os.access(parent, os.W_OK | os.X_OK) else f"{parent} is not writable, so it cannot be created"
