"""``trl-padfree bench --task dpo``: the FLOP arithmetic on hand-made batches, a tiny run of the three variants
(equal losses, identical batch fingerprints) and bad options (exit 2, one line)."""

from __future__ import annotations

import math

import pytest
from trl.trainer.dpo_trainer import DataCollatorForPreference as TRLCollator

from benchmarks import cli, main
from benchmarks.dpo import DPOBenchConfig, run_dpo_benchmark
from benchmarks.dpo_data import batch_pairs, batch_workload, make_pairs, pairs_fingerprint
from benchmarks.dpo_report import failed_targets
from benchmarks.flops import Workload, forward_flops
from trl_padfree._compat import dpo_padding_free_unavailable
from trl_padfree.preference import DataCollatorForPreference

TINY = dict(layers=4, hidden=256, intermediate=688, heads=8, kv_heads=4, vocab_size=2048)
# Two pairs: (P, C, R) = (3, 2, 1) and (2, 4, 3)
PAIRS = [
    {"prompt_ids": [1, 10, 11], "chosen_ids": [20, 2], "rejected_ids": [2]},
    {"prompt_ids": [1, 12], "chosen_ids": [21, 22, 23, 2], "rejected_ids": [24, 25, 2]},
]


def _batches():
    return {
        "padded": TRLCollator(pad_token_id=0)(PAIRS),
        "padfree": DataCollatorForPreference(pad_token_id=0)(PAIRS),
        "once": DataCollatorForPreference(pad_token_id=0, prompt_once=True)(PAIRS),
    }


def test_workload_of_each_layout_by_hand():
    work = {name: batch_workload(batch) for name, batch in _batches().items()}
    # padded: 4 rows of T = max(3+2, 2+4, 3+1, 2+3) = 6; the fused head scores T - 1 positions per row
    assert work["padded"] == Workload(slots=4 * 6, head_slots=4 * 5, attention_qk=4 * 6 * 6)
    # padding-free: segments 5, 6, 4, 5 (chosen rows then rejected rows)
    assert work["padfree"] == Workload(slots=20, head_slots=20, attention_qk=25 + 36 + 16 + 25)
    # prompt-once: per pair P+C+R+1 slots; chosen segment (P+C)^2, rejected (R+1) x (P+R)
    assert work["once"] == Workload(slots=(3 + 2 + 1 + 1) + (2 + 4 + 3 + 1), head_slots=17,
                                    attention_qk=5 * 5 + 2 * 4 + 6 * 6 + 4 * 5)


def test_forward_flops_by_hand():
    # per slot and layer: q/k/v/o 2*(2*256^2 + 2*256*128) = 393,216 and MLP 2*3*256*688 = 1,056,768; x 4 layers
    per_slot, per_qk, per_head = 4 * (393_216 + 1_056_768), 4 * 4 * 256, 2 * 256 * 2048
    assert (per_slot, per_qk, per_head) == (5_799_936, 4_096, 1_048_576)
    flops = {name: forward_flops(TINY, batch_workload(b))["total"] for name, b in _batches().items()}
    assert flops == {"padded": 160_759_808, "padfree": 137_388_032, "once": 116_789_248}
    assert flops["padded"] == 24 * per_slot + 144 * per_qk + 20 * per_head
    assert math.isclose(flops["padded"] / flops["padfree"], 1.170_115, rel_tol=1e-6)
    assert math.isclose(flops["padded"] / flops["once"], 1.376_495, rel_tol=1e-6)


def test_every_layout_gives_the_same_pairs_and_fingerprint():
    expected = [(p["prompt_ids"], p["chosen_ids"], p["rejected_ids"]) for p in PAIRS]
    prints = set()
    for batch in _batches().values():
        assert batch_pairs(batch) == expected
        prints.add(pairs_fingerprint(batch_pairs(batch)))
    assert len(prints) == 1 and next(iter(prints)).startswith("2x20:")  # (2*3+2+1) + (2*2+4+3)
    swapped = pairs_fingerprint(list(reversed(expected)))
    assert swapped not in prints


def test_pairs_are_seeded_and_clipped():
    a = make_pairs(64, vocab_size=256, seed=3, max_length=300)
    assert a == make_pairs(64, vocab_size=256, seed=3, max_length=300)
    assert a != make_pairs(64, vocab_size=256, seed=4, max_length=300)
    for p in a:
        assert p["prompt"][0] == 1 and p["chosen"][-1] == 2 and p["rejected"][-1] == 2
        assert all(2 <= len(p[k]) <= 300 for k in ("prompt", "chosen", "rejected"))


@pytest.mark.skipif(dpo_padding_free_unavailable() is not None, reason=str(dpo_padding_free_unavailable()))
def test_tiny_run_of_the_three_variants(tmp_path):
    config = DPOBenchConfig(layers=1, hidden=64, intermediate=128, heads=4, kv_heads=2, vocab_size=256,
                            batch_size=4, steps=2, warmup=0, length_scale=0.04, threads=1, subprocess=False)
    report = run_dpo_benchmark(config, log=lambda *_: None)
    variants = report["variants"]
    assert list(variants) == ["dpo-trl-padded", "dpo-padfree", "dpo-prompt-once"]
    padded = variants["dpo-trl-padded"]
    assert padded["trainer"] == "trl.trainer.dpo_trainer.DPOTrainer" and padded["attn_implementation"] == "sdpa"
    for name in ("dpo-padfree", "dpo-prompt-once"):
        res = variants[name]
        assert res["batch_fingerprints"] == padded["batch_fingerprints"]
        assert res["real_tokens"] == padded["real_tokens"]  # TRL's count, prompt twice, in every layout
        assert res["input_tokens"] != padded["input_tokens"]  # but not the slots forwarded
        assert res["train_loss"] == pytest.approx(padded["train_loss"], rel=1e-5)
        assert report["comparison"][name]["flop_ratio"] > 1.0
    assert not failed_targets(report)
    assert [t["holds"] for t in report["targets"] if "losses" in t["target"]] == [True, True]
    assert all(t["holds"] is None for t in report["targets"] if "losses" not in t["target"])  # not the target setup


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "--steps must be >= 1"),
    (["--variants", "dpo-nope"], "unknown DPO variant 'dpo-nope'"),
    (["--length-scale", "-1"], "--length-scale must be"),
    (["--lr", "nan"], "--lr must be a finite number"),
    (["--beta", "0"], "--beta must be a finite number"),
    (["--heads", "3"], "--hidden (256) must be divisible"),
    (["--bogus", "1"], "unrecognized arguments: --bogus 1"),
    (["--dtype", "int8"], "invalid choice"),
])
def test_bad_options_exit_2_with_one_line(args, message, capsys):
    for entry in (main, cli.main):  # also through `trl-padfree bench --task dpo`
        with pytest.raises(SystemExit) as exc:
            entry(["--task", "dpo", *args])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err and err.startswith("trl-padfree bench --task dpo: error:")


def test_output_dir_that_is_a_file_exits_2(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(SystemExit) as exc:
        main(["--task", "dpo", "--output-dir", str(target)])
    assert exc.value.code == 2 and "it is a file" in capsys.readouterr().err
