"""Several nodes, elastic restarts and one-rank faults, with real processes (issue 17).

Two torchrun "nodes" on this machine (``--nnodes 2 --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint
127.0.0.1:PORT``), each with its own ``output_dir`` (standing for separate disks) or one shared ``output_dir``; a
``--max_restarts 1`` run whose worker is SIGKILLed; and the one-rank faults (a full disk, SIGKILL during a
checkpoint write, SIGSTOP longer than ``ddp_timeout``) under 2 nodes x 1 rank and 1 node x 2 ranks. Faults are
real (``tests/launch_hooks.py``); every test checks that no process of the run is left. Each run is a few steps of
the demo model (``tests/launch_inputs.py``'s tiny data of the 2-rank runs).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from launch_inputs import (
    DDP_BATCH,
    DDP_RECORDS,
    ddp_train_argv,
    dpo_argv,
    write_ddp_data,
    write_preference_data,
)
from paths import ROOT
from safetensors.torch import load_file
from two_ranks import free_port

from trl_padfree.launch.resume import choose_resume
from trl_padfree.launch.run_files import CHECKPOINT_MARKER, STAGING_DIR

slow = pytest.mark.slow  # several launches each: run with TRL_PADFREE_SLOW=1 (tests/conftest.py; .ci/run does)

HOOKS = str(ROOT / "tests" / "launch_hooks.py")
TIMEOUT = 300  # seconds for one launch of every node (loaded 2-core machine)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_ddp_data(tmp_path_factory.mktemp("distributed-data"))


class Node:
    """One torchrun process and what it printed (timestamped), run in the background."""

    def __init__(self, cmd: list[str]) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines: list[tuple[float, str]] = []
        self.pids: set[int] = {self.proc.pid}
        self.ended: float | None = None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def watch(self) -> None:
        """Remember every process below torchrun (to check afterwards that none is left)."""
        with contextlib.suppress(psutil.Error):
            self.pids.update(p.pid for p in psutil.Process(self.proc.pid).children(recursive=True))

    def workers(self) -> list[psutil.Process]:
        with contextlib.suppress(psutil.Error):
            return psutil.Process(self.proc.pid).children(recursive=True)
        return []

    @property
    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def first(self, fragment: str) -> float:
        return next(t for t, line in self.lines if fragment in line)


def first(nodes: list[Node], fragment: str) -> float:
    """When ``fragment`` was first printed by any node (c10d numbers the nodes in the order they join, so the
    node of global rank 0 is either)."""
    return min(t for n in nodes for t, line in n.lines if fragment in line)


def launch(commands: list[list[str]], during: object = None) -> list[Node]:
    """Start every command (one per node), wait for all, and check that no process of theirs is left.
    ``during(nodes)``, if given, is called every 0.2 s while they run (to act on a process)."""
    nodes = [Node(cmd) for cmd in commands]
    deadline = time.monotonic() + TIMEOUT
    try:
        while any(n.proc.poll() is None for n in nodes):
            for n in nodes:
                n.watch()
                if n.ended is None and n.proc.poll() is not None:
                    n.ended = time.monotonic()
            if during is not None:
                during(nodes)
            if time.monotonic() > deadline:
                pytest.fail("the run did not end within {} s:\n{}".format(
                    TIMEOUT, "\n=====\n".join(n.text[-3000:] for n in nodes)))
            time.sleep(0.2)
    finally:
        for n in nodes:
            for p in [*n.workers(), psutil.Process(n.proc.pid)] if n.proc.poll() is None else n.workers():
                with contextlib.suppress(psutil.Error):
                    p.kill()
            n.proc.wait()
            n.reader.join(10)
            n.ended = n.ended or time.monotonic()
    time.sleep(0.5)
    left = [pid for n in nodes for pid in n.pids if psutil.pid_exists(pid)
            and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not left, f"processes of the run still alive: {left}"
    return nodes


def torchrun(*options: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *options]


def two_nodes(port: str) -> list[str]:
    return torchrun("--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                    f"127.0.0.1:{port}")


def one_node() -> list[str]:
    return torchrun("--standalone", "--nproc_per_node", "2")


def run_argv(data_dir: Path, out: Path, *extra: str) -> list[str]:
    return ddp_train_argv(data_dir, out, "--save_strategy", "steps", *extra)


def launch_layout(layout: str, data_dir: Path, outs: list[Path], hooks: list[str], *extra: str,
                  during: object = None, restarts: int = 0) -> list[Node]:
    """``layout`` "2x1": two torchrun nodes of one rank, node i writing to ``outs[i]``; "1x2": one node of two
    ranks writing to ``outs[0]``. ``hooks``: tests/launch_hooks.py options (the faults)."""
    script = [HOOKS, *hooks, "--"]
    restart = ["--max_restarts", str(restarts)] if restarts else []
    if layout == "2x1":
        port = free_port()
        return launch([[*two_nodes(port), *restart, *script, *run_argv(data_dir, out, *extra)] for out in outs],
                      during)
    return launch([[*one_node(), *restart, *script, *run_argv(data_dir, outs[0], *extra)]], during)


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = load_file(a), load_file(b)
    return wa.keys() == wb.keys() and all(wa[k].equal(wb[k]) for k in wa)


def losses(out: Path) -> dict[int, float]:
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return {e["step"]: e["loss"] for e in history if "loss" in e}


# ------------------------------------------------------------------------------------------- several nodes


@slow
def test_two_nodes_with_separate_disks_each_save_and_resume_on_every_node(data_dir, tmp_path):
    """Each node writes checkpoints, the run record and the final model to its own output_dir; a run stopped by
    SIGTERM on node 1 resumes with resume_from_checkpoint: true on both nodes and ends like an uninterrupted run."""
    outs = [tmp_path / "node0" / "out", tmp_path / "node1" / "out"]
    steps = "4"
    nodes = launch_layout("2x1", data_dir, outs, ["--rank", "1", "--sigterm-at-step", "2"], "--max_steps", steps,
                          "--save_steps", "1", "--save_total_limit", "1")
    for node, out in zip(nodes, outs, strict=True):
        assert node.proc.returncode == 0, node.text[-4000:]
        text = node.text
        assert ("processes=2 processes on 2 nodes, output_dir not shared: the first process of every node writes to "
                "its own output_dir (save_on_each_node)") in text
        assert text.count("[trl-padfree] run: ") == 1  # node 1 prints the launch's lines too
        assert f"[trl-padfree] checkpoint saved to {out / 'checkpoint-2'}" in text, text[-3000:]
        assert "(stopped by SIGTERM on rank 1)" in text  # on both nodes, whichever holds rank 1
        marker = json.loads((out / "checkpoint-2" / CHECKPOINT_MARKER).read_text())
        assert {"model.safetensors", "optimizer.pt"} <= set(marker["files"])
        assert choose_resume(str(out)).step == 2
    # each node's checkpoint holds the RNG state of its own rank (c10d numbers the nodes in the order they join)
    assert sorted(p.name for out in outs for p in (out / "checkpoint-2").glob("rng_state*")) == [
        "rng_state_0.pth", "rng_state_1.pth"]
    assert json.loads((outs[0] / "trl_padfree_run.json").read_text())["run_id"] == json.loads(
        (outs[1] / "trl_padfree_run.json").read_text())["run_id"]

    nodes = launch_layout("2x1", data_dir, outs, [], "--max_steps", steps, "--save_steps", "1",
                          "--save_total_limit", "1", "--resume_from_checkpoint", "true")
    for node, out in zip(nodes, outs, strict=True):
        assert node.proc.returncode == 0, node.text[-4000:]
        assert f"resuming from {out / 'checkpoint-2'} (step 2, the newest complete checkpoint of this run)" in node.text
        assert f"[trl-padfree] model saved to {out}" in node.text
        summary = json.loads((out / "launch_summary.json").read_text())
        assert summary["world_size"] == 2 and summary["global_step"] == 4
        # each step takes DDP_BATCH examples on each of the 2 ranks
        epoch = json.loads((out / "trainer_state.json").read_text())["epoch"]
        assert epoch == pytest.approx(4 * 2 * DDP_BATCH / DDP_RECORDS)
    assert same_weights(outs[0] / "model.safetensors", outs[1] / "model.safetensors")


@slow
def test_two_nodes_sharing_output_dir_write_once(data_dir, tmp_path):
    out = tmp_path / "shared"
    nodes = launch_layout("2x1", data_dir, [out, out], [], "--max_steps", "2", "--save_steps", "2")
    for node in nodes:
        assert node.proc.returncode == 0, node.text[-4000:]
        assert "processes=2 processes on 2 nodes, output_dir shared: global rank 0 writes" in node.text
    assert sorted(p.name for p in (out / "checkpoint-2").glob("rng_state*")) == ["rng_state_0.pth", "rng_state_1.pth"]
    assert json.loads((out / "launch_summary.json").read_text())["world_size"] == 2
    assert (out / "model.safetensors").is_file() and not (out / STAGING_DIR).exists()


@slow
def test_two_machines_through_accelerate_launch(data_dir, tmp_path):
    """accelerate launch --num_machines 2 --machine_rank {0,1} on one machine (separate output_dirs)."""
    port = free_port()
    outs = [tmp_path / "machine0", tmp_path / "machine1"]
    nodes = launch([[sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                     str(ROOT / "configs" / "accelerate" / "cpu-ddp.yaml"), "--num_machines", "2", "--machine_rank",
                     str(i), "--main_process_ip", "127.0.0.1", "--main_process_port", port, "--num_processes", "2",
                     str(ROOT / "scripts" / "train.py"), *run_argv(data_dir, out, "--save_steps", "2")]
                    for i, out in enumerate(outs)])
    for node, out in zip(nodes, outs, strict=True):
        assert node.proc.returncode == 0, node.text[-4000:]
        assert "processes=2 processes on 2 nodes, output_dir not shared" in node.text
        assert f"[trl-padfree] model saved to {out}" in node.text
        assert json.loads((out / "launch_summary.json").read_text())["world_size"] == 2
        assert (out / "checkpoint-2" / CHECKPOINT_MARKER).is_file()


# ------------------------------------------------------------------------------------------- elastic restart


ELASTIC = ("--max_steps", "8", "--save_steps", "2")


@pytest.fixture(scope="module")
def uninterrupted(data_dir, tmp_path_factory) -> Path:
    """The elastic-restart tests' reference: the same run on 1 node x 2 ranks, not interrupted."""
    reference = tmp_path_factory.mktemp("uninterrupted")
    (node,) = launch_layout("1x2", data_dir, [reference], [], *ELASTIC)
    assert node.proc.returncode == 0, node.text[-4000:]
    return reference


@slow
@pytest.mark.parametrize(("layout", "store"), [
    ("1x2", "shared"),  # torchrun's default: the agent's store, kept across attempts (launch.restarts)
    ("1x2", "own"),  # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: a new store per attempt
    ("2x1", "shared"),  # two nodes with separate disks; only the killed worker's node counts a restart
])
def test_elastic_restart_resumes_the_newest_checkpoint_and_matches_an_uninterrupted_run(layout, store, data_dir,
                                                                                         uninterrupted, tmp_path,
                                                                                         monkeypatch):
    """torchrun --max_restarts 1, global rank 1 SIGKILLed after step 5: the restarted workers (on every node) take
    checkpoint-4 by themselves (no flag changed), and the final weights are byte-identical to an uninterrupted
    run's."""
    if store == "own":
        monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    outs = [tmp_path / "node0", tmp_path / "node1"] if layout == "2x1" else [tmp_path / "restarted"]
    nodes = launch_layout(layout, data_dir, outs, ["--rank", "1", "--sigkill-at-step", "5"], *ELASTIC,
                          restarts=1)
    text = "\n".join(node.text for node in nodes)
    # torchrun saw the kill (or, first, rank 0 failing on its lost peer), then restarted the group
    assert "exitcode: -9" in text or "another process of the run is gone" in text
    for node, out in zip(nodes, outs, strict=True):
        assert node.proc.returncode == 0, node.text[-4000:]
        assert (f"[trl-padfree] torchrun restart 1: resuming from {out / 'checkpoint-4'} (step 4, the newest "
                "complete checkpoint of this run)") in node.text, node.text[-4000:]
        assert losses(out) == losses(uninterrupted)
        assert same_weights(out / "model.safetensors", uninterrupted / "model.safetensors")


@slow
def test_dpo_elastic_restart_matches_an_uninterrupted_run(tmp_path):
    """trl-padfree dpo (prompt_once, its demo config) under torchrun --max_restarts 1 with global rank 1 SIGKILLed
    after step 5: it resumes from checkpoint-4 and ends with the uninterrupted run's logged losses and weights."""
    data = write_preference_data(tmp_path)
    outs = {name: tmp_path / name for name in ("uninterrupted", "restarted")}
    for name, hooks, restarts in (("uninterrupted", [], 0), ("restarted", ["--rank", "1", "--sigkill-at-step", "5"], 1)):
        argv = dpo_argv(data, outs[name], *ELASTIC, "--save_strategy", "steps", "--eval_strategy", "no")
        restart = ["--max_restarts", str(restarts)] if restarts else []
        (node,) = launch([[*one_node(), *restart, HOOKS, "--task", "dpo", *hooks, "--", *argv]])
        assert node.proc.returncode == 0, node.text[-4000:]
    assert (f"[trl-padfree] torchrun restart 1: resuming from {outs['restarted'] / 'checkpoint-4'} (step 4, the "
            "newest complete checkpoint of this run)") in node.text
    assert losses(outs["restarted"]) == losses(outs["uninterrupted"])
    assert same_weights(outs["restarted"] / "model.safetensors", outs["uninterrupted"] / "model.safetensors")


# ------------------------------------------------------------------------------------------- one node refuses


@slow
@pytest.mark.parametrize(("bad", "why"), [
    # before the process group exists (reading the config is what creates it)
    ("typo", "unknown key 'learning_rat' in {config}; did you mean 'learning_rate'?"),
    # after it exists (a data file missing on one node's disk)
    ("missing_data", "data file not found: train_file='{missing}' (relative paths start at the current directory "
                     "{root})"),
])
def test_a_config_refused_on_one_node_stops_every_node_at_once(bad, why, data_dir, tmp_path):
    """Node 1 alone has a bad config: both nodes exit 2 within seconds with the reason (the other node naming node
    1), nothing is written, and no process is left; before launch.rendezvous the other node waited for its peer
    until the process-group timeout (30 minutes)."""
    config, missing = tmp_path / "node1.yaml", tmp_path / "nowhere" / "train.jsonl"
    config.write_text((data_dir / "config.yaml").read_text() + "learning_rat: 0.1\n")
    outs = [tmp_path / "node0", tmp_path / "node1"]
    argv = [run_argv(data_dir, out) for out in outs]
    if bad == "typo":
        argv[1][argv[1].index("--config") + 1] = str(config)
    else:
        argv[1] += ["--train_file", str(missing)]
    port = free_port()
    nodes = launch([[*two_nodes(port), str(ROOT / "scripts" / "train.py"), *command] for command in argv])
    reason = why.format(config=config, missing=missing, root=ROOT)
    assert error_lines(nodes[1]) == [f"trl-padfree train: error: {reason}"], nodes[1].text[-3000:]
    (line,) = error_lines(nodes[0])  # c10d numbers the nodes (and so the ranks) in the order they join
    assert re.fullmatch(r"trl-padfree train: error: the config was refused on another process of the run, "
                        r"rank [01] \(node [01], local rank 0\): " + re.escape(reason), line), line
    for node in nodes:
        assert node.proc.returncode != 0 and "exitcode  : 2" in node.text, node.text[-3000:]
    assert abs(nodes[0].ended - nodes[1].ended) < 10
    assert not any(out.exists() for out in outs)


# ------------------------------------------------------------------------------------------- one-rank faults


@contextlib.contextmanager
def tmpfs(where: Path, size: str = "64m"):
    """A small tmpfs at ``where`` (a disk of its own that fills up), or a plain directory where none can be
    mounted (the fault then falls back to RLIMIT_FSIZE)."""
    where.mkdir(parents=True)
    mounted = shutil.which("mount") is not None and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True).returncode == 0
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(where)], check=False)


def error_lines(node: Node) -> list[str]:
    """The launch's one-line errors a node printed (from where they start: another process may have left half a
    line on the same stream just before)."""
    prefix = "trl-padfree train: error: "
    return [line[line.index(prefix):] for _, line in node.lines if prefix in line]


@slow
@pytest.mark.parametrize("layout", ["1x2", "2x1"])
def test_a_full_disk_on_one_rank_stops_every_rank_with_one_line_and_resume_works(layout, data_dir, tmp_path):
    """Rank 1's checkpoint-4 cannot be written (2x1: node 1's own disk, a full tmpfs; 1x2: RLIMIT_FSIZE on rank 1
    only, whose RNG state is its part of the shared checkpoint): every rank exits 1 at once, each node's console
    names rank 1 and the cause in one line; checkpoint-2 stays the newest complete one and a resume finishes."""
    outs = [tmp_path / "node0" / "out", tmp_path / "node1" / "out"] if layout == "2x1" else [tmp_path / "out"]
    with contextlib.ExitStack() as disks:
        # 2x1: each node's output_dir on a tmpfs of its own (c10d decides which node is rank 1)
        mounted = layout == "2x1" and all([disks.enter_context(tmpfs(out.parent)) for out in outs])
        hooks = ["--rank", "1", "--full-disk-at-step", "4"]
        if mounted:
            hooks += ["--ballast", "beside-output-dir"]
        nodes = launch_layout(layout, data_dir, outs, hooks, "--max_steps", "6", "--save_steps", "2")
        failed = max(n.ended for n in nodes)
        cause = "No space left on device" if mounted else ("File too large" if layout == "2x1" else "unexpected pos")
        for node in nodes:
            assert node.proc.returncode != 0
            assert "exitcode  : 1" in node.text, node.text[-3000:]
            (line,) = error_lines(node)
            assert line.startswith("trl-padfree train: error: could not write checkpoint-4 on rank 1 (node "), line
            assert cause in line, line
        for out in outs:
            assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
            assert not (out / STAGING_DIR).exists()
        print(f"full disk on rank 1 ({layout}): every node's torchrun exited within "
              f"{failed - first(nodes, 'error: could not write'):.1f} s of the error line")
        for ballast in tmp_path.glob("node*/ballast"):
            ballast.unlink()  # space is freed
        nodes = launch_layout(layout, data_dir, outs, [], "--max_steps", "6", "--save_steps", "2",
                              "--resume_from_checkpoint", "true")
        for node, out in zip(nodes, outs, strict=True):
            assert node.proc.returncode == 0, node.text[-3000:]
            assert f"resuming from {out / 'checkpoint-2'}" in node.text
            assert (out / "model.safetensors").is_file()


@slow
@pytest.mark.parametrize("layout", ["1x2", "2x1"])
def test_sigkill_of_one_rank_while_it_writes_a_checkpoint(layout, data_dir, tmp_path):
    """Rank 1 is SIGKILLed inside its save of checkpoint-4: rank 0 leaves at once with one line naming the cause,
    torchrun names rank 1 and the signal; checkpoint-4 never appears complete; resume takes checkpoint-2."""
    outs = [tmp_path / "node0" / "out", tmp_path / "node1" / "out"] if layout == "2x1" else [tmp_path / "out"]
    nodes = launch_layout(layout, data_dir, outs, ["--rank", "1", "--sigkill-in-save-at-step", "4"], "--max_steps",
                          "6", "--save_steps", "2")
    text = "\n".join(n.text for n in nodes)
    assert all(n.proc.returncode != 0 for n in nodes)
    assert "Signal 9 (SIGKILL) received by PID" in text and "rank      : 1" in text, text[-3000:]
    assert "[trl-padfree] rank 0 (node 0, local rank 0): another process of the run is gone (killed or crashed" in text
    seconds = max(n.ended for n in nodes) - first(nodes, "another process of the run is gone")
    print(f"SIGKILL of rank 1 in a save ({layout}): every torchrun exited {seconds:.1f} s after rank 0's line")
    for out in outs:
        assert choose_resume(str(out)).step == 2
    nodes = launch_layout(layout, data_dir, outs, [], "--max_steps", "6", "--save_steps", "2",
                          "--resume_from_checkpoint", "true")
    for node, out in zip(nodes, outs, strict=True):
        assert node.proc.returncode == 0, node.text[-3000:]
        assert f"resuming from {out / 'checkpoint-2'}" in node.text and (out / "model.safetensors").is_file()


class ContinueStopped:
    """``during`` for :func:`launch`: a worker found stopped (SIGSTOP) gets SIGCONT ``after`` seconds later, as a
    node that hung for a while; the time it was first seen stopped is kept."""

    def __init__(self, after: float) -> None:
        self.after = after
        self.stopped_at: float | None = None

    def __call__(self, nodes: list[Node]) -> None:
        for node in nodes:
            for worker in node.workers():
                with contextlib.suppress(psutil.Error):
                    if worker.status() == psutil.STATUS_STOPPED:
                        self.stopped_at = self.stopped_at or time.monotonic()
                        if time.monotonic() - self.stopped_at > self.after:
                            worker.resume()


@slow
@pytest.mark.parametrize("layout", ["1x2", "2x1"])
def test_a_rank_stopped_longer_than_ddp_timeout(layout, data_dir, tmp_path):
    """Rank 1 stops (SIGSTOP) after step 3 and continues (SIGCONT) 20 s later, as a node that hung: rank 0's
    collective fails after ddp_timeout (10 s) and it exits 1 with one line naming the cause; rank 1, once it
    runs again, finds the run gone and exits 1 too (one line). checkpoint-2 stays resumable."""
    outs = [tmp_path / "node0" / "out", tmp_path / "node1" / "out"] if layout == "2x1" else [tmp_path / "out"]
    stopped = ContinueStopped(after=20)
    nodes = launch_layout(layout, data_dir, outs, ["--rank", "1", "--sigstop-at-step", "3"], "--max_steps", "6",
                          "--save_steps", "2", "--ddp_timeout", "10", during=stopped)
    text = "\n".join(n.text for n in nodes)
    assert all(n.proc.returncode != 0 for n in nodes), text[-3000:]
    assert ("[trl-padfree] rank 0 (node 0, local rank 0): a collective did not complete within ddp_timeout=10 s: "
            "another process of the run is stopped, hung or too slow") in text, text[-3000:]
    assert stopped.stopped_at is not None
    line = first(nodes, "a collective did not complete") - stopped.stopped_at
    assert 8 < line < 30, line
    print(f"SIGSTOP of rank 1 ({layout}): rank 0's line {line:.1f} s after the stop (ddp_timeout 10 s); torchrun "
          f"exit(s) {', '.join(f'{n.ended - stopped.stopped_at:.1f}' for n in nodes)} s after the stop (SIGCONT at 20 s)")
    for out in outs:
        assert choose_resume(str(out)).step == 2


# ------------------------------------------------------------------------------------------- the docs' commands

#: commands shown in docs/distributed.md's "Several nodes" section -> the test here that runs their variant (tiny
#: data, a few steps, a free port), or why none can run here
DOC_COMMANDS = {
    "torchrun --nnodes 2 --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:29611 scripts/train.py "
    "--config configs/demo.yaml --max_steps 20 --output_dir /tmp/node0": "run: two_nodes(port) in every 2x1 test",
    "torchrun --nnodes 2 --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:29611 scripts/train.py "
    "--config configs/demo.yaml --max_steps 20 --output_dir /tmp/node1": "run: two_nodes(port) in every 2x1 test",
    **{f"accelerate launch --config_file configs/accelerate/cpu-ddp.yaml --num_machines 2 --machine_rank {i} "
       "--main_process_ip 127.0.0.1 --main_process_port 29612 --num_processes 2 scripts/train.py --config "
       f"configs/demo.yaml --max_steps 20 --output_dir /tmp/machine{i}": (
           "run: test_two_machines_through_accelerate_launch") for i in (0, 1)},
    "torchrun --standalone --nproc_per_node 2 --max_restarts 1 scripts/train.py --config configs/demo.yaml "
    "--max_steps 40 --save_strategy steps --save_steps 10 --output_dir /tmp/elastic": (
        "run: test_elastic_restart_resumes_the_newest_checkpoint_and_matches_an_uninterrupted_run"),
    "torchrun --standalone --nproc_per_node 2 --max_restarts 1 -m trl_padfree.cli dpo --config configs/demo-dpo.yaml "
    "--max_steps 40 --save_strategy steps --save_steps 10 --output_dir /tmp/elastic-dpo": (
        "run: test_dpo_elastic_restart_matches_an_uninterrupted_run"),
    "torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint NODE0_ADDRESS:29500 --rdzv_id my-run "
    "--max_restarts 1 scripts/train.py --config configs/llama3-8b-flash.yaml --resume_from_checkpoint auto": (
        "not run: two machines with 8 GPUs each (placeholders)"),
    "accelerate launch --config_file configs/accelerate/ddp.yaml --num_machines 2 --machine_rank NODE_RANK "
    "--main_process_ip NODE0_ADDRESS --main_process_port 29500 --num_processes 16 scripts/train.py --config "
    "configs/llama3-8b-flash.yaml": "not run: two machines with 8 GPUs each (placeholders)",
}


def test_the_several_nodes_commands_shown_are_those_run_here():
    text = (ROOT / "docs" / "distributed.md").read_text(encoding="utf-8")
    section = text[text.index("## Several nodes"):text.index("\n## ", text.index("## Several nodes") + 5)]
    shown = [line.strip() for block in section.split("```bash")[1:] for line in block.split("```")[0].splitlines()
             if line.strip().startswith(("torchrun", "accelerate"))]
    assert shown and sorted(set(shown)) == sorted(DOC_COMMANDS), shown
    for command in shown:
        if DOC_COMMANDS[command].startswith("run: test_"):
            assert DOC_COMMANDS[command].removeprefix("run: ") in globals()
        if "--rdzv_endpoint 127.0.0.1" in command:
            assert command.split(" scripts/train.py")[0].split()[1:] == two_nodes("29611")[3:]


# ------------------------------------------------------------------------------------------- agreeing on the checkpoint


def _agree(rank: int, store_path: str, outs: list[str], resumes: list[str | None], run_ids: list[str],
           results: object) -> None:
    import torch.distributed as dist

    from trl_padfree.launch.distributed import _agree_on_run

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    cfg = type("Cfg", (), {})()
    cfg.training = type("T", (), {"output_dir": outs[rank]})()
    cfg.resume_from_checkpoint, cfg.run_id, cfg.notes = resumes[rank], run_ids[rank], []
    from trl_padfree.launch.config import ConfigError
    from trl_padfree.launch.run_files import complete_steps

    try:
        for name, value in _agree_on_run(cfg, complete_steps).items():  # (the changes; cfg is a plain object here)
            setattr(cfg, name, value)
        results[rank] = (cfg.resume_from_checkpoint, cfg.run_id, cfg.notes)  # type: ignore[index]
    except ConfigError as exc:
        results[rank] = ("error", str(exc), [])  # type: ignore[index]
    dist.destroy_process_group()


def agree(tmp_path: Path, steps: list[list[int]], resumes: list[str | None], run_ids: list[str]) -> list[tuple]:
    """Two gloo processes, each with its own output_dir holding complete checkpoints ``steps[rank]`` of run
    ``run_ids[rank]``, run :func:`_agree_on_run`; what each ended with."""
    import torch.multiprocessing as mp

    from trl_padfree.launch.atomic_save import mark_complete

    tmp_path.mkdir(parents=True, exist_ok=True)  # (the FileStore's directory)
    outs = []
    for rank, (mine, run_id) in enumerate(zip(steps, run_ids, strict=True)):
        out = tmp_path / f"node{rank}"
        for step in mine:
            path = out / f"checkpoint-{step}"
            path.mkdir(parents=True)
            (path / "model.safetensors").write_bytes(b"w")
            mark_complete(str(path), run_id, step)
        outs.append(str(out))
    manager = mp.Manager()
    results = manager.dict()
    resumed = [None if r is None else os.path.join(outs[i], r) for i, r in enumerate(resumes)]
    mp.spawn(_agree, args=(str(tmp_path / "store"), outs, resumed, run_ids, results), nprocs=2)
    return [results[0], results[1]]


@slow
def test_nodes_resume_from_the_newest_checkpoint_complete_on_every_node(tmp_path):
    """Node 1 died while writing checkpoint-6 (its own disk has 2 and 4): both resume from checkpoint-4."""
    r0, r1 = agree(tmp_path, [[2, 4, 6], [2, 4]], ["checkpoint-6", "checkpoint-4"], ["run", "run"])
    assert r0[0] == str(tmp_path / "node0" / "checkpoint-4") and r1[0] == str(tmp_path / "node1" / "checkpoint-4")
    assert "step 4 is the newest checkpoint complete on every node" in r0[2][0]
    # a checkpoint passed by path is kept as asked when every rank asks for the same one
    r0, r1 = agree(tmp_path / "b", [[2, 4], [2, 4]], ["checkpoint-2", "checkpoint-2"], ["run", "run"])
    assert r0[0].endswith("node0/checkpoint-2") and r1[0].endswith("node1/checkpoint-2")


@slow
def test_nodes_holding_different_runs_or_a_new_run_are_refused(tmp_path):
    r0, r1 = agree(tmp_path, [[2], [2]], ["checkpoint-2", "checkpoint-2"], ["run-a", "run-b"])
    assert r0[0] == r1[0] == "error" and "the processes do not resume the same run" in r0[1]
    r0, _ = agree(tmp_path / "b", [[2], []], ["checkpoint-2", None], ["run", "run"])
    assert r0[0] == "error" and "rank 1: a new run" in r0[1]
    r0, r1 = agree(tmp_path / "c", [[], []], [None, None], ["x", "y"])
    assert r0[1] == r1[1] == "x"  # a new run: rank 0's id everywhere


# ------------------------------------------------------------------------------------------- resume_from_checkpoint: auto


def auto_cfg(out: Path, value: object, overwrite: bool = False) -> object:
    cfg = type("Cfg", (), {})()
    cfg.training = type("T", (), {"output_dir": str(out)})()
    cfg.launch = type("L", (), {"overwrite_output_dir": overwrite})()
    cfg.resume_from_checkpoint, cfg.run_id, cfg.notes = value, None, []
    return cfg


def test_resume_auto_and_torchrun_restarts(tmp_path):
    from trl_padfree.launch.atomic_save import mark_complete
    from trl_padfree.launch.config import ConfigError
    from trl_padfree.launch.files import write_json_atomic
    from trl_padfree.launch.resume import resolve_auto_resume
    from trl_padfree.launch.run_files import RUN_FILE

    def resolved(cfg: object, restart: int) -> object | None:  # cfg with the changes resolve_auto_resume returns
        changes = resolve_auto_resume(cfg, restart)
        return None if changes is None else SimpleNamespace(**{**vars(cfg), **changes})

    out = tmp_path / "out"
    cfg = resolved(auto_cfg(out, "auto"), 0)  # nothing there yet: a new run
    assert cfg and cfg.resume_from_checkpoint is None and cfg.run_id
    assert cfg.notes == [f"resume_from_checkpoint: auto: no complete checkpoint of an unfinished run in {out}: "
                         "starting a new run"]
    out.mkdir()
    write_json_atomic(str(out / RUN_FILE), {"run_id": "r", "status": "training"})
    cfg = resolved(auto_cfg(out, None), 1)  # a run killed before its first checkpoint, restarted by torchrun: a new run
    assert cfg and cfg.resume_from_checkpoint is None and cfg.run_id != "r"
    for step in (2, 4):
        path = out / f"checkpoint-{step}"
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"w")
        mark_complete(str(path), "r", step)
    cfg = resolved(auto_cfg(out, None, overwrite=True), 1)  # restarted: resumes even where overwrite_output_dir is set
    assert cfg and cfg.resume_from_checkpoint == str(out / "checkpoint-4") and cfg.run_id == "r"
    assert cfg.notes[0].startswith(f"torchrun restart 1: resuming from {out / 'checkpoint-4'} (step 4")
    assert resolve_auto_resume(auto_cfg(out, None), 0) is None  # no restart, no auto: not this function's case
    assert resolve_auto_resume(auto_cfg(out, "true"), 1) is None  # asked for explicitly: as asked
    write_json_atomic(str(out / RUN_FILE), {"run_id": "r", "status": "finished", "global_step": 4, "max_steps": 4})
    with pytest.raises(ConfigError, match="is finished"):
        resolve_auto_resume(auto_cfg(out, "auto"), 0)
    foreign = tmp_path / "foreign"
    (foreign / "checkpoint-3").mkdir(parents=True)
    with pytest.raises(ConfigError, match="holds files of another tool"):
        resolve_auto_resume(auto_cfg(foreign, "auto"), 0)
