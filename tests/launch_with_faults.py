"""Test-only entry point: ``trl-padfree train`` with a fault injected into one rank (never used in production).

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/launch_with_faults.py \\
        --fail_rank 1 --fail_at_step 2 -- --config configs/demo.yaml ...

``--fail_rank R --fail_at_step K``: rank ``R`` raises ``RuntimeError`` in its training step once ``K`` optimizer
steps are done (the other ranks are then inside DDP's gradient all-reduce of the same step, the worst place to
be left waiting). ``--sigterm_rank R --sigterm_at_step K``: rank ``R`` alone gets SIGTERM in that step. Everything after ``--`` goes to ``trl_padfree.launch.main``.
"""

from __future__ import annotations

import argparse
import os
import sys


def inject_failure(rank: int, at_step: int) -> None:
    """Make ``PadfreeSFTTrainer.training_step`` raise on ``rank`` once ``at_step`` optimizer steps are done."""
    from trl_padfree.launch.trainer import PadfreeSFTTrainer

    original = PadfreeSFTTrainer.training_step

    def training_step(self, model, inputs, num_items_in_batch=None):
        if int(os.environ.get("RANK", "0")) == rank and self.state.global_step >= at_step:
            raise RuntimeError(f"injected failure on rank {rank} at step {self.state.global_step + 1}")
        return original(self, model, inputs, num_items_in_batch)

    PadfreeSFTTrainer.training_step = training_step


def inject_sigterm(rank: int, at_step: int) -> None:
    """Make ``rank`` (only) send itself SIGTERM in its training step once ``at_step`` optimizer steps are done."""
    import signal

    from trl_padfree.launch.trainer import PadfreeSFTTrainer

    original = PadfreeSFTTrainer.training_step
    sent = []

    def training_step(self, model, inputs, num_items_in_batch=None):
        if int(os.environ.get("RANK", "0")) == rank and self.state.global_step >= at_step and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, model, inputs, num_items_in_batch)

    PadfreeSFTTrainer.training_step = training_step


def run(argv: list[str]) -> int:
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail_rank", type=int)
    parser.add_argument("--fail_at_step", type=int, default=1)
    parser.add_argument("--sigterm_rank", type=int)
    parser.add_argument("--sigterm_at_step", type=int, default=1)
    options = parser.parse_args(argv[:split])
    if options.fail_rank is not None:
        inject_failure(options.fail_rank, options.fail_at_step)
    if options.sigterm_rank is not None:
        inject_sigterm(options.sigterm_rank, options.sigterm_at_step)
    from trl_padfree.launch import main

    return main(argv[split + 1 :])


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
