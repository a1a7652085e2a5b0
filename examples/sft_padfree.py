"""Padding-free, completion-only fine-tuning of the demo model, on CPU or GPU: the README's example.

    python examples/sft_padfree.py --max_steps 20 --output_dir /tmp/example

For your own model and data, change ``MODEL`` and ``load_records``; keep the settings marked (1)-(3).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from datasets import Dataset, load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig

import trl_padfree
from trl_padfree import DataCollatorForCompletionOnlyLM, SFTTrainer  # SFTTrainer: TRL's, plus checks

DEMO = Path(trl_padfree.__file__).parent / "demo"
MODEL = str(DEMO / "model")  # or e.g. "Qwen/Qwen2.5-0.5B"


def load_records() -> Dataset:
    """Records with a ``text`` field: question and answer, the answer after ``### Answer:``."""
    raw = load_dataset("json", data_files=str(DEMO / "data" / "train.jsonl"), split="train")
    return raw.map(
        lambda r: {"text": f"### Question: {r['instruction']}\n### Answer: {r['output']}"},
        remove_columns=raw.column_names,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max_steps", type=int, default=100)
    parser.add_argument("--output_dir", default="outputs/example")
    args = parser.parse_args(argv)

    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    dataset = load_records()
    # (1) the collator masks everything up to "### Answer:" and flattens each batch into one row without padding
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tokenizer, padding_free=True)
    # (2) an attention that keeps packed examples apart: "padfree" (any device) or "flash_attention_2"
    model = AutoModelForCausalLM.from_pretrained(MODEL, attn_implementation="padfree")
    gpu = torch.cuda.is_available()
    config = SFTConfig(
        output_dir=args.output_dir,
        padding_free=False,  # (3) the collator flattens; TRL's own padding_free refuses a custom collator
        max_steps=args.max_steps, per_device_train_batch_size=8, learning_rate=1e-3, lr_scheduler_type="cosine",
        bf16=gpu and torch.cuda.is_bf16_supported(),  # TRL's default (True) refuses to start on a CPU
        activation_checkpointing=False,  # TRL turns it on by default; it pays only for large models on a GPU
        dataloader_pin_memory=gpu, logging_steps=10, save_strategy="no", report_to="none",
    )
    trainer = SFTTrainer(
        model, args=config, train_dataset=dataset, processing_class=tokenizer, data_collator=collator
    )
    result = trainer.train()
    trainer.save_model()
    print(f"train loss {result.training_loss:.3f} over {result.global_step} steps; saved to {args.output_dir}")


if __name__ == "__main__":
    main()
