"""The blog post's "For TRL users" snippet, with the import changed to ``trl_padfree``: it runs as written.

Its ``formatting_prompts_func`` takes a batch (TRL 0.10's convention), on which ``trl.SFTTrainer`` 1.x fails
(``IndexError``); ``trl_padfree.SFTTrainer`` applies it as written. Only what a CPU without a model hub needs is
changed (marked ``# here:``)::

    python examples/blog_snippet.py --max_steps 5 --output_dir /tmp/blog
"""

from __future__ import annotations

import argparse
from pathlib import Path

import trl_padfree

DEMO = Path(trl_padfree.__file__).parent / "demo"
MODEL = str(DEMO / "model")  # here: the blog's "instructlab/merlinite-7b-lab"
DATA = str(DEMO / "data" / "train.jsonl")  # here: the blog's "lucasmccabe-lmi/CodeAlpaca-20k" (same fields)


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max_steps", type=int, default=20)
    parser.add_argument("--output_dir", default="./tmp")
    parser.add_argument("--data_file", default=DATA)
    cli = parser.parse_args(argv)

    import torch  # noqa: I001 (the blog's imports, in its order)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from datasets import load_dataset
    from trl import SFTConfig
    from trl_padfree import SFTTrainer, DataCollatorForCompletionOnlyLM  # was: from trl import ... (same line)

    dataset = load_dataset("json", data_files=cli.data_file, split="train")  # here: a local data set

    model = AutoModelForCausalLM.from_pretrained(
        MODEL,
        torch_dtype=torch.float32,  # here: CPU (the blog: torch.bfloat16)
        attn_implementation="padfree")  # here: any device (the blog: "flash_attention_2", GPU only)
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    tokenizer.pad_token = tokenizer.eos_token

    def formatting_prompts_func(example):
        output_texts = []
        for i in range(len(example['instruction'])):
            text = f"### Question: {example['instruction'][i]}\n ### Answer: {example['output'][i]}"
            output_texts.append(text)
        return output_texts

    response_template = " ### Answer:"
    response_template_ids = tokenizer.encode(response_template, add_special_tokens=False)[2:]
    collator = DataCollatorForCompletionOnlyLM(response_template_ids, tokenizer=tokenizer, padding_free=True)

    trainer = SFTTrainer(
        model,
        train_dataset=dataset,
        args=SFTConfig(
            output_dir=cli.output_dir,
            gradient_checkpointing=True,
            per_device_train_batch_size=8,
            max_steps=cli.max_steps, bf16=False, report_to=[], save_strategy="no",  # here: a few steps on CPU
        ),
        formatting_func=formatting_prompts_func,
        data_collator=collator,
    )

    trainer.train()
    return trainer


if __name__ == "__main__":
    main()
