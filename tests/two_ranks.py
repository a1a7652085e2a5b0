"""Several processes from the tests: a tests/ddp_*.py script on 2 ranks, launches that leave no process, free ports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from paths import ROOT

TIMEOUT = 300  # seconds for one launch of every node (loaded 2-core machine); a hang is caught here


def run_on_two_ranks(script: str, out: Path, *args: str, timeout: int = 600) -> None:
    """``tests/SCRIPT ARGS... OUT`` under torchrun with 2 processes (``launch``); fails the test unless it exits 0."""
    (node,) = launch([[sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                       str(ROOT / "tests" / script), *args, str(out)]], timeout=timeout)
    assert node.proc.returncode == 0, node.text[-4000:]


def free_port() -> str:
    """A free TCP port, so that two runs at once never meet at one rendezvous."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def tagged(tag: str) -> list[int]:
    """The live (not zombie) processes whose environment carries ``TRL_PADFREE_TEST_RUN=tag`` (set by ``launch``)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                if f"TRL_PADFREE_TEST_RUN={tag}".encode() not in handle.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(pid))
        except OSError:
            continue
    return found


class Node:
    """One launcher process (a node) and what it printed, timestamped."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines: list[tuple[float, str]] = []
        self.ended: float | None = None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    @property
    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def first(self, fragment: str) -> float:
        return next(t for t, line in self.lines if fragment in line)


def launch(commands: list[list[str]], timeout: int = TIMEOUT, **env: str) -> list[Node]:
    """Run every command (a node each) with ``env`` added (and this checkout first on ``PYTHONPATH``, not an installed
    copy); fails if one hangs past ``timeout`` or leaves a process."""
    tag = uuid.uuid4().hex
    full = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
            "TRL_PADFREE_TEST_RUN": tag, "PYTHONPATH": str(ROOT), **env}
    nodes = [Node(cmd, full) for cmd in commands]
    deadline = time.monotonic() + timeout
    while any(n.proc.poll() is None for n in nodes) and time.monotonic() < deadline:
        for n in nodes:
            if n.ended is None and n.proc.poll() is not None:
                n.ended = time.monotonic()
        time.sleep(0.2)
    hung = any(n.proc.poll() is None for n in nodes)
    time.sleep(1.0)
    left = tagged(tag)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    for n in nodes:
        n.proc.wait()
        n.reader.join(10)
        n.ended = n.ended or time.monotonic()
    shown = "\n=====\n".join(n.text[-3000:] for n in nodes)
    assert not hung, f"the run did not end within {timeout} s:\n{shown}"
    assert not left, f"processes of the run still alive after it ended: {left}\n{shown}"
    return nodes
