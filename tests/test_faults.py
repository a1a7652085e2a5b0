"""Faults during ``trl-padfree train`` lose no work (issue 12): kills mid-save, a full disk, resume, failed eval.

One finished 6-step run (checkpoints every 2 steps) is shared; the other runs reuse its data and settings. Faults
are real: SIGKILL of a real process while it writes a checkpoint, ENOSPC from a full tmpfs (or EFBIG from
RLIMIT_FSIZE where no tmpfs can be mounted); the test-only hooks are in ``tests/launch_hooks.py``.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from launch_hooks import FailAtStep, FailEvaluation, FullDiskAtEnd
from launch_inputs import TRAIN_STEPS, train_argv, write_demo_data
from paths import ROOT
from safetensors.torch import load_file

from trl_padfree.launch import main
from trl_padfree.launch.atomic_save import mark_complete
from trl_padfree.launch.config import ConfigError
from trl_padfree.launch.files import write_json_atomic
from trl_padfree.launch.resume import choose_resume
from trl_padfree.launch.run_files import CHECKPOINT_MARKER, RUN_FILE, STAGING_DIR, checkpoint_problem


def fault_argv(data_dir: Path, out: Path, *extra: str) -> list[str]:
    """The runs of test_launch_train.py, saving a checkpoint every 2 steps."""
    return train_argv(
        data_dir, out,
        "--eval_strategy", "no",  # the eval data is evaluated once, at the end (after the final save)
        "--save_strategy", "steps",
        "--save_steps", "2",
        *extra,
    )  # fmt: skip


def run(argv: list[str], capsys: pytest.CaptureFixture[str] | None = None, **kwargs) -> tuple[int, str, str]:
    """``main(argv)`` in-process: (exit code, stdout, stderr)."""
    if capsys is not None:
        capsys.readouterr()
        code = main(argv, **kwargs)
        captured = capsys.readouterr()
        return code, captured.out, captured.err
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv, **kwargs)
    return code, out.getvalue(), err.getvalue()


def losses(output_dir: Path) -> dict[int, float]:
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    return {entry["step"]: entry["loss"] for entry in history if "loss" in entry}


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = load_file(a), load_file(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


def error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("trl-padfree train: error: ")
    return lines[0].removeprefix("trl-padfree train: error: ")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_data(tmp_path_factory.mktemp("fault-data"))


@pytest.fixture(scope="module")
def finished_run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("finished") / "out"
    code, stdout, err = run(fault_argv(data_dir, out))
    assert code == 0, err[-3000:]
    return out


# ------------------------------------------------------------------------------------------- checkpoints


def test_checkpoints_are_complete_marked_and_of_this_run(finished_run):
    run_record = json.loads((finished_run / RUN_FILE).read_text())
    assert run_record["status"] == "finished" and run_record["global_step"] == TRAIN_STEPS
    for step in (2, 4, 6):
        path = finished_run / f"checkpoint-{step}"
        marker = json.loads((path / CHECKPOINT_MARKER).read_text())
        assert marker["run_id"] == run_record["run_id"] and marker["step"] == step
        assert {"model.safetensors", "optimizer.pt", "trainer_state.json"} <= set(marker["files"])
        assert checkpoint_problem(str(path), run_record["run_id"]) is None
    assert not (finished_run / STAGING_DIR).exists()
    assert (finished_run / "model.safetensors").is_file()


def test_resume_true_on_a_finished_run_trains_nothing(finished_run, data_dir, capsys):
    weights = (finished_run / "model.safetensors").read_bytes()
    state = (finished_run / "trainer_state.json").read_text()
    code, _, err = run(fault_argv(data_dir, finished_run, "--resume_from_checkpoint", "true"), capsys)
    assert code == 2
    assert error_line(err) == (
        f"resume_from_checkpoint: true, but the run in {str(finished_run)!r} is finished (step 6 of 6; the model is "
        "saved there): nothing to resume; to train further, resume one of its checkpoints by path with a larger "
        "max_steps, or start a new run from the model (model_name_or_path) in another output_dir"
    )
    assert (finished_run / "model.safetensors").read_bytes() == weights
    assert (finished_run / "trainer_state.json").read_text() == state


def test_a_finished_run_trains_further_from_a_checkpoint_path_with_more_steps(finished_run, data_dir, tmp_path,
                                                                               capsys):
    out = tmp_path / "out"
    shutil.copytree(finished_run, out)
    argv = fault_argv(data_dir, out, "--resume_from_checkpoint", str(out / "checkpoint-6"), "--max_steps", "8")
    code, stdout, err = run(argv, capsys)
    assert code == 0, err[-3000:]
    assert "[trl-padfree] steps: 8/8" in stdout
    assert sorted(losses(out)) == list(range(1, 9)) and {s: losses(out)[s] for s in range(1, 7)} == losses(finished_run)


def test_sigkill_while_saving_then_resume_takes_the_last_intact_checkpoint(finished_run, data_dir, tmp_path, capsys):
    """SIGKILL a real run while it writes checkpoint-4: checkpoint-4 never appears (only partial files in the
    staging directory); resume true takes checkpoint-2, says so, and ends with the uninterrupted run's losses
    and byte-identical weights."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "launch_hooks.py"), "--sigkill-in-save-at-step", "4", "--",
         *fault_argv(data_dir, out)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    partial = out / STAGING_DIR / "checkpoint-4"
    assert (partial / "model.safetensors").is_file() and not (partial / "trainer_state.json").exists()

    code, stdout, err = run(fault_argv(data_dir, out, "--resume_from_checkpoint", "true"), capsys)
    assert code == 0, err[-3000:]
    assert (
        f"[trl-padfree] resuming from {out / 'checkpoint-2'} (step 2, the newest complete checkpoint of this run); "
        "passed over: checkpoint-4 (its save was interrupted; the partial files are discarded)"
    ) in stdout
    assert f"[trl-padfree] steps: {TRAIN_STEPS}/{TRAIN_STEPS}" in stdout
    assert losses(out) == losses(finished_run)
    assert_same_weights(out / "model.safetensors", finished_run / "model.safetensors")
    assert not (out / STAGING_DIR).exists()


@contextlib.contextmanager
def small_disk(where: Path, kind: str):
    """``kind="tmpfs"``: a 64 MB tmpfs at ``where`` (skips where mounting is not allowed); else a plain directory."""
    where.mkdir()
    mounted = kind == "tmpfs" and shutil.which("mount") is not None and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)], capture_output=True
    ).returncode == 0
    if kind == "tmpfs" and not mounted:
        pytest.skip("cannot mount a tmpfs here (needs root); the RLIMIT_FSIZE variant covers the same path")
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", str(where)], check=True)


@pytest.mark.parametrize("disk", ["tmpfs", "rlimit"])
def test_a_full_disk_at_the_final_save_reports_the_last_checkpoint_and_resume_completes(data_dir, tmp_path, capsys,
                                                                                        disk):
    with small_disk(tmp_path / "disk", disk) as tmpfs:
        out = tmp_path / "disk" / "out"
        ballast = tmp_path / "disk" / "ballast"
        full = FullDiskAtEnd(str(ballast) if tmpfs else None)
        try:
            code, stdout, err = run(fault_argv(data_dir, out, "--save_steps", "3"), capsys, callbacks=[full])
        finally:
            full.restore()
        assert code == 1
        message = error_line(err)
        assert message.startswith(f"could not save the final model to {str(out)!r}: ")
        assert ("No space left on device" if tmpfs else "File too large") in message
        assert message.endswith(
            f"; the last complete checkpoint is {out / 'checkpoint-6'} (resume with --resume_from_checkpoint true once "
            "there is space)"
        )
        assert not (out / "model.safetensors").exists() and not (out / STAGING_DIR).exists()
        # "failed" where the run file could still be written (a full disk may refuse even that): never "finished"
        assert json.loads((out / RUN_FILE).read_text())["status"] in ({"training", "failed"} if tmpfs else {"failed"})

        if tmpfs:
            ballast.unlink()  # space is freed
        code, stdout, err = run(fault_argv(data_dir, out, "--save_steps", "3", "--resume_from_checkpoint", "true"),
                                capsys)
        assert code == 0, err[-3000:]
        assert f"[trl-padfree] {out / 'checkpoint-6'} is at the last step (6): nothing left to train" in stdout
        assert_same_weights(out / "model.safetensors", out / "checkpoint-6" / "model.safetensors")
        assert json.loads((out / "trainer_state.json").read_text())["global_step"] == TRAIN_STEPS  # not 7 of 6
        assert json.loads((out / RUN_FILE).read_text())["status"] == "finished"


def test_a_full_disk_at_a_checkpoint_stops_with_one_line_naming_the_last_complete_one(data_dir, tmp_path, capsys):
    out = tmp_path / "out"
    full = FullDiskAtEnd(None, at_step=4)  # the file-size limit drops before checkpoint-4 is written
    try:
        code, stdout, err = run(fault_argv(data_dir, out), capsys, callbacks=[full])
    finally:
        full.restore()
    assert code == 1
    message = error_line(err)
    assert message.startswith("could not write checkpoint-4: ") and "File too large" in message
    assert message.endswith(f"; the last complete checkpoint is {out / 'checkpoint-2'} (free space, then resume with "
                            "--resume_from_checkpoint true)")
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"] and not (out / STAGING_DIR).exists()


def test_an_error_during_training_says_where_the_work_is(data_dir, tmp_path, capsys):
    out = tmp_path / "out"
    capsys.readouterr()
    with pytest.raises(RuntimeError, match="training failed on purpose at step 5"):
        main(fault_argv(data_dir, out), callbacks=[FailAtStep(5)])
    assert (
        f"[trl-padfree] training stopped by an error at step 5; the last complete checkpoint of this run is "
        f"{out / 'checkpoint-4'} (resume with --resume_from_checkpoint true)"
    ) in capsys.readouterr().out


def test_a_failed_final_evaluation_keeps_the_model_and_overwrite_starts_a_new_run(finished_run, data_dir, tmp_path,
                                                                                   capsys):
    out = tmp_path / "out"
    shutil.copytree(finished_run, out)
    old_id = json.loads((out / RUN_FILE).read_text())["run_id"]
    old_weights = (out / "model.safetensors").read_bytes()
    argv = fault_argv(data_dir, out, "--overwrite_output_dir", "true", "--max_steps", "2", "--save_strategy", "no")
    code, stdout, err = run(argv, capsys, callbacks=[FailEvaluation()])
    assert code == 1
    assert error_line(err) == (
        "the final evaluation failed: evaluation failed on purpose (tests/launch_hooks.py); the trained model is "
        f"saved in {out}"
    )
    assert (out / "model.safetensors").read_bytes() != old_weights  # the new run's 2-step model, saved first
    new_id = json.loads((out / RUN_FILE).read_text())["run_id"]
    assert new_id != old_id
    assert checkpoint_problem(str(out / "checkpoint-6"), new_id) == "written by another run"


# ------------------------------------------------------------------------------------------- choosing a checkpoint


def _fake_checkpoint(out: Path, step: int, run_id: str | None) -> Path:
    path = out / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"w" * 10)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if run_id is not None:
        mark_complete(str(path), run_id, step)
    return path


def test_resume_true_passes_over_incomplete_and_foreign_checkpoints(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    write_json_atomic(str(out / RUN_FILE), {"run_id": "this", "status": "interrupted"})
    _fake_checkpoint(out, 2, "this")
    _fake_checkpoint(out, 4, "this")
    (_fake_checkpoint(out, 5, "this") / "model.safetensors").write_bytes(b"w" * 3)  # cut short after the marker
    _fake_checkpoint(out, 6, None)  # no marker: the save never finished (or another tool wrote it)
    (_fake_checkpoint(out, 7, "this") / "trainer_state.json").unlink()
    _fake_checkpoint(out, 10, "another")
    choice = choose_resume(str(out))
    assert choice.path == str(out / "checkpoint-4") and choice.step == 4 and choice.run_id == "this"
    assert choice.skipped == [
        "checkpoint-10 (written by another run)",
        "checkpoint-7 (trainer_state.json is missing)",
        "checkpoint-6 (incomplete (no trl-padfree completion marker: the save was interrupted, or another tool "
        "wrote it))",
        "checkpoint-5 (model.safetensors is 3 bytes, 10 were written)",
    ]


def test_resume_true_needs_a_run_of_this_launcher(tmp_path):
    out = tmp_path / "out"
    _fake_checkpoint(out, 3, None)
    with pytest.raises(ConfigError, match=r"holds no trl-padfree run to resume \(its checkpoints \(checkpoint-3\) "
                                          r"were not written by trl-padfree train\)"):
        choose_resume(str(out))
