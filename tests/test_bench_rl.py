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
