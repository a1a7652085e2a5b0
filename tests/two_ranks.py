"""Running on 2 CPU ranks from the tests: a test-only script (tests/ddp_*.py) under torchrun with this checkout's
package (``run_on_two_ranks``), and a free port for a launcher's rendezvous (``free_port``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from paths import ROOT


def run_on_two_ranks(script: str, out: Path, *args: str, timeout: int = 600) -> None:
    """``tests/SCRIPT ARGS... OUT`` under torchrun with 2 processes; fails the test with the output's end unless
    it exits 0."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}  # this checkout, not an installed copy
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(ROOT / "tests" / script), *args, str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


def free_port() -> str:
    """A free TCP port: accelerate's launcher otherwise uses 29500, and two runs at once (a test suite next to
    another job) would meet at the same rendezvous and wait for each other."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])
