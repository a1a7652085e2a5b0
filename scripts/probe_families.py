"""Which model families keep padding-free packed examples apart, by attention implementation.

Builds a tiny random model of each family from its config (nothing is downloaded), runs the packing probe
(:func:`trl_padfree.check_packing`) under ``sdpa``, ``eager`` and ``"padfree"``, and writes a Markdown table.
The verdict depends on the modeling code of the installed transformers, not on the weights, so a tiny model
answers for the full-size one (but check your own checkpoint with ``trl-padfree check`` anyway: remote code and
config options can change it).

    python scripts/probe_families.py                       # all families below -> docs/probe-families.md
    python scripts/probe_families.py --types llama,opt --out /tmp/families.md
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from trl_padfree import (  # importing registers attn_implementation="padfree"
    PadfreeAttentionError,
    check_packing,
)

ATTENTION = ("sdpa", "eager", "padfree")
SMALL = dict(
    num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
    vocab_size=128, max_position_embeddings=128, head_dim=16, pad_token_id=0, bos_token_id=1, eos_token_id=2,
)  # fmt: skip
# Families whose configs need other names or sizes to build a tiny model.
OVERRIDES: dict[str, dict] = {
    "falcon": {"head_dim": None},  # a read-only property there
    "gptj": {"rotary_dim": 8},
    "codegen": {"rotary_dim": 8},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
}
FAMILIES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "gemma", "gemma2", "gemma3_text", "phi", "phi3",
    "granite", "olmo", "olmo2", "cohere", "stablelm", "starcoder2", "gpt2", "gpt_bigcode", "gpt_neox", "gptj",
    "codegen", "falcon", "opt", "bloom", "mpt", "biogpt", "xglm", "bart", "gpt_oss", "mamba", "jamba",
)  # fmt: skip


def tiny_config(model_type: str):
    kwargs = {**SMALL, **OVERRIDES.get(model_type, {})}
    return AutoConfig.for_model(model_type, **{k: v for k, v in kwargs.items() if v is not None})


def verdict(model_type: str, attn: str) -> str:
    """One table cell: the probe's status, or why the model could not be built with this attention."""
    torch.manual_seed(0)
    try:
        model = AutoModelForCausalLM.from_config(tiny_config(model_type), attn_implementation=attn)
    except Exception as exc:  # noqa: BLE001  (a table cell, not a crash)
        if isinstance(exc, ValueError) and "does not support" in str(exc):  # transformers refuses it
            return "not offered"
        return f"fails to load ({type(exc).__name__})"
    try:
        report = check_packing(model)
    except PadfreeAttentionError as exc:
        return f"refused ({str(exc).split(' does not support ')[-1].split(' (')[0].split(',')[0].strip()})"
    except Exception as exc:  # noqa: BLE001
        return f"fails ({type(exc).__name__})"
    return {"safe": "**safe**", "leaks": "LEAKS"}.get(report.status, report.status)


def table(types: list[str]) -> str:
    lines = [
        f"| model type | {' | '.join(ATTENTION)} |",
        "|---|" + "---|" * len(ATTENTION),
    ]
    for model_type in types:
        lines.append(f"| {model_type} | " + " | ".join(verdict(model_type, attn) for attn in ATTENTION) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", default=",".join(FAMILIES), help="comma-separated model types")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs/probe-families.md")
    args = parser.parse_args(argv)
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    unknown = [t for t in types if t not in transformers.models.auto.configuration_auto.CONFIG_MAPPING]
    if unknown:
        parser.error(f"unknown model type(s) {', '.join(unknown)}; use names like llama, opt, mistral")
    start = time.perf_counter()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # tiny configs trigger config warnings that say nothing about packing
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            body = table(types)
    finally:
        hf_logging.set_verbosity(verbosity)
    text = (
        "# Padding-free safety by model family\n\n"
        f"`python scripts/probe_families.py` with transformers {transformers.__version__}, torch {torch.__version__}: "
        "a tiny random model of each family, probed by `trl_padfree.check_packing` (random sequences packed into "
        "one row vs each alone, train mode, fp32 on CPU).\n\n"
        "- **safe**: packed examples stay apart; `padding_free=True` trains exactly like padding.\n"
        "- LEAKS: packed examples see each other; training would silently differ from padding.\n"
        "- unsupported: the model's attention code never calls `\"padfree\"` (it does not go through "
        "transformers' AttentionInterface).\n"
        "- refused: `\"padfree\"` raises a clear error for a feature it cannot compute exactly.\n"
        "- not offered: transformers does not offer this attention implementation for the model; fails to load: "
        "transformers accepts it but the model cannot be built with it.\n\n"
        f"{body}\n"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(body)
    print(f"\n{len(types)} families in {time.perf_counter() - start:.0f} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
