"""Test-only torchrun script for tests/test_trainer_equivalence.py: padded vs padding-free on 2 DDP ranks
(``average_tokens_across_devices`` on and off, a token budget); rank 0 writes ``results.json`` and the weights."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def per_rank(trainer) -> dict:
    """What ``trainer`` recorded on every rank (gathered from both): ``{name: {"0": ..., "1": ...}}``."""
    import torch.distributed as dist

    gathered = [None, None]
    dist.all_gather_object(gathered, {"batch_ids": trainer.batch_ids, "num_items": trainer.num_items,
                                      "trained_tokens": trainer.trained_tokens})
    return {name: {str(r): gathered[r][name] for r in range(2)} for name in gathered[0]}


def run(out: Path) -> None:
    import torch
    import torch.distributed as dist
    from tiny_sft import losses, make_trainer, tokenized_dataset, tokenizer, weights

    from trl_padfree.launch.distributed import finish

    tok = tokenizer()
    data = tokenized_dataset(tok, 48)
    results = {}
    for average_tokens in (True, False):
        for padding_free in (False, True):
            key = f"padding_free={padding_free},average_tokens={average_tokens}"
            trainer = make_trainer(padding_free, data, tok, str(out / key), per_device_train_batch_size=4,
                                   gradient_accumulation_steps=2, max_steps=3,
                                   average_tokens_across_devices=average_tokens)
            trainer.train()
            results[key] = {"world_size": trainer.args.world_size, "losses": losses(trainer), **per_rank(trainer),
                            "lm_head_state": trainer.lm_head_state}
            if dist.get_rank() == 0:
                torch.save(weights(trainer), out / f"{key}.pt")
            elif padding_free and average_tokens:  # rank 1's weights: DDP kept them in sync through the LM head
                torch.save(weights(trainer), out / "rank1.pt")
    # TRL's fused head instead of the scored-positions head (the padding-free run with averaged tokens)
    trainer = make_trainer(True, data, tok, str(out / "trl_head"), per_device_train_batch_size=4,
                           gradient_accumulation_steps=2, max_steps=3, scored_lm_head=False)
    trainer.train()
    results["trl_head"] = {"world_size": trainer.args.world_size, "losses": losses(trainer),
                           "lm_head_state": trainer.lm_head_state}
    if dist.get_rank() == 0:
        torch.save(weights(trainer), out / "trl_head.pt")
    # token-budget batches (padding-free): every rank builds its own share of the same stream of batches
    trainer = make_trainer(True, data, tok, str(out / "budget"), max_tokens_per_batch=150,
                           gradient_accumulation_steps=2, max_steps=3)
    trainer.train()
    budget = per_rank(trainer)
    if dist.get_rank() == 0:
        (out / "results.json").write_text(json.dumps({"runs": results, "budget": budget}))
    del trainer
    finish(0)  # barrier, then destroy the process group (launch.distributed)


if __name__ == "__main__":
    run(Path(sys.argv[1]))
