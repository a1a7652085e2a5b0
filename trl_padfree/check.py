"""``trl-padfree check``: the packing probe (:func:`trl_padfree.probe.check_packing`) from the command line.

Loads a model (local directory or hub name) with the attention implementation to test (default ``auto``: the one
``trl-padfree train`` would use here, with the same fall-back to the model's own attention for models that cannot
use ``padfree``, see :mod:`.attn_fallback`), runs the probe and prints the verdict. Options take either spelling
(``--attn-implementation`` or ``--attn_implementation``, as ``train`` does). Exit status: 0 safe, 1 leaks (or
cannot tell), 2 bad input (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import torch

from .attention import pick_attn_implementation
from .attn_fallback import ModelLoadError, load_with_fallback
from .probe import DEFAULT_LENGTHS, check_packing

__all__ = ["main"]


_DTYPES = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trl-padfree check",
        description="Probe whether a causal LM keeps padding-free packed examples apart: random sequences packed "
        "into one row vs each alone. Exit status: 0 safe, 1 leaks (or cannot tell), 2 bad input.",
    )
    parser.add_argument("--model", required=True, help="local model directory or hub name")
    parser.add_argument(
        "--attn-implementation", "--attn_implementation", dest="attn_implementation", default="auto", help="auto, padfree, sdpa, eager, flash_attention_2, ... (default: auto, what `trl-padfree train` picks on "
        "this device: flash_attention_2 where usable, else padfree; a model that cannot use padfree is checked "
        "with its own default attention, as train falls back to it); 'default' checks the model's own choice",
    )
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default="auto", help="default: the checkpoint's dtype")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: cuda if available)")
    parser.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)), help="comma-separated lengths")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trust-remote-code", "--trust_remote_code", dest="trust_remote_code", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def _load(model_path: str, attn: str | None, args: argparse.Namespace, device: str) -> Any:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Loading weights" bars: the verdict is the output
    kwargs: dict[str, Any] = {"dtype": _DTYPES[args.dtype], "trust_remote_code": args.trust_remote_code}
    if attn is not None:
        kwargs["attn_implementation"] = attn
    return AutoModelForCausalLM.from_pretrained(model_path, **kwargs).to(device)


def main(argv: list[str] | None = None) -> int:
    """``trl-padfree check``: print the verdict; return 0 when safe, 1 when not, 2 on bad input."""
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    def bad(message: str) -> int:
        print(f"trl-padfree check: {message}", file=sys.stderr)
        return 2

    try:
        lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    except ValueError:
        return bad(f"--lengths must be comma-separated integers, got {args.lengths!r}.")
    if len(lengths) < 2 or min(lengths) < 1:
        return bad(f"--lengths needs at least 2 lengths >= 1, got {args.lengths!r}.")
    from .launch.demo import package_path

    args.model = package_path(args.model)  # trl_padfree/demo/model from any directory: the installed package's
    model_path = os.path.expanduser(args.model)
    name = args.model  # only a local path when it cannot be a hub name (``name`` or ``org/name``)
    local = name.startswith(("/", ".", "~")) or os.path.isabs(name) or name.count("/") > 1 or "\\" in name
    if local and not os.path.exists(model_path):
        return bad(f"model path {args.model!r} does not exist; pass a model directory (config.json + weights).")
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    try:
        torch.device(device)
    except RuntimeError:
        return bad(f"--device {args.device!r} is not a device; use cpu, cuda or cuda:N.")
    if device.startswith("cuda") and not torch.cuda.is_available():
        return bad(f"--device {args.device!r} asked for, but CUDA is not available here; use --device cpu.")
    from .launch.validate import check_attn_implementation

    try:
        check_attn_implementation(args.attn_implementation, own=("auto", "default"))
    except ValueError as exc:
        return bad(str(exc))
    auto = args.attn_implementation == "auto"  # as `trl-padfree train` resolves it; "default": the model's own
    attn = {"auto": pick_attn_implementation(device), "default": None}.get(args.attn_implementation,
                                                                           args.attn_implementation)

    def note(message: str) -> None:  # stdout stays pure JSON with --json
        print(f"note: {message}", file=sys.stderr if args.json else sys.stdout)

    if auto:
        note(f"attn_implementation auto -> {attn!r} (what trl-padfree train picks on {device})")

    def fall_back(why: str) -> None:
        note(f"{args.model} cannot use 'padfree' ({why}); checking its default attention, as trl-padfree train "
             "would")

    try:
        model = load_with_fallback(lambda name: _load(model_path, name, args, device), attn, auto=auto,
                                   on_fallback=fall_back)
    except ModelLoadError as exc:
        return bad(f"cannot load {args.model!r}: {exc}")
    try:
        report = check_packing(model, lengths=lengths, seed=args.seed)
    except ValueError as exc:
        return bad(str(exc))
    print(json.dumps(report.to_dict(), indent=2) if args.json else str(report))
    return 0 if report.ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
