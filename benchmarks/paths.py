"""Output of ``trl-padfree bench`` (every task alike): the directory checked before any work starts, and the
report files written at the end (:func:`write_report_files`: JSON, Markdown and, where the task plots, PNG)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["print_and_report", "printed_markdown", "refuse_unusable", "run_and_report", "unwritable_dir", "write_report_files"]


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


def write_report_files(report: dict[str, Any], output_dir: Path, name: str, markdown: Callable[[dict[str, Any]], str],
                       plot: Callable[[dict[str, Any], Path], None] | None = None) -> dict[str, Path]:
    """Write ``<name>.json``, ``<name>.md`` (``markdown(report)``) and, with a ``plot``, ``<name>.png`` under
    ``output_dir``; return their paths."""
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = {ext: output_dir / f"{name}.{ext}" for ext in ("json", "md", "png")[: 3 if plot else 2]}
    paths["json"].write_text(json.dumps(report, indent=1, default=str) + "\n")
    paths["md"].write_text(markdown(report))
    if plot:
        plot(report, paths["png"])
    return paths


def printed_markdown(report: dict[str, Any]) -> str:
    """The Markdown of a task that reports what it printed (``report["title"]``, ``report["printed"]`` lines).

    >>> print(printed_markdown({"title": "t", "printed": ["a  1", "b  2"]}), end="")
    # t
    <BLANKLINE>
    ```
    a  1
    b  2
    ```
    """
    return f"# {report['title']}\n\n```\n" + "\n".join(report["printed"]) + "\n```\n"


def print_and_report(report: dict[str, Any], args: Any, lines: list[str]) -> dict[str, Path]:
    """Print ``lines`` and write them with ``report`` (:func:`printed_markdown`) as ``--output-dir``/``--name``
    (default ``<task>-cpu``) say: the report of a task without its own tables (grpo, rloo, reward, kto)."""
    print("\n".join(lines))
    report.update(title=f"trl-padfree bench --task {args.task}", printed=lines)
    paths = write_report_files(report, args.output_dir, args.name or f"{args.task}-cpu", printed_markdown)
    print("Wrote " + ", ".join(str(p) for p in paths.values()))
    return paths


def refuse_unusable(parser: Any, device: str, output_dir: Path) -> None:
    """``parser.error`` (exit 2, one line) when ``output_dir`` cannot be written or ``device`` is CUDA without one."""
    reason = unwritable_dir(output_dir)
    if reason:
        parser.error(f"--output-dir {output_dir}: {reason}; pass a directory that can be written")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            parser.error(f"--device {device} but torch.cuda.is_available() is False; use --device cpu")


def run_and_report(parser: Any, args: Any, config: Any, run: Callable[[Any], dict[str, Any]],
                   markdown: Callable[[dict[str, Any]], str], plot: Callable[[dict[str, Any], Path], None], stem: str,
                   unit: str = "") -> int:
    """A task's run from its parsed ``args`` and ``config``: a bad option or an unusable ``--output-dir`` or device
    exits 2 in one line before any work; then the run line, ``run(config)``, the report files (``markdown``,
    ``plot``), the tables, and the verdict of the targets (0, or 1 when a judged target failed)."""
    from .preset import fmt_params
    from .targets import verdict

    try:
        config.validate()
    except ValueError as exc:
        parser.error(str(exc))
    refuse_unusable(parser, config.device, args.output_dir)
    print(f"{parser.prog}: Llama {config.layers}x{config.hidden} ({fmt_params(config.parameter_count())} "
          f"parameters), {config.dtype} on {config.device}, batch {config.batch_size}{unit}, {config.warmup} warm-up + "
          f"{config.steps} timed steps, variants {', '.join(config.variants)}")
    report = run(config)
    paths = write_report_files(report, args.output_dir, args.name or stem, markdown, plot)
    print("\n" + markdown(report))
    print("Wrote " + ", ".join(str(p) for p in paths.values()))
    return verdict(report)
