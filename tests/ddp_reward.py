"""Test-only torchrun script for tests/test_reward.py: padded, padding-free and prompt-once reward training on 2 DDP
ranks (3 optimizer steps, gradient accumulation 2, SGD, margin and centering). Writes, from rank 0,
``results.json`` (world size, per-step logs and epoch of each layout) and ``LAYOUT.pt`` (the gradients before every
optimizer step and the final weights) to the directory given as the only argument.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def run(out: Path) -> None:
    import tiny_reward as T
    import torch
    import torch.distributed as dist
    from test_reward import GradRecorder

    from trl_padfree.launch.distributed import end_process_group

    tok, data = T.tokenizer(), T.pairs(32, margin=True)
    results = {}
    for layout in T.LAYOUTS:
        trainer = T.trainer(layout, data, tok, str(out / layout), optim="sgd", per_device_train_batch_size=2,
                            center_rewards_coefficient=0.01)
        recorder = GradRecorder()
        trainer.add_callback(recorder)
        trainer.train()
        results[layout] = {"world_size": trainer.args.world_size, "logs": T.step_logs(trainer),
                           "epoch": trainer.state.epoch, "ranks": trainer.accelerator.num_processes}
        if dist.get_rank() == 0:
            torch.save({"grads": recorder.steps, "weights": T.weights(trainer)}, out / f"{layout}.pt")
    if dist.get_rank() == 0:
        (out / "results.json").write_text(json.dumps(results))
    (out / f"rank{dist.get_rank()}.done").write_text("ok")
    end_process_group()


if __name__ == "__main__":
    run(Path(sys.argv[1]))
