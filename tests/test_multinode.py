"""Two torchrun "nodes" with their own disks (save_on_each_node), an elastic restart, a killed rank, configured as
docs/distributed.md says; every launch checks that no process of the run is left (``two_ranks.launch``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from launch_inputs import DDP_BATCH, DDP_RECORDS, ddp_train_argv, write_ddp_data
from launch_runs import losses
from paths import ROOT
from safetensors.torch import load_file
from two_ranks import free_port, launch

from trl_padfree.launch.resume import CHECKPOINT_MARKER, choose_resume

pytestmark = pytest.mark.slow  # several launches each: run with TRL_PADFREE_SLOW=1

HOOKS = str(ROOT / "tests" / "launch_hooks.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_ddp_data(tmp_path_factory.mktemp("distributed-data"))


def run_layout(layout: str, data_dir: Path, outs: list[Path], hooks: list[str], *extra: str, restarts: int = 0,
               **env: str):
    """``layout`` "2x1": two torchrun nodes of one rank, node i writing to ``outs[i]`` (save_on_each_node); "1x2":
    one node of two ranks writing to ``outs[0]``. ``hooks``: tests/launch_hooks.py options (the faults)."""
    script = [*(["--max_restarts", str(restarts)] if restarts else []), HOOKS, *hooks, "--"]
    argv = ["--save_strategy", "steps", *extra]
    if layout == "1x2":
        return launch([[*TORCHRUN, "--standalone", "--nproc_per_node", "2", *script,
                        *ddp_train_argv(data_dir, outs[0], *argv)]], **env)
    nodes = two_nodes()
    return launch([[*nodes, *script, *ddp_train_argv(data_dir, out, "--save_on_each_node", "true", *argv)]
                   for out in outs], **env)


def two_nodes() -> list[str]:
    """torchrun for one of two nodes of one rank each, meeting at a free port."""
    return [*TORCHRUN, "--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint",
            f"127.0.0.1:{free_port()}"]


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = load_file(a), load_file(b)
    return wa.keys() == wb.keys() and all(wa[k].equal(wb[k]) for k in wa)


def test_two_nodes_with_their_own_disks_stop_on_sigterm_and_resume_on_every_node(data_dir, tmp_path):
    """save_on_each_node: true. SIGTERM on rank 1 after step 2: every node saves checkpoint-2 (its own rank's RNG
    state) to its own disk and exits 0; resume_from_checkpoint: true on both ends with the same model."""
    outs = [tmp_path / "node0", tmp_path / "node1"]
    common = ("--max_steps", "4", "--save_steps", "1", "--save_total_limit", "1")
    nodes = run_layout("2x1", data_dir, outs, ["--rank", "1", "--sigterm-at-step", "2"], *common)
    for node, out in zip(nodes, outs, strict=True):
        assert node.proc.returncode == 0, node.text[-4000:]
        assert "processes=2 processes on 2 nodes: the first process of every node writes (save_on_each_node)" in \
            node.text
        assert "(stopped by SIGTERM on rank 1)" in node.text and f"checkpoint saved to {out / 'checkpoint-2'}" in \
            node.text
        assert {"model.safetensors", "optimizer.pt"} <= set(
            json.loads((out / "checkpoint-2" / CHECKPOINT_MARKER).read_text())["files"])
        assert choose_resume(str(out)).step == 2
    assert sorted(p.name for out in outs for p in (out / "checkpoint-2").glob("rng_state*")) == [
        "rng_state_0.pth", "rng_state_1.pth"]

    nodes = run_layout("2x1", data_dir, outs, [], *common, "--resume_from_checkpoint", "true")
    for node, out in zip(nodes, outs, strict=True):
        assert node.proc.returncode == 0, node.text[-4000:]
        assert f"resuming from {out / 'checkpoint-2'} (step 2, the newest complete checkpoint" in node.text
        summary = json.loads((out / "launch_summary.json").read_text())
        assert summary["world_size"] == 2 and summary["global_step"] == 4
        epoch = json.loads((out / "trainer_state.json").read_text())["epoch"]
        assert epoch == pytest.approx(4 * 2 * DDP_BATCH / DDP_RECORDS)  # both ranks took their batches
    assert same_weights(outs[0] / "model.safetensors", outs[1] / "model.safetensors")


def test_elastic_restart_resumes_the_newest_complete_checkpoint_and_matches_an_uninterrupted_run(data_dir, tmp_path):
    """torchrun --max_restarts 1 with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, global rank 1 SIGKILLed after step 5:
    the restarted workers take checkpoint-4 by themselves and end byte-identical to an uninterrupted run."""
    elastic = ("--max_steps", "8", "--save_steps", "2")
    reference, restarted = tmp_path / "reference", tmp_path / "restarted"
    (node,) = run_layout("1x2", data_dir, [reference], [], *elastic)
    assert node.proc.returncode == 0, node.text[-4000:]
    (node,) = run_layout("1x2", data_dir, [restarted], ["--rank", "1", "--sigkill-at-step", "5"], *elastic,
                         restarts=1, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    assert node.proc.returncode == 0, node.text[-4000:]
    assert (f"[trl-padfree] torchrun restart 1: resuming from {restarted / 'checkpoint-4'} (step 4, the newest "
            "complete checkpoint of this run)") in node.text, node.text[-4000:]
    assert losses(restarted) == losses(reference)
    assert same_weights(restarted / "model.safetensors", reference / "model.safetensors")


@pytest.mark.parametrize("layout", ["1x2", "2x1"])
def test_a_killed_rank_ends_every_process_of_the_run(layout, data_dir, tmp_path):
    """Rank 1 is SIGKILLed after step 3: every node's torchrun exits non-zero and no process is left (checked by
    ``launch``); checkpoint-2 stays the newest complete one."""
    outs = [tmp_path / "node0", tmp_path / "node1"] if layout == "2x1" else [tmp_path / "out"]
    nodes = run_layout(layout, data_dir, outs, ["--rank", "1", "--sigkill-at-step", "3"], "--max_steps", "40",
                       "--save_steps", "2")
    for node in nodes:
        assert node.proc.returncode != 0, node.text[-3000:]
    assert "Signal 9 (SIGKILL) received by PID" in "\n".join(n.text for n in nodes)
    assert max(n.ended for n in nodes) - min(n.ended for n in nodes) < 60
    for out in outs:
        assert choose_resume(str(out)).step == 2


def test_a_config_refused_on_one_node_ends_every_node(data_dir, tmp_path):
    """Node 1's data file is missing: its worker exits 2 with one line; node 0's worker fails at its next collective
    (the lost peer) and every torchrun exits non-zero within seconds (docs/distributed.md); nothing is written."""
    outs, missing, nodes = [tmp_path / "node0", tmp_path / "node1"], tmp_path / "nowhere" / "train.jsonl", two_nodes()
    nodes = launch([[*nodes, str(ROOT / "scripts" / "train.py"), *ddp_train_argv(data_dir, out, *extra)]
                    for out, extra in zip(outs, [[], ["--train_file", str(missing)]], strict=True)])
    shown = "\n=====\n".join(n.text[-3000:] for n in nodes)
    refused = nodes[1].first(f"trl-padfree train: error: data file not found: train_file='{missing}'")
    assert "exitcode  : 2" in nodes[1].text and all(node.proc.returncode != 0 for node in nodes), shown
    assert max(n.ended for n in nodes) - refused < 30, shown
    assert not any(out.exists() for out in outs)
