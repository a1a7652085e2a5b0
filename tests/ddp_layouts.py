"""Test-only torchrun script for tests/test_dpo.py, test_kto.py and test_reward.py (``layout_runs.ddp_runs``): one
trainer in every layout of tests/layout_runs.py on 2 DDP ranks (3 optimizer steps, gradient accumulation 2, SGD).
``ddp_layouts.py TRAINER OUT``, TRAINER one of:

- ``dpo``: padded, padding-free and prompt-once DPO;
- ``kto``: the kto loss with its KL term, desirable/undesirable weights;
- ``reward``: reward-model training with margins and centering.

Writes, from rank 0, ``OUT/results.json`` (world size, ranks, per-step logs and epoch of each layout) and
``OUT/LAYOUT.pt`` (the gradients before every optimizer step and the final weights), and ``rankN.done`` from each
rank.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def setup(trainer: str) -> tuple:
    """The trainer's set-up module (tests/tiny_*.py), its 32 training records and its own settings."""
    if trainer == "dpo":
        import tiny_dpo as T

        return T, T.pairs(32), {}
    if trainer == "kto":
        import tiny_kto as T

        return T, T.examples(32), {}
    if trainer == "reward":
        import tiny_reward as T

        return T, T.pairs(32, margin=True), {"center_rewards_coefficient": 0.01}
    raise ValueError(trainer)


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
