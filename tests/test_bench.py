"""``trl-padfree bench`` (benchmarks/): bad options exit 2 in one line; on tiny settings every task runs end to
end, a process per variant, and its report holds the measured figures, the FLOP ratio and the batch check."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from benchmarks.cli import build_parser, check, main
from benchmarks.workloads import TASKS

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--steps", "1", "--warmup", "1", "--scale", "0.05", "--batch-size", "2", "--groups", "2", "--gens", "2",
        "--completion", "3"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--steps", "0"], "--steps must be >= 1, got 0"),
    (["--variants", "nope"], "unknown variant 'nope' for --task sft; choose from padded, trl-native"),
    (["--task", "dpo", "--datasets", "flan"], "--datasets is for --task sft or hybrid, not dpo"),
    (["--task", "rloo", "--whole-step"], "--whole-step is for --task grpo"),
    (["--scale", "-1"], "--scale must be a finite number > 0, got -1.0"),
    (["--variants", "padded,packed-fa2"], "packed-fa2 needs --device cuda and flash-attn"),
    (["--task", "nope"], "argument --task: invalid choice: 'nope'"),
    (["--output-dir", "{tmp}/f"], "is a file; pass a directory"),
])
def test_bad_options_exit_2_with_one_line(argv, message, capsys, tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(SystemExit) as exc:
        main(["--output-dir", str(tmp_path / "out"), *(a.format(tmp=tmp_path) for a in argv)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("trl-padfree bench: error: ") and message in err
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()


def run_report(tmp_path, *argv: str) -> dict:
    assert main([*argv, *TINY, "--output-dir", str(tmp_path), "--name", "r"]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    markdown = (tmp_path / "r.md").read_text()
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"  # the paper's figure: tokens/s, memory, loss
    for dataset in report["datasets"].values():
        for name, figures in dataset["figures"].items():  # every figure in the table, next to its FLOP ratio
            ratio = dataset["ratios"][name]
            assert f"| {name} | {figures['tokens_per_second']:,.0f} | {ratio['speed']:.2f}x | " \
                   f"{ratio['flop_ratio']:.2f}x |" in markdown
    return report


def test_sft_variants_train_the_same_batches_and_the_flop_ratio_is_computed(tmp_path):
    report = run_report(tmp_path, "--variants", "padded,sft-padfree,token-budget", "--datasets", "flan")
    flan = report["datasets"]["flan"]
    steps = {name: runs[0]["steps"] for name, runs in flan["variants"].items()}
    assert all(len(s) == 2 for s in steps.values())  # warm-up + timed, each variant in its own worker
    assert [s["records"] for s in steps["padded"]] == [s["records"] for s in steps["sft-padfree"]]
    assert [s["tokens"] for s in steps["padded"]] == [s["tokens"] for s in steps["sft-padfree"]]
    assert flan["ratios"]["sft-padfree"]["same_batches"] and not flan["ratios"]["token-budget"]["same_batches"]
    assert flan["ratios"]["sft-padfree"]["flop_ratio"] > 1.2  # no padding, no masked attention, scored head
    assert flan["ratios"]["sft-padfree"]["loss_diff"] < 1e-4  # the same losses, step by step
    assert flan["ratios"]["token-budget"]["loss_diff"] is None  # other batches: not compared


@pytest.mark.slow  # a worker per variant, seven tasks: .ci/run runs it with the slow tests
@pytest.mark.parametrize("argv", [["--task", "dpo"], ["--task", "reward"], ["--task", "kto"], ["--task", "grpo"],
                                  ["--task", "rloo"], ["--task", "hybrid", "--datasets", "orcamath"],
                                  ["--task", "grpo", "--whole-step", "--model-size", "tiny"]], ids=" ".join)
def test_every_task_runs_end_to_end_on_tiny_settings(argv, tmp_path):
    report = run_report(tmp_path, *argv)
    (dataset,) = report["datasets"].values()
    ratios, figures = dataset["ratios"], dataset["figures"]
    padfree = "sft-padfree" if "hybrid" in argv else "padding-free"
    assert all(r["same_batches"] for r in ratios.values())
    assert ratios[padfree]["flop_ratio"] > 1
    if "grpo" in argv or "rloo" in argv:  # generation timed apart from the rest of the step
        assert all(0 < f["median_generation_ms"] < f["median_step_ms"] for f in figures.values())
    else:
        assert ratios[padfree]["loss_diff"] < 1e-3


def test_the_commands_on_the_benchmark_pages_are_valid(monkeypatch):
    """Every ``trl-padfree bench`` command shown on the benchmark pages parses and validates (not run here)."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # the GPU commands, on any machine
    commands = []
    for page in ("docs/benchmark.md", "docs/dpo-bench.md"):
        for block in re.findall(r"```(?:bash)?\n(.*?)```", (ROOT / page).read_text(), flags=re.S):
            commands += [ln.split("#")[0].strip() for ln in block.splitlines() if "trl-padfree bench" in ln]
    assert len(commands) >= 5
    for command in commands:
        argv = shlex.split(command.split("trl-padfree bench", 1)[1])
        parser = build_parser()
        check(parser, parser.parse_args(argv))
    shown = {shlex.split(c.split("--task", 1)[1])[0] for c in commands if "--task" in c}
    assert shown == set(TASKS)  # every task is shown
