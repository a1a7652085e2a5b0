"""Real faults during ``trl-padfree train`` lose no work: SIGKILL mid-save, a full disk (ENOSPC on a tmpfs, or EFBIG
from RLIMIT_FSIZE), resume, a failed evaluation; one finished 6-step run (a checkpoint every 2 steps) is shared."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from launch_hooks import FailAtStep, FailEvaluation, FullDiskAtEnd
from launch_inputs import TRAIN_STEPS, train_argv, write_demo_data
from launch_runs import losses, run_launch
from paths import ROOT
from safetensors.torch import load_file

from trl_padfree.launch import main
from trl_padfree.launch.callbacks import CheckpointMarker
from trl_padfree.launch.config import ConfigError
from trl_padfree.launch.resume import (
    CHECKPOINT_MARKER,
    RUN_FILE,
    checkpoint_problem,
    choose_resume,
    write_json,
)


def fault_argv(data_dir: Path, out: Path, *extra: str) -> list[str]:
    return train_argv(data_dir, out, "--eval_strategy", "no", "--save_strategy", "steps", "--save_steps", "2", *extra)


def run(argv: list[str], *callbacks: Any) -> tuple[int, str, str]:
    return run_launch(argv, "sft", callbacks)


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = load_file(a), load_file(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[name], wb[name]) for name in wa)


def error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("trl-padfree train: error: "), err
    return lines[0].removeprefix("trl-padfree train: error: ")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_data(tmp_path_factory.mktemp("fault-data"))


@pytest.fixture(scope="module")
def finished_run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("finished") / "out"
    assert main(fault_argv(data_dir, out)) == 0
    return out


def test_checkpoints_are_marked_complete_and_a_finished_run_is_not_resumed_but_trains_further_by_path(
        finished_run, data_dir, tmp_path):
    record = json.loads((finished_run / RUN_FILE).read_text())
    assert record["status"] == "finished" and record["global_step"] == TRAIN_STEPS
    for step in (2, 4, 6):
        marker = json.loads((finished_run / f"checkpoint-{step}" / CHECKPOINT_MARKER).read_text())
        assert marker["run_id"] == record["run_id"] and marker["step"] == step
        assert {"model.safetensors", "optimizer.pt", "trainer_state.json"} <= set(marker["files"])
    weights = (finished_run / "model.safetensors").read_bytes()
    code, _, err = run(fault_argv(data_dir, finished_run, "--resume_from_checkpoint", "true"))
    assert code == 2 and "is finished (step 6 of 6; the model is saved there): nothing to resume; to train further, start a new run from its model" in error_line(err)
    assert (finished_run / "model.safetensors").read_bytes() == weights
    # trained further from a checkpoint path with more steps
    out = tmp_path / "out"
    shutil.copytree(finished_run, out)
    argv = fault_argv(data_dir, out, "--resume_from_checkpoint", str(out / "checkpoint-6"), "--max_steps", "8")
    code, stdout, err = run(argv)
    assert code == 0, err[-3000:]
    assert "[trl-padfree] steps: 8/8" in stdout
    assert sorted(losses(out)) == list(range(1, 9)) and {s: losses(out)[s] for s in range(1, 7)} == losses(finished_run)


def test_sigkill_while_saving_then_resume_takes_the_last_complete_checkpoint(finished_run, data_dir, tmp_path):
    """Killed while writing checkpoint-4 (no marker): resume takes checkpoint-2, ends as the uninterrupted run."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "launch_hooks.py"), "--sigkill-in-save-at-step", "4",
                           "--", *fault_argv(data_dir, out)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert not (out / "checkpoint-4" / CHECKPOINT_MARKER).exists()
    code, stdout, err = run(fault_argv(data_dir, out, "--resume_from_checkpoint", "true"))
    assert code == 0, err[-3000:]
    assert (f"[trl-padfree] resuming from {out / 'checkpoint-2'} (step 2, the newest complete checkpoint of this "
            "run); passed over: checkpoint-4 (incomplete (no trl-padfree completion marker") in stdout
    assert losses(out) == losses(finished_run)
    assert_same_weights(out / "model.safetensors", finished_run / "model.safetensors")


@pytest.mark.parametrize("disk", ["tmpfs", "rlimit"])
def test_a_full_disk_at_the_final_save_names_the_last_checkpoint_and_resume_completes(data_dir, tmp_path, disk):
    where = tmp_path / "disk"
    where.mkdir()
    tmpfs = disk == "tmpfs" and shutil.which("mount") is not None and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)], capture_output=True).returncode == 0
    if disk == "tmpfs" and not tmpfs:
        pytest.skip("cannot mount a tmpfs here (needs root); the RLIMIT_FSIZE variant covers the same path")
    try:
        out, ballast = where / "out", where / "ballast"
        full = FullDiskAtEnd(str(ballast) if tmpfs else None)
        try:
            code, _, err = run(fault_argv(data_dir, out, "--save_steps", "3"), full)
        finally:
            full.restore()
        message = error_line(err)
        assert code == 1 and message.startswith(f"could not save the final model to {str(out)!r}: ")
        assert ("No space left on device" if tmpfs else "File too large") in message
        assert message.endswith(f"; the last complete checkpoint is {out / 'checkpoint-6'} (resume with "
                                "--resume_from_checkpoint true once there is space)")
        assert not (out / "model.safetensors").exists()
        assert json.loads((out / RUN_FILE).read_text())["status"] in ({"training", "failed"} if tmpfs else {"failed"})
        if tmpfs:
            ballast.unlink()
        code, stdout, err = run(fault_argv(data_dir, out, "--save_steps", "3", "--resume_from_checkpoint", "true"))
        assert code == 0, err[-3000:]
        assert f"[trl-padfree] {out / 'checkpoint-6'} is at the last step (6): nothing left to train" in stdout
        assert_same_weights(out / "model.safetensors", out / "checkpoint-6" / "model.safetensors")
        assert json.loads((out / RUN_FILE).read_text())["status"] == "finished"
    finally:
        if tmpfs:
            subprocess.run(["umount", str(where)], check=True)


def test_a_full_disk_at_a_checkpoint_or_an_error_in_a_step_says_where_the_work_is(data_dir, tmp_path, capsys):
    out = tmp_path / "out"
    full = FullDiskAtEnd(None, at_step=4)  # the file-size limit drops before checkpoint-4 is written
    try:
        with pytest.raises(Exception, match="File too large"):  # OSError, or safetensors' own error
            main(fault_argv(data_dir, out), callbacks=[full])
    finally:
        full.restore()
    assert (f"[trl-padfree] training stopped by an error at step 4; the last complete checkpoint of this run is "
            f"{out / 'checkpoint-2'} (resume with --resume_from_checkpoint true)") in capsys.readouterr().out
    assert checkpoint_problem(str(out / "checkpoint-4"), json.loads((out / RUN_FILE).read_text())["run_id"])
    with pytest.raises(RuntimeError, match="training failed on purpose at step 5"):
        main(fault_argv(data_dir, tmp_path / "out2"), callbacks=[FailAtStep(5)])
    assert (f"[trl-padfree] training stopped by an error at step 5; the last complete checkpoint of this run is "
            f"{tmp_path / 'out2' / 'checkpoint-4'}") in capsys.readouterr().out


def test_a_failed_final_evaluation_keeps_the_model_and_overwrite_starts_a_new_run(finished_run, data_dir, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(finished_run, out)
    old_id = json.loads((out / RUN_FILE).read_text())["run_id"]
    old_weights = (out / "model.safetensors").read_bytes()
    argv = fault_argv(data_dir, out, "--overwrite_output_dir", "true", "--max_steps", "2", "--save_strategy", "no")
    code, _, err = run(argv, FailEvaluation())
    assert code == 1 and error_line(err) == (
        "the final evaluation failed: evaluation failed on purpose (tests/launch_hooks.py); the trained model is "
        f"saved in {out}")
    assert (out / "model.safetensors").read_bytes() != old_weights
    new_id = json.loads((out / RUN_FILE).read_text())["run_id"]
    assert new_id != old_id and checkpoint_problem(str(out / "checkpoint-6"), new_id) == "written by another run"


def fake_checkpoint(out: Path, step: int, run_id: str | None) -> Path:
    path = out / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"w" * 10)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if run_id is not None:  # the callback as the Trainer calls it after a save
        args = SimpleNamespace(should_save=True, output_dir=str(out))
        CheckpointMarker(run_id).on_save(args, SimpleNamespace(global_step=step), None)
    return path


def test_resume_true_passes_over_incomplete_and_foreign_checkpoints(tmp_path):
    out = tmp_path / "out"
    fake_checkpoint(out, 3, None)
    with pytest.raises(ConfigError, match=r"holds no trl-padfree run to resume \(its checkpoints \(checkpoint-3\) "):
        choose_resume(str(out))
    write_json(str(out / RUN_FILE), {"run_id": "this", "status": "interrupted"})
    fake_checkpoint(out, 2, "this")
    fake_checkpoint(out, 4, "this")
    (fake_checkpoint(out, 5, "this") / "model.safetensors").write_bytes(b"w" * 3)  # cut short after the marker
    fake_checkpoint(out, 6, None)  # no marker: the save never finished (or another tool wrote it)
    (fake_checkpoint(out, 7, "this") / "trainer_state.json").unlink()
    fake_checkpoint(out, 10, "another")
    choice = choose_resume(str(out))
    assert (choice.path, choice.step, choice.run_id) == (str(out / "checkpoint-4"), 4, "this")
    assert choice.skipped == [
        "checkpoint-10 (written by another run)",
        "checkpoint-7 (trainer_state.json is missing)",
        "checkpoint-6 (incomplete (no trl-padfree completion marker: the save was interrupted, or another tool "
        "wrote it))",
        "checkpoint-5 (model.safetensors is 3 bytes, 10 were written)",
    ]
