"""Build real tokenizers of 15 model families, once, from llama.cpp's vocabulary files (no model hub needed).

``llama-cpp-python``'s source archive (pinned) vendors llama.cpp's vocabulary-only GGUF files with test strings and
the ids the original tokenizers gave them (``.inp`` / ``.out``) and chat templates. This script downloads it with
pip, rebuilds each tokenizer from the GGUF fields (transformers' GGUF conversion drops settings of the originals):
sentencepiece vocabularies with their legacy pre-processing and byte fallback, byte-level BPE with llama.cpp's
pre-tokenizer regexes (read from ``llama-vocab.cpp``), Gemma-4's BPE on raw UTF-8; checks each against the ``.out``
ids and saves it with its chat template. ``manifest.json``, written last, marks the cache complete::

    python scripts/real_tokenizers.py            # into .cache/real-tokenizers (skipped when already complete)
    python scripts/real_tokenizers.py --sdist llama_cpp_python-0.3.36.tar.gz   # from an archive at hand
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SDIST_PACKAGE = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
DEFAULT_OUT = Path(__file__).resolve().parent.parent / ".cache" / "real-tokenizers"
MODELS = "vendor/llama.cpp/models/"
VOCAB_SOURCE = "vendor/llama.cpp/src/llama-vocab.cpp"

# The GGUF's tokenizer.ggml.pre -> llama.cpp's pre-tokenizer case in src/llama-vocab.cpp (llm_tokenizer_bpe), whose
# regexes are read from the archive's source: each one splits the pieces left by the previous one.
PRE_CASES = {
    "gpt-2": "GPT2", "mpt": "MPT", "llama-bpe": "LLAMA3", "qwen2": "QWEN2", "falcon": "FALCON",
    "starcoder": "STARCODER", "refact": "REFACT", "command-r": "COMMAND_R", "deepseek-llm": "DEEPSEEK_LLM",
    "deepseek-coder": "DEEPSEEK_CODER", "qwen35": "QWEN35",
}


def pre_regexes(source: str, pre: str) -> list[str]:
    """The regexes llama.cpp applies for the pre-tokenizer type ``pre``, read from ``llama-vocab.cpp``."""
    at = source.index(f"case LLAMA_VOCAB_PRE_TYPE_{PRE_CASES[pre]}:")
    begin = source.index("{", source.index("regex_exprs", at)) + 1
    body = "\n".join(line for line in source[begin : source.index("};", begin)].splitlines()
                     if not line.strip().startswith("//"))
    escapes = {"n": "\n", "r": "\r", "t": "\t"}
    return [re.sub(r"\\(.)", lambda m: escapes.get(m.group(1), m.group(1)), lit)
            for lit in re.findall(r'"((?:[^"\\]|\\.)*)"', body)]


IGNORE_MERGES = {"llama-bpe"}

# Chat templates of families whose template is not in the archive (the published ones, verbatim).
LLAMA2_CHAT = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)
MISTRAL_INST = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)
DEEPSEEK_LLM_CHAT = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ 'User: ' + message['content'] + '\\n\\n' }}{% elif message['role'] == 'assistant' %}"
    "{{ 'Assistant: ' + message['content'] + eos_token }}{% elif message['role'] == 'system' %}"
    "{{ message['content'] + '\\n\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
DEEPSEEK_CODER_CHAT = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{%- set ns = namespace(found=false) -%}{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{%- set ns.found = true -%}{%- endif -%}{%- endfor -%}"
    "{{bos_token}}{%- if not ns.found -%}"
    "{{'You are an AI programming assistant, utilizing the Deepseek Coder model, developed by Deepseek Company, "
    "and you only answer questions related to computer science. For politically sensitive questions, security "
    "and privacy issues, and other non-computer science questions, you will refuse to answer\\n'}}"
    "{%- endif %}{%- for message in messages %}{%- if message['role'] == 'system' %}"
    "{{ message['content'] }}{%- else %}{%- if message['role'] == 'user' %}"
    "{{'### Instruction:\\n' + message['content'] + '\\n'}}{%- else %}"
    "{{'### Response:\\n' + message['content'] + '\\n<|EOT|>\\n'}}{%- endif %}{%- endif %}{%- endfor %}"
    "{% if add_generation_prompt %}{{'### Response:'}}{% endif %}"
)

#: family -> (GGUF vocabulary, chat template: a file under models/templates, "gguf" for the one embedded in the
#: vocabulary, a literal template, or None)
FAMILIES: dict[str, tuple[str, str | None]] = {
    "llama-2": ("llama-spm", LLAMA2_CHAT), "mistral-inst": ("llama-spm", MISTRAL_INST),
    "llama-3": ("llama-bpe", "meta-llama-Llama-3.1-8B-Instruct.jinja"),
    "qwen2": ("qwen2", "Qwen-Qwen2.5-7B-Instruct.jinja"), "qwen3.5": ("qwen35", "Qwen3.5-4B.jinja"),
    "phi-3": ("phi-3", "microsoft-Phi-3.5-mini-instruct.jinja"),
    "gpt-2": ("gpt-2", None), "falcon": ("falcon", None), "mpt": ("mpt", None), "starcoder": ("starcoder", None),
    "refact": ("refact", None), "deepseek-llm": ("deepseek-llm", DEEPSEEK_LLM_CHAT),
    "deepseek-coder": ("deepseek-coder", DEEPSEEK_CODER_CHAT), "command-r": ("command-r", "gguf"),
    "gemma-4": ("gemma-4", "gguf"),
}  # fmt: skip

SEPARATOR = "\n__ggml_vocab_test__\n"


def vocab_cases(inp: str, out: str) -> list[tuple[str, list[int]]]:
    """The test strings of a ``.inp`` file with the original tokenizer's ids from the matching ``.out`` file."""
    texts = inp.split(SEPARATOR)
    if texts and texts[-1].endswith("\n__ggml_vocab_test__"):
        texts[-1] = texts[-1][: -len("\n__ggml_vocab_test__")]
    ids = [[int(x) for x in line.split()] for line in out.split("\n")]
    return list(zip(texts, ids[: len(texts)], strict=True))


def read_gguf(path: Path) -> dict:
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    info: dict = {}
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            info[key] = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        elif key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            info[key] = [field.parts[i][0].item() for i in field.data]
        else:
            info[key] = field.contents()
    return info


def _added_tokens(tokens: list[str], types: list[int], rstrip: set[int]) -> list[dict]:
    """Control (3) and user-defined (4) tokens as added tokens; control tokens are special."""
    return [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": i in rstrip, "normalized": False,
             "special": kind == 3} for i, (t, kind) in enumerate(zip(tokens, types, strict=True)) if kind in (3, 4)]


def _bpe_model(tokens: list[str], merges: list[list[str]], **extra) -> dict:
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    return {"type": "BPE", "dropout": None, "unk_token": extra.pop("unk_token", None), "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": extra.pop("fuse_unk", False),
            "byte_fallback": extra.pop("byte_fallback", False), "ignore_merges": extra.pop("ignore_merges", False),
            "vocab": vocab, "merges": merges}


def _spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[list[str]]:
    """Merges of a sentencepiece BPE vocabulary, ordered by the score of the merged piece (as transformers does)."""
    vocab = {t: i for i, t in enumerate(tokens) if types[i] == 1}
    merges = []
    for piece, i in vocab.items():
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                merges.append((scores[i], vocab[left], vocab[right], left, right))
    merges.sort(key=lambda m: (-m[0], m[1], m[2]))
    return [[m[3], m[4]] for m in merges]


def _bos_processor(bos: str, bos_id: int) -> dict:
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}


def tokenizer_json(info: dict, vocab_name: str, source: str) -> dict:
    """A ``tokenizer.json`` (as a dict) for one GGUF vocabulary (``source``: llama.cpp's ``llama-vocab.cpp``)."""
    tokens, types = info["tokenizer.ggml.tokens"], info["tokenizer.ggml.token_type"]
    kind = info["tokenizer.ggml.model"]
    rstrip: set[int] = set()
    if vocab_name == "phi-3":  # the original's chat tokens (<|assistant|>, <|end|>, placeholders ...) strip right
        rstrip = {i for i, t in enumerate(tokens) if types[i] == 4 or (types[i] == 3 and i > 32000)}
    spec: dict = {"version": "1.0", "truncation": None, "padding": None,
                  "added_tokens": _added_tokens(tokens, types, rstrip)}
    if kind == "llama":
        merges = _spm_merges(tokens, info["tokenizer.ggml.scores"], types)
        spec["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
        spec["pre_tokenizer"] = None
        spec["model"] = _bpe_model(tokens, merges, unk_token=tokens[info.get("tokenizer.ggml.unknown_token_id", 0)],
                                   fuse_unk=True, byte_fallback=True)
        spec["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    elif kind == "gpt2":
        pre = info.get("tokenizer.ggml.pre", "gpt-2")
        splits = [{"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False}
                  for r in pre_regexes(source, pre)]
        spec["normalizer"] = None
        spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            *splits, {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
        merges = [m.split(" ", 1) for m in info["tokenizer.ggml.merges"]]
        spec["model"] = _bpe_model(tokens, merges, ignore_merges=pre in IGNORE_MERGES)
        spec["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    elif kind == "gemma4":
        spec["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
        spec["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "[^\\n]+|[\\n]+"}, "behavior": "Isolated",
                                 "invert": False}
        merges = [m.split(" ", 1) for m in info["tokenizer.ggml.merges"]]
        spec["model"] = _bpe_model(tokens, merges, unk_token=tokens[info.get("tokenizer.ggml.unknown_token_id", 3)],
                                   byte_fallback=True)
        spec["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}]}
    else:
        raise ValueError(f"{vocab_name}: tokenizer model {kind!r} is not handled")
    bos_id = info.get("tokenizer.ggml.bos_token_id")
    add_bos = info.get("tokenizer.ggml.add_bos_token", info.get("tokenizer.ggml.pre") == "llama-bpe")
    spec["post_processor"] = _bos_processor(tokens[bos_id], bos_id) if add_bos and bos_id is not None else None
    return spec


def build_tokenizer(info: dict, vocab_name: str, chat_template: str | None, source: str):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokens = info["tokenizer.ggml.tokens"]
    backend = Tokenizer.from_str(json.dumps(tokenizer_json(info, vocab_name, source)))
    special = {f"{name}_token": tokens[i] for name, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"),
                                                          ("pad", "padding"))
               if (i := info.get(f"tokenizer.ggml.{key}_token_id")) is not None}
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False, **special)
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


def check_against_out(tok, cases: list[tuple[str, list[int]]]) -> list[str]:
    """Mismatches between the tokenizer and the original tokenizer's ids (empty when faithful)."""
    return [f"{text[:30]!r}: got {got[:8]}, original {want[:8]}" for text, want in cases
            if (got := tok.encode(text, add_special_tokens=False)) != want]


def download_sdist(into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
           f"{SDIST_PACKAGE}=={SDIST_VERSION}", "-d", str(into)]
    subprocess.run(cmd, check=True)
    found = sorted(into.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        raise SystemExit(f"pip download left no llama_cpp_python-*.tar.gz in {into}")
    return found[0]


def extract(sdist: Path, into: Path) -> Path:
    """Extract only the vocabulary files, chat templates and ``llama-vocab.cpp``; returns the models/ directory."""
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.endswith(VOCAB_SOURCE) or (
            MODELS in m.name and ("/ggml-vocab-" in m.name or "/templates/" in m.name))]
        if not members:
            raise SystemExit(f"{sdist} holds no {MODELS}ggml-vocab-* files")
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
            tar.extractall(into, members=members, filter="data")
        else:
            tar.extractall(into, members=members)
    root = next(m.name for m in members if MODELS in m.name).split(MODELS)[0]
    return into / root / MODELS


def build_all(models: Path, out: Path) -> dict:
    manifest: dict = {"source": f"{SDIST_PACKAGE}=={SDIST_VERSION}", "families": {}}
    infos: dict[str, dict] = {}
    source = (models.parent / "src" / "llama-vocab.cpp").read_text(encoding="utf-8")
    for family, (vocab, template_src) in FAMILIES.items():
        if vocab not in infos:
            infos[vocab] = read_gguf(models / f"ggml-vocab-{vocab}.gguf")
        info, template = infos[vocab], template_src
        if template_src == "gguf":
            template = info["tokenizer.chat_template"]
        elif template_src and template_src.endswith(".jinja"):
            template = (models / "templates" / template_src).read_text(encoding="utf-8")
        tok = build_tokenizer(info, vocab, template, source)
        inp = (models / f"ggml-vocab-{vocab}.gguf.inp").read_text(encoding="utf-8")
        outp = (models / f"ggml-vocab-{vocab}.gguf.out").read_text(encoding="utf-8")
        bad = check_against_out(tok, vocab_cases(inp, outp))
        target = out / family
        tok.save_pretrained(str(target))
        (target / "vocab-test.inp").write_text(inp, encoding="utf-8")
        (target / "vocab-test.out").write_text(outp, encoding="utf-8")
        manifest["families"][family] = {"vocab": f"ggml-vocab-{vocab}.gguf", "template": template_src and (
            template_src if len(template_src) < 80 else "written in scripts/real_tokenizers.py"),
            "vocab_size": len(tok), "out_mismatches": len(bad)}
        status = "ok" if not bad else f"{len(bad)} MISMATCHES, first: {bad[0]}"
        print(f"{family:15s} {vocab:15s} {len(tok):7d} tokens  .out check: {status}", flush=True)
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="cache directory (default: %(default)s)")
    parser.add_argument("--sdist", type=Path, help="use this llama-cpp-python source archive instead of downloading")
    parser.add_argument("--force", action="store_true", help="rebuild even when the cache is complete")
    args = parser.parse_args(argv)
    if (args.out / "manifest.json").exists() and not args.force:
        print(f"{args.out} is complete (manifest.json present); --force rebuilds it")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        sdist = args.sdist or download_sdist(Path(tmp))
        models = extract(sdist, Path(tmp))
        if args.out.exists():
            shutil.rmtree(args.out)
        args.out.mkdir(parents=True)
        manifest = build_all(models, args.out)
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {len(manifest['families'])} tokenizers to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
