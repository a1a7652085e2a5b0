"""Test-only torchrun script (``layout_runs.ddp_runs``): ``ddp_layouts.py dpo|kto|reward OUT`` trains every layout on
2 DDP ranks; rank 0 writes ``OUT/results.json`` and ``OUT/LAYOUT.pt`` (gradients, final weights), each rank
``rankN.done``."""

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


def run(trainer: str, out: Path) -> None:
    import torch
    import torch.distributed as dist
    from layout_runs import step_logs, train_layouts, weights

    from trl_padfree.launch.distributed import finish

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
    (out / f"rank{dist.get_rank()}.done").write_text("ok")
    finish(0)


if __name__ == "__main__":
    run(sys.argv[1], Path(sys.argv[2]))
