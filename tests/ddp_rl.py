"""Test-only torchrun script for tests/test_grpo.py: padded, padding-free and prompt-once GRPO (``bnpo``) and RLOO on 2
DDP ranks; rank 0 writes ``KIND-LAYOUT.pt`` into the directory given, each rank ``rankN.done``."""

from __future__ import annotations

import sys
from pathlib import Path


def run(out: Path) -> None:
    import tiny_rl as R
    import torch
    import torch.distributed as dist
    from layout_runs import LAYOUTS, step_logs

    from trl_padfree.launch.distributed import finish

    R.model_path()  # each rank saves its copy before the process group exists (then only rank 0 would write)
    for kind, extra in (("grpo", {"loss_type": "bnpo"}), ("rloo", {})):
        for layout in LAYOUTS:
            t = R.trainer(kind, layout, str(out / f"{kind}-{layout}"), **extra)
            t.train()
            if dist.get_rank() == 0:
                torch.save({"logs": step_logs(t), "world_size": t.args.world_size, "grads": t.recorder.steps,
                            "recorded": t.recorded, "pack_totals": getattr(t, "pack_totals", None)},
                           out / f"{kind}-{layout}.pt")
    (out / f"rank{dist.get_rank()}.done").write_text("ok")
    finish(0)


if __name__ == "__main__":
    run(Path(sys.argv[1]))
