"""`trl-padfree bench --task grpo|rloo` (benchmarks/rl.py) runs (tiny sizes, one timed step) and its three layouts compute the same losses."""

from __future__ import annotations

import pytest

from benchmarks.cli import build_parser
from benchmarks.rl import run_rl
from trl_padfree._compat import rl_padding_free_unavailable


@pytest.mark.skipif(rl_padding_free_unavailable() is not None, reason=str(rl_padding_free_unavailable()))
@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_bench_rl_runs_and_the_layouts_agree(kind, tmp_path, capsys):
    parser = build_parser(kind)
    result = run_rl(parser, parser.parse_args([
        "--steps", "1", "--scale", "0.05", "--hidden", "32", "--layers", "1", "--vocab", "128", "--no-memory",
        "--task", kind, "--json", str(tmp_path / "r.json"), "--output-dir", str(tmp_path)]))
    layouts = result["layouts"]
    padded = layouts["padded"]["losses"][0]
    for layout in ("padfree", "once"):
        got = layouts[layout]["losses"][0]
        assert len(got) == len(padded) == 4  # 32 rows in micro-batches of 8
        assert all(abs(g - w) <= 1e-5 * max(abs(w), 1e-3) for g, w in zip(got, padded, strict=True)), (got, padded)
        assert layouts[layout]["flop_ratio"] > 1
    assert layouts["once"]["flop_ratio"] > layouts["padfree"]["flop_ratio"]
    assert layouts["once"]["pack_totals"]["no_grad"]["shared_tokens"] > 0
    assert layouts["padfree"]["pack_totals"]["no_grad"]["shared_tokens"] == 0
    assert "FLOP ratio" in capsys.readouterr().out and (tmp_path / "r.json").is_file()
    assert "FLOP ratio" in (tmp_path / f"{kind}-cpu.md").read_text() and (tmp_path / f"{kind}-cpu.json").is_file()


@pytest.mark.skipif(rl_padding_free_unavailable() is not None, reason=str(rl_padding_free_unavailable()))
def test_bench_grpo_whole_step_times_generation_next_to_stock_trl(tmp_path, capsys):
    from benchmarks.rl_step import run_whole_step

    parser = build_parser("grpo")
    result = run_whole_step(parser, parser.parse_args([
        "--task", "grpo", "--whole-step", "--model-size", "tiny", "--steps", "1", "--warmup", "0", "--groups", "2",
        "--gens", "2", "--completion", "3", "--prompt-mean", "6", "--output-dir", str(tmp_path)]))
    layouts = result["layouts"]
    assert list(layouts) == ["padded", "padfree", "once"]
    tokens = {name: r["real_tokens"] for name, r in layouts.items()}
    for r in layouts.values():
        assert len(r["step_seconds"]) == len(r["generation_seconds"]) == 1
        assert 0 < r["median_generation_s"] < r["median_step_s"]
        assert r["median_rest_s"] == pytest.approx(r["median_step_s"] - r["median_generation_s"])
        assert r["completion_mean_length"] == 3  # random weights: every completion runs to --completion tokens
    assert tokens["padded"] == tokens["padfree"] == tokens["once"] and tokens["padded"][0] > 4 * 3
    assert "generation s" in capsys.readouterr().out
    assert "step vs TRL" in (tmp_path / "grpo-step-cpu.md").read_text()


def test_bench_whole_step_is_for_grpo_only(capsys):
    parser = build_parser("rloo")
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--task", "rloo", "--whole-step"])
    assert exit_info.value.code == 2 and "--whole-step" in capsys.readouterr().err
