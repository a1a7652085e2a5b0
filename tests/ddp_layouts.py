"""Test-only torchrun script: ``ddp_layouts.py dpo|kto|reward OUT`` (``layout_runs.ddp_runs``) trains every layout on
2 DDP ranks, rank 0 writing ``OUT/results.json`` and ``OUT/LAYOUT.pt`` (gradients, final weights); ``ddp_layouts.py rl
OUT`` (tests/test_grpo.py) runs GRPO (``bnpo``) and RLOO in every layout, rank 0 writing ``OUT/KIND-LAYOUT.pt``;
``ddp_layouts.py sft OUT`` (tests/test_trainer_equivalence.py): padded vs padding-free SFT
(``average_tokens_across_devices`` on and off, a token budget), rank 0 writing ``results.json`` and the weights. Each
rank writes ``rankN.done``."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path


def setup(trainer: str) -> tuple:
    """The trainer's set-up module (tests/tiny_*.py), its 32 training records and its own settings."""
    T = importlib.import_module(f"tiny_{trainer}")
    if trainer == "reward":
        return T, T.pairs(32, margin=True), {"center_rewards_coefficient": 0.01}
    return T, T.pairs(32) if trainer == "dpo" else T.examples(32), {}


def per_rank(trainer) -> dict:
    """What ``trainer`` recorded on every rank (gathered from both): ``{name: {"0": ..., "1": ...}}``."""
    import torch.distributed as dist

    gathered = [None, None]
    dist.all_gather_object(gathered, {"batch_ids": trainer.batch_ids, "num_items": trainer.num_items,
                                      "trained_tokens": trainer.trained_tokens})
    return {name: {str(r): gathered[r][name] for r in range(2)} for name in gathered[0]}


def run_sft(out: Path) -> None:
    import torch
    import torch.distributed as dist
    from tiny_sft import losses, make_trainer, tokenized_dataset, tokenizer, weights

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


def run_rl(out: Path) -> None:
    import tiny_rl as R
    import torch
    import torch.distributed as dist
    from layout_runs import LAYOUTS, step_logs

    R.model_path()  # each rank saves its copy before the process group exists (then only rank 0 would write)
    for kind, extra in (("grpo", {"loss_type": "bnpo"}), ("rloo", {})):
        for layout in LAYOUTS:
            t = R.trainer(kind, layout, str(out / f"{kind}-{layout}"), **extra)
            t.train()
            if dist.get_rank() == 0:
                torch.save({"logs": step_logs(t), "world_size": t.args.world_size, "grads": t.recorder.steps,
                            "recorded": t.recorded, "pack_totals": getattr(t, "pack_totals", None)},
                           out / f"{kind}-{layout}.pt")


def run_layouts(trainer: str, out: Path) -> None:
    import torch
    import torch.distributed as dist
    from layout_runs import step_logs, train_layouts, weights

    T, data, settings = setup(trainer)
    runs = train_layouts(T, data, T.tokenizer(), out, per_device_train_batch_size=2, **settings)
    results = {}
    for layout, (t, recorder) in runs.items():
        results[layout] = {"world_size": t.args.world_size, "logs": step_logs(t), "epoch": t.state.epoch,
                           "ranks": t.accelerator.num_processes}
        if dist.get_rank() == 0:
            torch.save({"grads": recorder.steps, "weights": weights(t)}, out / f"{layout}.pt")
    if dist.get_rank() == 0:
        (out / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    import torch.distributed as dist

    from trl_padfree.launch.distributed import finish

    out = Path(sys.argv[2])
    if sys.argv[1] == "rl":
        run_rl(out)
    elif sys.argv[1] == "sft":
        run_sft(out)
    else:
        run_layouts(sys.argv[1], out)
    (out / f"rank{dist.get_rank()}.done").write_text("ok")
    finish(0)
