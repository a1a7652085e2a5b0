"""Padding-free DPO of the demo model on its preference pairs, on CPU or GPU.

    python examples/dpo_padfree.py --max_steps 20 --output_dir /tmp/example-dpo

For your own model and data, change ``MODEL`` and the data file (``prompt``, ``chosen``, ``rejected`` records);
keep the settings marked (1)-(3).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

import trl_padfree
from trl_padfree import DPOConfig, DPOTrainer  # TRL's DPOConfig / DPOTrainer, with padding_free=True working

DEMO = Path(trl_padfree.__file__).parent / "demo"
MODEL = str(DEMO / "model")  # or e.g. "Qwen/Qwen2.5-0.5B-Instruct"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max_steps", type=int, default=100)
    parser.add_argument("--output_dir", default="outputs/example-dpo")
    args = parser.parse_args(argv)

    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    pairs = load_dataset("json", data_files=str(DEMO / "data" / "pref_train.jsonl"), split="train")
    # (1) "padfree" attention: keeps the packed sequences apart on any device, and alone reads the shared prompt
    model = AutoModelForCausalLM.from_pretrained(MODEL, attn_implementation="padfree")
    ref_model = AutoModelForCausalLM.from_pretrained(MODEL, attn_implementation="padfree")
    gpu = torch.cuda.is_available()
    config = DPOConfig(
        output_dir=args.output_dir,
        padding_free=True,  # (2) one row per batch, no padding (TRL 1.16 would pad)
        prompt_once=True,  # (3) each pair's prompt computed once, shared by the chosen and the rejected response
        max_steps=args.max_steps, per_device_train_batch_size=8, learning_rate=1e-3, beta=0.1, logging_steps=10,
        bf16=gpu and torch.cuda.is_bf16_supported(), activation_checkpointing=False, dataloader_pin_memory=gpu,
        save_strategy="no", report_to="none",
    )
    trainer = DPOTrainer(model, ref_model, args=config, train_dataset=pairs, processing_class=tokenizer)
    result = trainer.train()
    trainer.save_model()
    last = next(e for e in reversed(trainer.state.log_history) if "rewards/accuracies" in e)
    print(f"train loss {result.training_loss:.3f} over {result.global_step} steps, reward accuracy "
          f"{last['rewards/accuracies']:.2f}; saved to {args.output_dir}")


if __name__ == "__main__":
    main()
