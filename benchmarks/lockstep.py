"""Variants in their own worker processes, trained in lockstep: the SFT and DPO benchmarks' common driver.

The parent starts one :class:`LockstepWorker` per variant; each worker builds its run (data, model, optimizer),
says how many steps it will train, then trains one step per ``step`` line on its stdin (:func:`serve`). Only one
worker computes at a time (:func:`run_in_lockstep`: step i of every variant, in a rotating order, then step i+1),
so the drift of a shared machine's load hits every variant alike, and each variant's peak memory is its own.
Protocol messages are JSON lines on the worker's stdout, after a prefix; everything else it prints goes to stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["PROTOCOL", "LockstepWorker", "run_in_lockstep", "serve", "tail", "worker_env"]

PROTOCOL = "@@trl-padfree-bench "


def tail(text: str, lines: int = 25) -> str:
    """The last ``lines`` lines of ``text``."""
    return "\n".join(text.strip().splitlines()[-lines:])


def worker_env() -> dict[str, str]:
    """The environment of a worker: this one, with the project root importable."""
    from .machine import _project_root

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_project_root(), env.get("PYTHONPATH")) if p)
    return env


def serve(run: Any, output_path: str | Path) -> int:
    """The worker's side: ``ready`` with the step count, one ``step`` per command, ``finish`` writes the result."""
    channel, sys.stdout = sys.stdout, sys.stderr  # only protocol messages go to the parent's pipe

    def send(message: dict[str, Any]) -> None:
        channel.write(PROTOCOL + json.dumps(message) + "\n")
        channel.flush()

    send({"ready": True, "steps": run.total_steps})
    for line in sys.stdin:
        command = line.strip()
        if command == "step":
            send(run.step())
        elif command == "finish":
            Path(output_path).write_text(json.dumps(run.finish()))
            send({"done": True})
            return 0
        else:
            raise ValueError(f"unknown worker command {command!r} (expected 'step' or 'finish')")
    return 1  # the parent went away


class LockstepWorker:
    """A fresh worker process (``command``) driven step by step over its stdin/stdout."""

    def __init__(self, name: str, command: list[str], stderr_path: Path, out_path: Path) -> None:
        self.name, self.out_path = name, out_path
        self.stderr = open(stderr_path, "w+")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(command, env=worker_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True)

    def request(self, command: str | None) -> dict[str, Any]:
        """Send ``command`` (None: only wait) and return the worker's next protocol message."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            if command is not None:
                self.proc.stdin.write(command + "\n")
                self.proc.stdin.flush()
            for line in self.proc.stdout:
                if line.startswith(PROTOCOL):
                    return json.loads(line[len(PROTOCOL) :])
        except BrokenPipeError:
            pass
        code = self.proc.wait()
        self.stderr.seek(0)
        raise RuntimeError(f"the {self.name} worker failed (exit {code}):\n{tail(self.stderr.read())}")

    def result(self) -> dict[str, Any]:
        self.request("finish")
        self.proc.wait()
        return json.loads(self.out_path.read_text())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


def run_in_lockstep(workers: list[LockstepWorker]) -> list[dict[str, Any]]:
    """Train every worker's variant, step i of each (in a rotating order) before step i+1; their results, in order.

    A variant with fewer steps (token-budget batching can change the count) stops early; one with more runs on
    alone. Every worker is closed on the way out.
    """
    try:
        # ready: data, model and optimizer built; each worker says how many steps it will train
        order = [(worker, int(worker.request(None)["steps"])) for worker in workers]
        for step in range(max(n for _, n in order)):
            shift = step % len(order)
            for worker, n in order[shift:] + order[:shift]:
                if step < n:
                    worker.request("step")
        return [worker.result() for worker in workers]
    finally:
        for worker in workers:
            worker.close()
