"""The benchmark's workloads as data: length distributions, model sizes, and per task its trainer, its records and
its variants (what each passes to the trainer's config); :func:`build_trainer` turns one into a trainer.

Every record is text of words ``w<id>`` (plus ``<s>`` and ``</s>``) that :func:`tokenizer` maps one word to one
token id, so a record's token count is its word count and every variant's trainer tokenizes it alike.

>>> tok = tokenizer(64)
>>> tok("<s> w9 w17 </s>")["input_ids"]
[1, 9, 17, 2]
"""

from __future__ import annotations

import math
import zlib
from typing import Any, NamedTuple

import numpy as np

PAD, BOS, EOS, FIRST_WORD = 0, 1, 2, 6

#: Length distributions (tokens): ``(kind, center, spread)``; lognormal: ``exp(N(log(center), spread))``.
LENGTHS: dict[str, tuple[str, float, float]] = {
    "flan": ("lognormal", 340.0, 0.8),  # FLAN-like (arXiv 2407.09105): short, heavy right tail
    "orcamath": ("normal", 400.0, 140.0),  # OrcaMath-like
    "uf-prompt": ("lognormal", 113.0, 0.9),  # UltraFeedback-like prompts (docs/bench/dpo-notes.md)
    "uf-response": ("lognormal", 250.0, 0.6),  # ... and responses
    "rm-prompt": ("lognormal", 64.0, 0.6),  # reward / KTO
    "rm-response": ("lognormal", 96.0, 0.6),
}

#: Model sizes (random-init; nothing is downloaded). ``smollm2-135m``: SmolLM2-135M-Instruct's shape.
MODEL_SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(layers=4, hidden=256, intermediate=688, heads=8, kv_heads=4, vocab_size=2048),
    "0.5b": dict(layers=24, hidden=1280, intermediate=3456, heads=10, kv_heads=2, vocab_size=32000),
    "smollm2-135m": dict(layers=30, hidden=576, intermediate=1536, heads=9, kv_heads=3, vocab_size=49152),
    # Qwen2.5-0.5B's widths and vocabulary, 2 of its 24 layers: where the LM head dominates (docs/head.md)
    "qwen-vocab": dict(layers=2, hidden=896, intermediate=4864, heads=14, kv_heads=2, vocab_size=151936),
}


class Variant(NamedTuple):
    """One way of training a task: this package's trainer or TRL's, the attention, and config fields."""

    name: str
    ours: bool  # trl_padfree's trainer and config (else TRL's)
    attn: str | None = None  # None: the model's default (sdpa)
    fields: dict[str, Any] = {}  # config fields
    opt_in: bool = False  # run only when --variants names it


class Task(NamedTuple):
    """A workload: its trainer, its variants and datasets, its model."""

    trainer: str  # "SFT", "DPO", "GRPO", "RLOO", "Reward", "KTO"
    variants: tuple[Variant, ...]  # the first: the baseline of the ratios
    datasets: tuple[str, ...] = ("",)
    model: str = "llama"  # or "hybrid", "classifier"
    fields: dict[str, Any] = {}  # every variant's config fields


PF = {"padding_free": True}
PADDED, PACKED_SDPA = Variant("padded", False, "sdpa"), Variant("packed-sdpa", True, "sdpa", PF, opt_in=True)
SFT_PADFREE = Variant("sft-padfree", True, "padfree", PF)
_SFT = (PADDED, Variant("trl-native", False, None, PF), SFT_PADFREE,
        Variant("sft-padfree-trl-head", True, "padfree", {**PF, "scored_lm_head": False}, opt_in=True), PACKED_SDPA,
        Variant("token-budget", True, "padfree", {**PF, "max_tokens_per_batch": "mean"}),
        Variant("packed-fa2", True, "flash_attention_2", PF, opt_in=True))
_PAIRS = (Variant("trl-padded", False, "sdpa"), Variant("padding-free", True, "padfree", PF),
          Variant("prompt-once", True, "padfree", {**PF, "prompt_once": True}))
QUIET = {"disable_dropout": True}
TASKS: dict[str, Task] = {
    "sft": Task("SFT", _SFT, ("flan", "orcamath")),
    "hybrid": Task("SFT", (PADDED, SFT_PADFREE, PACKED_SDPA), ("flan", "orcamath"), model="hybrid"),
    "dpo": Task("DPO", _PAIRS, fields={"beta": 0.1, **QUIET}),
    "reward": Task("Reward", _PAIRS, model="classifier", fields=QUIET),
    "kto": Task("KTO", _PAIRS, fields=QUIET),
    "grpo": Task("GRPO", _PAIRS, fields={"beta": 0.04, "loss_type": "dapo"}),
    "rloo": Task("RLOO", _PAIRS, fields={"beta": 0.05}),
}
RL = ("GRPO", "RLOO")
#: ``--task grpo --whole-step``: TRL's defaults for a whole step (no reference model), SGD, SmolLM2-135M's shape.
WHOLE_STEP = {"beta": 0.0, "loss_type": "dapo", "optim": "sgd"}
LR, SEED = 1e-4, 0  # a constant learning rate; the seed of the data and of the initial weights


def lengths(dist: tuple[str, float, float], n: int, rng: np.random.Generator, scale: float, lo: int,
            hi: int) -> list[int]:
    """``n`` lengths of ``dist`` (a :data:`LENGTHS` value) times ``scale``, clipped to ``[lo, hi]``.

    >>> rng = np.random.default_rng(0)
    >>> round(float(np.mean(lengths(LENGTHS["orcamath"], 20_000, rng, 1.0, 2, 2048))) / 10) * 10
    400
    """
    kind, center, spread = dist
    raw = np.exp(rng.normal(math.log(center), spread, n)) if kind == "lognormal" else rng.normal(center, spread, n)
    return np.clip(np.rint(raw * scale), lo, hi).astype(int).tolist()


def words(rng: np.random.Generator, n: int, vocab: int) -> str:
    """``n`` words of ids drawn Zipf-like from the vocabulary (frequent words first)."""
    ranks = np.arange(1, vocab - FIRST_WORD + 1, dtype=np.float64)
    p = 1.0 / (ranks + 2.7) ** 1.1
    return " ".join(f"w{i}" for i in rng.choice(ranks.size, size=n, p=p / p.sum()) + FIRST_WORD)


def records(task: str, dataset: str, n: int, *, vocab: int, scale: float, max_length: int,
            prompt_mean: int = 150) -> list[dict[str, Any]]:
    """``n`` seeded records of ``task`` (the same in every process).

    >>> [r["prompt"].split()[0] for r in records("sft", "flan", 2, vocab=64, scale=0.05, max_length=64)]
    ['<s>', '<s>']
    >>> sorted(records("dpo", "", 1, vocab=64, scale=0.05, max_length=64)[0])
    ['chosen', 'prompt', 'rejected']
    """
    rng = np.random.default_rng([SEED, zlib.crc32(f"{task}/{dataset}".encode())])

    def draw(dist: tuple[str, float, float], lo: int = 2) -> list[int]:
        return lengths(dist, n, rng, scale, lo, max(4, max_length))

    def text(k: int) -> str:
        return words(rng, k, vocab)

    if task in ("sft", "hybrid"):
        prompts = [(max(1, round(0.7 * (total - 2))), total) for total in draw(LENGTHS[dataset], 4)]
        return [{"prompt": "<s> " + text(p), "completion": " " + text(total - 2 - p) + " </s>"} for p, total in prompts]
    if task in ("grpo", "rloo"):
        return [{"prompt": text(k)} for k in draw(("normal", prompt_mean, prompt_mean / 5), 4)]
    prefix = "uf" if task == "dpo" else "rm"
    p, c, r = (draw(LENGTHS[f"{prefix}-{part}"]) for part in ("prompt", "response", "response"))
    if task == "kto":
        return [{"prompt": text(a), "completion": " " + text(b), "label": bool(rng.random() < 0.5)}
                for a, b in zip(p, c, strict=True)]
    return [{"prompt": text(a), "chosen": " " + text(b) + " </s>", "rejected": " " + text(d) + " </s>"}
            for a, b, d in zip(p, c, r, strict=True)]


def tokenizer(vocab: int):
    """A word-level ``PreTrainedTokenizerFast``: ``w<i>`` is id ``i``; ``<pad>``, ``<s>``, ``</s>`` are 0, 1, 2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    names = {PAD: "<pad>", BOS: "<s>", EOS: "</s>"}
    raw = Tokenizer(models.WordLevel({names.get(i, f"w{i}"): i for i in range(vocab)}, unk_token="<pad>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def build_model(kind: str, shape: dict[str, int], attn: str | None, dtype: str):
    """The seeded random-init model (the same weights in every variant): a Llama (``kind`` llama, or classifier with
    a score head), or a Qwen3.5-like hybrid of three gated-delta-rule layers to one full-attention layer."""
    import torch
    import transformers

    config = dict(vocab_size=shape["vocab_size"], hidden_size=shape["hidden"], intermediate_size=shape["intermediate"],
                  num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                  num_key_value_heads=shape["kv_heads"], max_position_embeddings=4096, pad_token_id=PAD,
                  bos_token_id=BOS, eos_token_id=EOS, tie_word_embeddings=False, use_cache=False)
    if kind == "hybrid":  # the linear-attention widths that flops.py counts
        types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(shape["layers"])]
        config = transformers.Qwen3_5TextConfig(
            **config, layer_types=types, head_dim=shape["hidden"] // shape["heads"], linear_num_key_heads=4,
            linear_num_value_heads=8, linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4)
    else:
        config = transformers.LlamaConfig(**config, num_labels=1)
    torch.manual_seed(SEED)
    auto = getattr(transformers, "AutoModelFor" + ("SequenceClassification" if kind == "classifier" else "CausalLM"))
    model = auto.from_config(config, dtype=getattr(torch, dtype), **({"attn_implementation": attn} if attn else {}))
    if kind == "hybrid":
        from trl_padfree.recurrent import prepare_packed_layers

        prepare_packed_layers(model)  # as this package's trainers do
    return model


def build_trainer(task: str, variant: Variant, opts: Any, data: list[dict[str, Any]], out: str) -> Any:
    """The trainer of ``variant`` on ``data``: TRL's or this package's, its config from TRL's training arguments,
    the task's fields and the variant's (``opts``: the parsed command line)."""
    import datasets
    import torch
    import trl

    import trl_padfree

    spec, lib = TASKS[task], trl_padfree if variant.ours else trl
    fields = dict(output_dir=out, per_device_train_batch_size=opts.batch_size, max_steps=opts.warmup + opts.steps,
                  learning_rate=LR, lr_scheduler_type="constant", max_grad_norm=0.0, logging_steps=1,
                  save_strategy="no", report_to="none", disable_tqdm=True, use_cpu=opts.device == "cpu",
                  bf16=opts.dtype == "bfloat16", seed=SEED, dataloader_num_workers=0, gradient_checkpointing=False,
                  **spec.fields | (WHOLE_STEP if opts.whole_step else {}))
    if variant.ours:
        fields.update(check_packing=False, torch_num_threads=None)
    if spec.trainer in RL:
        rows = opts.groups * opts.gens
        batch = min(opts.batch_size, rows)
        fields.update(per_device_train_batch_size=batch, gradient_accumulation_steps=max(1, rows // batch),
                      num_generations=opts.gens, max_completion_length=opts.completion, shuffle_dataset=False,
                      generation_kwargs={"min_new_tokens": opts.completion},  # every completion the same length
                      model_init_kwargs={"attn_implementation": variant.attn or "sdpa", "dtype": opts.dtype})
    else:  # the same records in the same batches in every variant; the records are already clipped
        fields.update(train_sampling_strategy="sequential", max_length=None)
    fields.update(variant.fields)
    if fields.get("max_tokens_per_batch") == "mean":  # the fixed batches' mean real tokens
        fields["max_tokens_per_batch"] = max(1, round(sum(map(record_tokens, data)) / len(data) * opts.batch_size))
    args = getattr(lib, f"{spec.trainer}Config")(**fields)
    trainer_class = getattr(lib, f"{spec.trainer}Trainer")
    tok, dataset = tokenizer(opts.shape["vocab_size"]), datasets.Dataset.from_list(data)
    model = build_model(spec.model, opts.shape, variant.attn, opts.dtype)
    if spec.trainer in RL:  # TRL loads the policy (and its reference) from a path
        model.save_pretrained(f"{out}/model")
        tok.save_pretrained(f"{out}/model")
        reward = lambda completions, **_: [zlib.crc32(str(c).encode()) % 97 / 97 for c in completions]  # noqa: E731
        return trainer_class(f"{out}/model", reward_funcs=reward, args=args, train_dataset=dataset,
                             processing_class=tok)
    extra = {"optimizers": (torch.optim.AdamW(model.parameters(), lr=LR), None)}
    if spec.trainer == "SFT" and variant.ours:  # completion-only labels from TRL's completion_mask
        extra["data_collator"] = trl_padfree.DataCollatorForCompletionOnlyLM(None, padding_free=True)
    if spec.trainer in ("DPO", "KTO"):
        extra["ref_model"] = build_model(spec.model, opts.shape, variant.attn, opts.dtype)
    return trainer_class(model, args=args, train_dataset=dataset, processing_class=tok, **extra)


IDS = ("input_ids", "prompt_ids", "chosen_ids", "rejected_ids", "completion_ids")


def record_tokens(record: dict[str, Any]) -> int:
    """The tokens of a record (text: one token a word; ids as they are), each part once.

    >>> record_tokens({"prompt": "<s> w7 w9", "completion": " w3 </s>"}), record_tokens({"input_ids": [1, 2]})
    (5, 2)
    """
    ids = [record[k] for k in IDS if k in record]
    return sum(map(len, ids)) if ids else sum(len(v.split()) for v in record.values() if isinstance(v, str))
