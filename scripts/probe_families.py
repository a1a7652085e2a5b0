"""Which model families train padding-free exactly, and what the packing probe says about each.

Builds a tiny random model of each family from its config (``trl_padfree.families``: nothing is downloaded) and
measures, per family:

- exact under ``"padfree"``: the largest loss difference and the largest relative gradient difference (every
  parameter) between each example alone and all examples packed in one row, the collator's layout
  (``trl_padfree.families.packed_vs_alone``); exact means loss within 1e-5 and gradients within 1e-4;
- the probe's verdict under ``"padfree"`` (``trl_padfree.check_packing``: logits packed vs alone), the layer kinds
  it found, and its verdict under ``sdpa`` and ``eager``.

The verdict depends on the modeling code of the installed transformers (and of this package), not on the weights,
so a tiny model answers for the full-size one (but check your own checkpoint with ``trl-padfree check``: remote
code and config options can change it). Every model is first made ready as this package's trainers make it when
training starts (``trl_padfree.families.prepare_for_training``: recurrent layers that restart at packed
boundaries, where the package has them), so each cell says what training with that attention does.

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

from trl_padfree.families import (  # importing trl_padfree registers attn_implementation="padfree"
    FAMILIES,
    FAMILY_GROUPS,
    OLDER_FAMILIES,
    family_available,
    packed_vs_alone,
    tiny_family_model,
)
from trl_padfree.probe import check_packing, layer_kinds

HEADER = (
    '| model type | layers | exact under "padfree": loss / grad diff | probe, "padfree" | probe, sdpa | probe, eager |',
    "|---|---|---|---|---|---|",
)
OLD_HEADER = ("| model type | sdpa | eager | padfree |", "|---|---|---|---|")
VERDICT = {"safe": "**safe**", "leaks": "LEAKS"}


def _why(error: str | None) -> str:
    """A short reason from a probe error or an exception line."""
    text = error or ""
    if text.startswith("PadfreeAttentionError"):
        feature = "soft-capping" if "soft-capping" in text else "sinks" if "sinks" in text else "a feature"
        return f"refused ({feature})"
    package = re.search(r"without `([\w.-]+)`", text)
    if package:
        return f"error (needs {package.group(1)})"
    return f"error ({text.split(':')[0]})" if text else "error"


def _build(model_type: str, attn: str) -> torch.nn.Module | str:
    """The tiny model, or why it cannot be built with this attention (a table cell)."""
    try:
        return tiny_family_model(model_type, attn, prepare=True)
    except Exception as exc:  # noqa: BLE001  (a table cell, not a crash)
        if isinstance(exc, ValueError) and "does not support" in str(exc):  # transformers refuses it
            return "not offered"
        return f"fails to load ({type(exc).__name__})"


def probe_cell(model_type: str, attn: str) -> tuple[str, tuple[str, ...]]:
    """The probe's verdict under ``attn`` (a table cell) and the layer kinds it found."""
    model = _build(model_type, attn)
    if isinstance(model, str):
        return model, ()
    try:
        report = check_packing(model, try_alternatives=False)
    except Exception as exc:  # noqa: BLE001  (a table cell, not a crash)
        return f"fails ({type(exc).__name__})", layer_kinds(model)
    if report.status == "error":
        return _why(report.error), report.layer_kinds
    return VERDICT.get(report.status, report.status), report.layer_kinds


def exact_cell(model_type: str) -> str:
    """Loss and gradient differences packed vs alone under ``"padfree"`` (a table cell)."""
    model = _build(model_type, "padfree")
    if isinstance(model, str):
        return model
    try:
        result = packed_vs_alone(model)
    except Exception as exc:  # noqa: BLE001
        return _why(f"{type(exc).__name__}: {exc}")
    verdict = "**exact**" if result.exact() else "DIFFERS"
    return f"{verdict} {result.loss_diff:.1e} / {result.grad_diff:.1e}"


def family_row(model_type: str) -> tuple[str, str]:
    """One row of the main table, and the short verdict for the summary."""
    sdpa, _ = probe_cell(model_type, "sdpa")
    eager, _ = probe_cell(model_type, "eager")
    exact = exact_cell(model_type)
    padfree, kinds = probe_cell(model_type, "padfree")
    row = f"| {model_type} | {', '.join(kinds)} | {exact} | {padfree} | {sdpa} | {eager} |"
    return row, exact.split(" (")[0].split(" ")[0]


def old_row(model_type: str) -> str:
    cells = [probe_cell(model_type, attn)[0] for attn in ("sdpa", "eager", "padfree")]
    return f"| {model_type} | " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", default=None, help="comma-separated model types (default: every family)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs/probe-families.md")
    args = parser.parse_args(argv)
    types = [t.strip() for t in args.types.split(",") if t.strip()] if args.types else [*FAMILIES, *OLDER_FAMILIES]
    unknown = [t for t in types if t not in transformers.models.auto.configuration_auto.CONFIG_MAPPING]
    if unknown:
        parser.error(f"unknown model type(s) {', '.join(unknown)}; use names like llama, opt, mistral")
    start = time.perf_counter()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # tiny configs trigger config warnings that say nothing about packing
    absent = [t for t in types if not family_available(t)]
    main_rows: list[str] = []
    old_rows: list[str] = []
    summary: dict[str, list[str]] = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for group, members in FAMILY_GROUPS.items():
                chosen = [t for t in members if t in types and t not in absent]
                if chosen:
                    main_rows.append(f"| *{group}* | | | | | |")
                for model_type in chosen:
                    row, verdict = family_row(model_type)
                    main_rows.append(row)
                    summary.setdefault(verdict.strip("*"), []).append(model_type)
                    print(row, flush=True)
            other = [t for t in types if t not in FAMILIES and t not in absent]
            for model_type in other:
                old_rows.append(old_row(model_type))
                print(old_rows[-1], flush=True)
    finally:
        hf_logging.set_verbosity(verbosity)
    counts = "; ".join(f"{verdict} ({len(names)}): {', '.join(names)}" for verdict, names in summary.items())
    parts = [
        "# Padding-free exactness and the probe, by model family\n",
        f"`python scripts/probe_families.py` with transformers {transformers.__version__}, torch "
        f"{torch.__version__}, on CPU in float32: a tiny random model of each family (4 layers, hidden 64, "
        "vocabulary 128, few experts; hybrids with an attention layer among their recurrent layers, windows and "
        "chunks of 8 tokens; `trl_padfree/families.py`), built from its config and made ready as this package's "
        "trainers make it when training starts (`trl_padfree.families.prepare_for_training`).\n",
        '- **exact under "padfree"**: four examples of 11, 5, 14 and 9 tokens, each alone vs all packed in one row '
        "(the collator's layout: `position_ids`, `cu_seq_lens_*`, `max_length_*`, `seq_idx`), train mode with "
        "dropout and router jitter at 0: the largest loss difference / the largest relative gradient difference "
        "over every parameter (`trl_padfree.families.packed_vs_alone`); **exact** means loss within 1e-5 and "
        "gradients within 1e-4.",
        "- **probe**: the verdict of `trl_padfree.check_packing` (logits of random sequences packed vs alone) under "
        "each attention implementation: **safe**, LEAKS (packed examples see each other: training would silently "
        "differ), error (the packed forward fails: the package it needs, or what `\"padfree\"` refuses), "
        "unsupported (the model never calls `\"padfree\"`), not offered (transformers does not offer the "
        "implementation for the model).",
        "- **layers**: the token-mixing layer kinds the probe found (`trl_padfree.probe.layer_kinds`).\n",
    ]
    if main_rows:
        total = sum(map(len, summary.values()))
        parts += [f'Under "padfree", of {total} families: {counts}.\n', *HEADER, *main_rows, ""]
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
