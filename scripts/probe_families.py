"""Which model families train padding-free exactly, and what the packing probe says about each.

A tiny random model of each family (``trl_padfree.families``: nothing is downloaded), prepared as this package's
trainers prepare it; the verdict depends on the installed modeling code, not on the weights. Check your own
checkpoint with ``trl-padfree check``.

    python scripts/probe_families.py                       # every family -> docs/probe-families.md
    python scripts/probe_families.py --types llama,opt --out /tmp/families.md
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import warnings
from pathlib import Path

import torch
import transformers
from transformers.utils import logging as hf_logging

from trl_padfree.families import FAMILIES, FAMILY_GROUPS, OLDER_FAMILIES, packed_vs_alone, tiny_family_model
from trl_padfree.probe import check_packing, layer_kinds

HEADER = ('| model type | layers | exact under "padfree": loss / grad diff | probe, "padfree" | probe, sdpa '
          "| probe, eager |", "|---|---|---|---|---|---|")
OLD_HEADER = ("| model type | sdpa | eager | padfree |", "|---|---|---|---|")
INTRO = """# Padding-free exactness and the probe, by model family

`python scripts/probe_families.py` with transformers {tf}, torch {torch}, CPU, float32: a tiny random model of
each family (`trl_padfree/families.py`), prepared as this package's trainers prepare it.

- **exact**: four examples of 11, 5, 14 and 9 tokens, each alone vs all packed in one row, in train mode: the
  largest loss difference / relative gradient difference over every parameter; exact: within 1e-5 / 1e-4.
- **probe**: `trl_padfree.check_packing`'s verdict under each attention: safe, LEAKS (packed examples see each
  other), error, unsupported (the model never calls `"padfree"`), not offered (transformers does not offer it).
- **layers**: the token-mixing layer kinds the probe found.
"""


def _why(error: str | None) -> str:
    """A short reason from a probe error or an exception line."""
    text = error or ""
    if text.startswith("PadfreeAttentionError"):
        return "refused ({})".format(next((f for f in ("soft-capping", "sinks") if f in text), "a feature"))
    package = re.search(r"without `([\w.-]+)`", text)
    return f"error (needs {package[1]})" if package else f"error ({text.split(':')[0]})" if text else "error"


def _build(model_type: str, attn: str) -> torch.nn.Module | str:
    """The tiny model, or why it cannot be built with this attention (a table cell)."""
    try:
        return tiny_family_model(model_type, attn, prepare=True)
    except Exception as exc:  # noqa: BLE001  (a table cell, not a crash)
        if isinstance(exc, ValueError) and "does not support" in str(exc):
            return "not offered"
        return f"fails to load ({type(exc).__name__})"


def probe_cell(model_type: str, attn: str) -> tuple[str, tuple[str, ...]]:
    """The probe's verdict under ``attn`` (a table cell) and the layer kinds it found."""
    model = _build(model_type, attn)
    if isinstance(model, str):
        return model, ()
    try:
        report = check_packing(model, try_alternatives=False)
    except Exception as exc:  # noqa: BLE001
        return f"fails ({type(exc).__name__})", layer_kinds(model)
    if report.status == "error":
        return _why(report.error), report.layer_kinds
    return {"leaks": "LEAKS"}.get(report.status, report.status), report.layer_kinds


def exact_cell(model_type: str) -> str:
    """Loss and gradient differences packed vs alone under ``"padfree"`` (a table cell)."""
    model = _build(model_type, "padfree")
    if isinstance(model, str):
        return model
    try:
        result = packed_vs_alone(model)
    except Exception as exc:  # noqa: BLE001
        return _why(f"{type(exc).__name__}: {exc}")
    return f"{'exact' if result.exact() else 'DIFFERS'} {result.loss_diff:.1e} / {result.grad_diff:.1e}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", default=None, help="comma-separated model types (default: every family)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs/probe-families.md")
    args = parser.parse_args(argv)
    types = [t.strip() for t in args.types.split(",") if t.strip()] if args.types else [*FAMILIES, *OLDER_FAMILIES]
    known = transformers.models.auto.configuration_auto.CONFIG_MAPPING
    if unknown := [t for t in types if t not in known and (args.types or t not in (*FAMILIES, *OLDER_FAMILIES))]:
        parser.error(f"unknown model type(s) {', '.join(unknown)}; use names like llama, opt, mistral")
    start = time.perf_counter()
    absent = [t for t in types if t not in known]
    rows, old_rows, verdicts = [], [], {}
    hf_logging.set_verbosity_error()  # tiny configs trigger config warnings that say nothing about packing
    warnings.simplefilter("ignore")
    for group, members in FAMILY_GROUPS.items():
        chosen = [t for t in members if t in types and t not in absent]
        rows += [f"| *{group}* | | | | | |"] if chosen else []
        for model_type in chosen:
            sdpa, eager = (probe_cell(model_type, attn)[0] for attn in ("sdpa", "eager"))
            exact = exact_cell(model_type)
            padfree, kinds = probe_cell(model_type, "padfree")
            rows.append(f"| {model_type} | {', '.join(kinds)} | {exact} | {padfree} | {sdpa} | {eager} |")
            verdicts.setdefault(exact.split(" ")[0], []).append(model_type)
            print(rows[-1], flush=True)
    for model_type in (t for t in types if t not in FAMILIES and t not in absent):
        cells = [probe_cell(model_type, attn)[0] for attn in ("sdpa", "eager", "padfree")]
        old_rows.append(f"| {model_type} | " + " | ".join(cells) + " |")
        print(old_rows[-1], flush=True)
    counts = "; ".join(f"{verdict} ({len(names)})" + ("" if verdict == "exact" else ": " + ", ".join(names))
                       for verdict, names in verdicts.items())
    parts = [INTRO.format(tf=transformers.__version__, torch=torch.__version__)]
    if rows:
        parts += [f'Under "padfree", of {sum(map(len, verdicts.values()))} families: {counts}.\n', *HEADER, *rows, ""]
    if old_rows:
        parts += ["## Older families: the probe's verdict\n", *OLD_HEADER, *old_rows, ""]
    if absent:
        parts.append(f"Not in transformers {transformers.__version__}: {', '.join(absent)}.\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(parts))
    print(f"\n{counts}\n{len(types) - len(absent)} families in {time.perf_counter() - start:.0f} s; wrote {args.out}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
