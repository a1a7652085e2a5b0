"""Padding-free GRPO of the demo model on its questions, rewarding the share of the known answer's words.

    python examples/grpo_padfree.py --max_steps 5 --output_dir /tmp/example-grpo

For your own model, prompts and rewards, change ``MODEL``, the data file and ``reward_answer``; keep the settings
marked (1)-(3). ``RLOOTrainer`` with an ``RLOOConfig`` takes the same arguments.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from datasets import load_dataset
from transformers import AutoTokenizer

import trl_padfree
from trl_padfree import GRPOConfig, GRPOTrainer  # TRL's GRPOConfig / GRPOTrainer, with padding_free=True

DEMO = Path(trl_padfree.__file__).parent / "demo"
MODEL = str(DEMO / "model")  # or e.g. "Qwen/Qwen2.5-0.5B-Instruct"


def reward_answer(completions: list[str], chosen: list[str], **kwargs) -> list[float]:
    """The share of the known answer's words (TRL passes the dataset's ``chosen`` column) in the completion."""
    scores = []
    for completion, answer in zip(completions, chosen, strict=True):
        want, got = answer.split(), set(completion.split())
        scores.append(sum(word in got for word in want) / max(len(want), 1))
    return scores


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max_steps", type=int, default=50)
    parser.add_argument("--output_dir", default="outputs/example-grpo")
    args = parser.parse_args(argv)

    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    prompts = load_dataset("json", data_files=str(DEMO / "data" / "pref_train.jsonl"), split="train")
    gpu = torch.cuda.is_available()
    config = GRPOConfig(
        output_dir=args.output_dir,
        # (1) "padfree" attention for the policy and the reference: keeps the packed sequences apart on any device,
        # and alone reads the shared prompt
        model_init_kwargs={"attn_implementation": "padfree"},
        padding_free=True,  # (2) the log-prob forwards run on one flat row per micro-batch, no padding
        prompt_once=True,  # (3) a group's completions in a micro-batch share one forwarded copy of the prompt
        max_steps=args.max_steps, per_device_train_batch_size=8, num_generations=4, max_completion_length=24,
        learning_rate=1e-4, beta=0.04, logging_steps=5, activation_checkpointing=False,
        bf16=gpu and torch.cuda.is_bf16_supported(), dataloader_pin_memory=gpu, save_strategy="no", report_to="none",
    )
    trainer = GRPOTrainer(
        MODEL, reward_funcs=reward_answer, args=config, train_dataset=prompts, processing_class=tokenizer
    )
    result = trainer.train()
    trainer.save_model()
    rewards = [e["reward"] for e in trainer.state.log_history if "reward" in e]
    totals = trainer.pack_totals["no_grad"]
    print(f"forwarded {totals['forwarded_tokens']} of {totals['padded_tokens']} padded tokens (no-grad forwards)")
    print(f"train loss {result.training_loss:.3f} over {result.global_step} steps, mean reward "
          f"{rewards[0]:.2f} first, {rewards[-1]:.2f} last; saved to {args.output_dir}")


if __name__ == "__main__":
    main()
