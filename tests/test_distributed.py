"""Two real ranks on CPU (DDP over gloo) by accelerate or torchrun: training, a failing rank, SIGTERM, refusals,
DeepSpeed ZeRO-3; each run a few steps of the demo model, every process gone at the end (``two_ranks.launch``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from launch_inputs import DDP_BATCH, DDP_RECORDS, DDP_STEPS, ddp_train_argv, write_ddp_data
from paths import DEMO_MODEL, ROOT
from two_ranks import free_port, launch

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
TRAIN, HOOKS = str(ROOT / "scripts" / "train.py"), str(ROOT / "tests" / "launch_hooks.py")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_ddp_data(tmp_path_factory.mktemp("distributed-data"))


def accelerate_launch(config: Path = ROOT / "configs" / "accelerate" / "cpu-ddp.yaml") -> list[str]:
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
            "--main_process_port", free_port()]


def test_two_ranks_train_one_model_log_once_and_every_rank_exits(data_dir, tmp_path):
    out = tmp_path / "out"
    (node,) = launch([[*accelerate_launch(), TRAIN, *ddp_train_argv(data_dir, out)]])
    assert node.proc.returncode == 0, node.text[-4000:]
    summary = json.loads((out / "launch_summary.json").read_text())
    assert (summary["world_size"], summary["distributed_type"], summary["backend"]) == (2, "MULTI_CPU", "gloo")
    state = json.loads((out / "trainer_state.json").read_text())
    # both ranks ran: each step takes DDP_BATCH examples on each of the 2 ranks, twice one process's progress
    assert state["global_step"] == DDP_STEPS and state["epoch"] == pytest.approx(DDP_STEPS * 2 * DDP_BATCH / DDP_RECORDS)
    assert node.text.count("[trl-padfree] run: ") == 1 and node.text.count("'loss': ") == DDP_STEPS
    assert "find_unused_parameters=True was specified in DDP constructor" not in node.text
    assert node.ended - node.first("[trl-padfree] model saved to") < 30  # every rank left the group and exited


def test_a_failing_rank_makes_the_other_exit_non_zero(data_dir, tmp_path):
    out = tmp_path / "out"
    (node,) = launch([[*TORCHRUN, HOOKS, "--rank", "1", "--fail-in-step", "2",
                       "--", *ddp_train_argv(data_dir, out, "--max_steps", "50")]])
    assert node.proc.returncode != 0
    assert "injected failure on rank 1 at step 2" in node.text, node.text[-4000:]
    assert node.ended - node.first("injected failure on rank 1") < 60, node.text[-4000:]
    assert not (out / "model.safetensors").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="without use_cpu, a GPU machine builds a group")
def test_processes_that_form_no_process_group_are_refused(data_dir, tmp_path):
    out = tmp_path / "out"
    (node,) = launch([[*TORCHRUN, TRAIN, *ddp_train_argv(data_dir, out, "--use_cpu", "false")]])
    assert node.proc.returncode != 0 and "exitcode  : 2 (pid:" in node.text, node.text[-3000:]  # (torchrun may stop the other first)
    assert ("trl-padfree train: error: the launcher started 2 processes (WORLD_SIZE=2) but they did not join one "
            "process group") in node.text, node.text[-3000:]
    assert not out.exists()


def test_sigterm_on_one_rank_checkpoints_both_at_the_same_step_and_both_exit_0(data_dir, tmp_path):
    out = tmp_path / "out"
    (node,) = launch([[*TORCHRUN, HOOKS, "--rank", "1", "--sigterm-at-step", "2",
                       "--", *ddp_train_argv(data_dir, out, "--max_steps", "50")]])
    assert node.proc.returncode == 0, node.text[-4000:]
    assert "[trl-padfree] steps: 2/50 in " in node.text and "(stopped by SIGTERM on rank 1)" in node.text
    assert sorted(p.name for p in (out / "checkpoint-2").glob("rng_state*")) == ["rng_state_0.pth", "rng_state_1.pth"]
    assert (out / "checkpoint-2" / "trl_padfree_checkpoint.json").is_file() and not (out / "model.safetensors").exists()
    assert json.loads((out / "launch_summary.json").read_text())["checkpoint"] == str(out / "checkpoint-2")


def test_fsdp_on_cpu_is_refused_instead_of_silently_training_ddp(data_dir, tmp_path, monkeypatch, capsys):
    from trl_padfree.launch import main

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    out = tmp_path / "out"
    assert main(ddp_train_argv(data_dir, out)) == 2
    assert ("trl-padfree train: error: FSDP was requested (an accelerate FSDP config or the fsdp field) but this run "
            "is on the CPU, where accelerate does not shard") in capsys.readouterr().err
    assert not out.exists()


def test_deepspeed_zero3_on_two_cpu_ranks(data_dir, tmp_path):
    pytest.importorskip("deepspeed")
    config = tmp_path / "zero3-cpu.yaml"
    text = (ROOT / "configs" / "accelerate" / "deepspeed-zero3.yaml").read_text(encoding="utf-8")
    config.write_text(text.replace("num_processes: 8", "num_processes: 2").replace("mixed_precision: bf16",
                                                                                   "mixed_precision: 'no'"))
    out = tmp_path / "out"
    (node,) = launch([[*accelerate_launch(config), TRAIN, *ddp_train_argv(data_dir, out)]])
    assert node.proc.returncode == 0, node.text[-4000:]
    summary = json.loads((out / "launch_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["distributed_type"] == "DEEPSPEED" and summary["global_step"] == 2
    from safetensors.torch import load_file

    saved, demo = load_file(str(out / "model.safetensors")), load_file(str(DEMO_MODEL / "model.safetensors"))
    assert saved.keys() == demo.keys() and all(saved[k].shape == demo[k].shape for k in demo)  # gathered, not shards
