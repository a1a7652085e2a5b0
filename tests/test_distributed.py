"""Two real ranks on CPU (DDP over gloo), started by accelerate (configs/accelerate/cpu-ddp.yaml) or torchrun: a run
that trains one model, logs once and exits cleanly; a failing rank that makes the other exit non-zero at once;
SIGTERM on one rank (both checkpoint and exit 0); processes that form no group, and FSDP on CPU, refused; DeepSpeed
ZeRO-3 on CPU where deepspeed is installed. Each run is a few steps of the demo model with a timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from launch_inputs import DDP_BATCH, DDP_RECORDS, DDP_STEPS, ddp_train_argv, write_ddp_data
from paths import DEMO_MODEL, ROOT
from two_ranks import free_port

TIMEOUT = 240  # seconds for a whole 2-rank run (loaded machine); a hang is caught here
FIND_UNUSED_WARNING = "find_unused_parameters=True was specified in DDP constructor"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_ddp_data(tmp_path_factory.mktemp("distributed-data"))


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def accelerate_launch(config: Path = ROOT / "configs" / "accelerate" / "cpu-ddp.yaml") -> list[str]:
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
            "--main_process_port", free_port()]


def torchrun(script_args: list[str], launcher: list[str] = TORCHRUN) -> tuple[int, list[tuple[float, str]], float]:
    """Run ``script_args`` under ``launcher`` (2 processes); return (exit code, timestamped lines of
    stdout+stderr, the time the launcher exited)."""
    cmd = [*launcher, *script_args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        import psutil

        workers = psutil.Process(proc.pid).children(recursive=True)
        for worker in workers:  # PYTHONFAULTHANDLER: each worker prints where every thread is stuck
            worker.send_signal(signal.SIGABRT)
        time.sleep(3)
        for worker in [*workers, proc]:
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                worker.kill()
        proc.wait()
        reader.join(5)
        pytest.fail(f"the 2-rank run did not exit within {TIMEOUT} s; last lines:\n"
                    + "\n".join(t for _, t in lines[-80:]))
    ended = time.monotonic()
    reader.join(10)
    return code, lines, ended


def first_time(lines: list[tuple[float, str]], fragment: str) -> float:
    return next(t for t, line in lines if fragment in line)


def test_the_cpu_ddp_accelerate_config_uses_the_torchrun_launcher():
    """--cpu and distributed_type MULTI_CPU make accelerate start ONE process (its "simple" launcher, unless an MPI
    hostfile is given); this config selects its torchrun-based launcher instead."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType

    config = load_config_from_file(str(ROOT / "configs" / "accelerate" / "cpu-ddp.yaml"))
    assert config.distributed_type == DistributedType.MULTI_GPU and config.num_processes == 2
    assert config.num_machines == 1 and config.mixed_precision == "no" and not config.use_cpu


def test_two_ranks_train_one_model_log_once_and_exit_cleanly(data_dir, tmp_path):
    """accelerate launch --config_file configs/accelerate/cpu-ddp.yaml (accelerate's torchrun-based launcher)."""
    out = tmp_path / "out"
    code, lines, ended = torchrun([str(ROOT / "scripts" / "train.py"), *ddp_train_argv(data_dir, out)],
                                  accelerate_launch())
    text = "\n".join(line for _, line in lines)
    assert code == 0, text[-4000:]
    summary = json.loads((out / "launch_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["distributed_type"] == "MULTI_CPU" and summary["backend"] == "gloo"
    assert summary["global_step"] == DDP_STEPS
    state = json.loads((out / "trainer_state.json").read_text())
    # each step takes DDP_BATCH examples on each of the 2 ranks: twice a single process's progress through the epoch
    assert state["epoch"] == pytest.approx(DDP_STEPS * 2 * DDP_BATCH / DDP_RECORDS)
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".safetensors") == ["model.safetensors"]
    assert not list(out.glob("checkpoint-*"))
    assert text.count("[trl-padfree] run: ") == 1
    assert text.count(f"[trl-padfree] model saved to {out}") == 1
    assert text.count(f"[trl-padfree] steps: {DDP_STEPS}/{DDP_STEPS}") == 1
    assert text.count("'loss': ") == DDP_STEPS  # one log line per step, from rank 0 only
    assert FIND_UNUSED_WARNING not in text  # ddp_find_unused_parameters is off by default: no extra traversal
    # every rank left the process group and exited within seconds of the summary
    exit_seconds = ended - first_time(lines, "[trl-padfree] model saved to")
    assert exit_seconds < 30, exit_seconds
    print(f"2-rank run: exited {exit_seconds:.1f} s after the summary")


def with_fault(data_dir: Path, out: Path, *fault: str) -> tuple[int, list[tuple[float, str]], float, str]:
    """A 50-step 2-rank run under torchrun with ``fault`` injected (tests/launch_hooks.py); adds the text."""
    code, lines, ended = torchrun([
        str(ROOT / "tests" / "launch_hooks.py"), *fault, "--",
        *ddp_train_argv(data_dir, out, "--max_steps", "50"),
    ])  # fmt: skip
    return code, lines, ended, "\n".join(line for _, line in lines)


def test_a_failing_rank_makes_the_other_exit_non_zero_at_once(data_dir, tmp_path):
    out = tmp_path / "out"
    code, lines, ended, text = with_fault(data_dir, out, "--rank", "1", "--fail-in-step", "2")
    assert code != 0, text[-4000:]
    assert "[trl-padfree] rank 1 failed:" in text and "injected failure on rank 1 at step 2" in text, text[-4000:]
    # rank 0 was waiting in the step's gradient all-reduce: gloo tells it that rank 1 has gone ("Connection closed
    # by peer" or "Connection reset by peer"), and it fails too, within seconds, with one line
    assert ("[trl-padfree] rank 0 (node 0, local rank 0): another process of the run is gone (killed or crashed; "
            "gloo: ") in text and "by peer" in text, text[-4000:]
    assert text.count("exitcode  : 1 (pid:") == 2, text[-4000:]  # torchrun's report: both workers exited with 1
    seconds = ended - first_time(lines, "[trl-padfree] rank 1 failed:")
    assert seconds < 30, (seconds, text[-4000:])
    assert not (out / "model.safetensors").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="without use_cpu, a GPU machine builds a group")
def test_processes_that_form_no_process_group_are_refused(data_dir, tmp_path):
    """Without use_cpu: true on a machine without GPUs, the 2 processes would each train their own model into the
    same output_dir: the launch stops both before anything is written (exit code 2)."""
    out = tmp_path / "out"
    code, lines, _ = torchrun([str(ROOT / "scripts" / "train.py"),
                               *ddp_train_argv(data_dir, out, "--use_cpu", "false")])
    text = "\n".join(line for _, line in lines)
    assert code != 0
    assert ("trl-padfree train: error: the launcher started 2 processes (WORLD_SIZE=2) but they did not join one "
            "process group, so each would train its own copy of the model: on a machine without GPUs set use_cpu: "
            "true") in text, text[-3000:]
    assert text.count("exitcode  : 2 (pid:") == 2
    assert not out.exists()


def test_sigterm_on_one_rank_checkpoints_both_at_the_same_step_and_both_exit_0(data_dir, tmp_path):
    out = tmp_path / "out"
    code, lines, ended, text = with_fault(data_dir, out, "--rank", "1", "--sigterm-at-step", "2")
    assert code == 0, text[-4000:]  # torchrun exits 0 only when every worker did
    assert "[trl-padfree] steps: 2/50 in " in text and "(stopped by SIGTERM on rank 1)" in text
    assert (out / "checkpoint-2" / "trainer_state.json").is_file() and not (out / "model.safetensors").exists()
    # both ranks saved at step 2: the Trainer writes one RNG state per rank into the checkpoint
    assert sorted(p.name for p in (out / "checkpoint-2").glob("rng_state*")) == ["rng_state_0.pth", "rng_state_1.pth"]
    summary = json.loads((out / "launch_summary.json").read_text())
    assert summary["checkpoint"] == str(out / "checkpoint-2") and summary["world_size"] == 2
    seconds = ended - first_time(lines, "[trl-padfree] checkpoint saved to")
    assert seconds < 30, seconds


def test_fsdp_on_cpu_is_refused_instead_of_silently_training_ddp(data_dir, tmp_path, monkeypatch, capsys):
    """accelerate launch with an FSDP config sets ACCELERATE_USE_FSDP=true; on CPU accelerate ignores it (it
    shards only on GPU-like devices) and would train plain DDP. The launch stops first, naming the alternatives."""
    from trl_padfree.launch import main

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    out = tmp_path / "out"
    assert main(ddp_train_argv(data_dir, out)) == 2
    err = capsys.readouterr().err
    assert ("trl-padfree train: error: FSDP was requested (an accelerate FSDP config or the fsdp field) but this run "
            "is on the CPU, where accelerate does not shard: it would silently train without FSDP (NO). Use "
            "configs/accelerate/cpu-ddp.yaml for DDP on CPU") in err
    assert not out.exists()


def test_deepspeed_zero3_on_two_cpu_ranks(data_dir, tmp_path):
    """DeepSpeed's CPU accelerator: ZeRO-3 over gloo through accelerate (runs only where deepspeed is installed;
    it is not a dev dependency: it compiles a communication op with the C++ compiler on first use)."""
    pytest.importorskip("deepspeed")
    config = tmp_path / "zero3-cpu.yaml"
    text = (ROOT / "configs" / "accelerate" / "deepspeed-zero3.yaml").read_text(encoding="utf-8")
    config.write_text(text.replace("num_processes: 8", "num_processes: 2").replace("mixed_precision: bf16",
                                                                                   "mixed_precision: 'no'"))
    out = tmp_path / "out"
    code, lines, _ = torchrun([str(ROOT / "scripts" / "train.py"), *ddp_train_argv(data_dir, out)],
                              accelerate_launch(config))
    assert code == 0, "\n".join(line for _, line in lines)[-4000:]
    summary = json.loads((out / "launch_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["distributed_type"] == "DEEPSPEED" and summary["global_step"] == 2
    from safetensors.torch import load_file

    saved, demo = load_file(str(out / "model.safetensors")), load_file(str(DEMO_MODEL / "model.safetensors"))
    assert saved.keys() == demo.keys() and all(saved[k].shape == demo[k].shape for k in demo)  # gathered, not shards
