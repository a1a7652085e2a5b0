"""The private APIs of torch, TRL and transformers that trl_padfree relies on are still there and still behave as
relied on (``trl_padfree/_torch_private.py``, ``trl_padfree/_trl_private.py``): a failure here names what an upgrade
changed, before a run meets it. Real process groups over gloo (one process, or two spawned ones)."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import socket
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from trl_padfree._torch_private import pg_timeout_setter, registered_groups, rendezvous_handlers
from trl_padfree._trl_private import RELIED_ON, PrivateAPI


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def env_rendezvous(monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-process ``env://`` rendezvous (rank 0 of 1 on a free local port)."""
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)


@pytest.fixture
def one_process_group(env_rendezvous: None):
    """The default process group of this process alone (gloo), destroyed afterwards."""
    dist.init_process_group("gloo", init_method="env://", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------------- torch


def test_the_env_rendezvous_handler_yields_store_rank_and_world_size(env_rendezvous):
    handlers = rendezvous_handlers()
    assert isinstance(handlers, dict) and callable(handlers["env"])
    store, rank, world_size = next(handlers["env"]("env://", timeout=timedelta(seconds=30)))
    assert (rank, world_size) == (0, 1)
    assert isinstance(store, dist.Store)
    store.set("trl_padfree/probe", "1")  # the handshake keeps its keys in this store
    assert store.get("trl_padfree/probe") == b"1"


def test_init_process_group_goes_through_the_registry(env_rendezvous):
    handlers = rendezvous_handlers()
    original, seen = handlers["env"], []

    def recording(url, **kwargs):
        seen.append((url, sorted(kwargs)))
        yield from original(url, **kwargs)

    handlers["env"] = recording  # what install_handshake does (launch/rendezvous.py)
    try:
        dist.init_process_group("gloo", init_method="env://", rank=0, world_size=1)
        dist.destroy_process_group()
    finally:
        handlers["env"] = original
    assert len(seen) == 1 and seen[0][0].startswith("env:")  # "env:?rank=0&world_size=1"
    assert "timeout" in seen[0][1]  # install_handshake reads the timeout from the keywords


def test_registered_groups_holds_the_default_group_and_every_new_one(one_process_group):
    extra = dist.new_group([0], backend="gloo")
    groups = registered_groups()
    assert dist.group.WORLD in groups and extra in groups
    assert len(groups) == 2


def _timeout_worker(rank: int, init: str, result: str) -> None:
    """Rank 1 waits in a barrier that rank 0 never enters, after the group's timeout was set to 1 s."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    pg_timeout_setter()(timedelta(seconds=1))
    if rank == 0:  # stays until rank 1 has its answer (at most 20 s), in no collective
        deadline = time.monotonic() + 20
        while not os.path.exists(result) and time.monotonic() < deadline:
            time.sleep(0.1)
        os._exit(0)
    start = time.monotonic()
    try:
        dist.barrier()
        error = None
    except Exception as exc:  # noqa: BLE001  (gloo's own error type)
        error = str(exc)
    Path(f"{result}.tmp").write_text(json.dumps({"seconds": time.monotonic() - start, "error": error}))
    os.replace(f"{result}.tmp", result)
    os._exit(0)


def test_the_pg_timeout_setter_bounds_a_gloo_collective(tmp_path):
    setter = pg_timeout_setter()
    assert list(inspect.signature(setter).parameters) == ["timeout", "group"]
    result = tmp_path / "rank1.json"
    mp.start_processes(_timeout_worker, args=(f"file://{tmp_path / 'store'}", str(result)), nprocs=2,
                       start_method="spawn", join=True)
    report = json.loads(result.read_text())
    # torch's default for gloo is 30 minutes: without the setter rank 1 waits until rank 0 exits (20 s)
    assert report["error"] is not None and "timed out" in report["error"].lower(), report
    assert report["seconds"] < 10, report


# ------------------------------------------------------------------------------------------- TRL, transformers


def _resolve(owner: str):
    module, _, name = owner.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return importlib.import_module(owner)


@pytest.mark.parametrize("api", RELIED_ON, ids=lambda a: f"{a.owner}.{a.name}")
def test_a_private_trl_or_transformers_api_is_still_there(api: PrivateAPI):
    owner = _resolve(api.owner)
    assert hasattr(owner, api.name), f"{api.owner}.{api.name} is gone (used by trl_padfree.{api.used_by})"
    if api.params is None:
        return
    params = list(inspect.signature(getattr(owner, api.name)).parameters)
    assert params[: len(api.params)] == list(api.params), (
        f"{api.owner}.{api.name}{inspect.signature(getattr(owner, api.name))} changed (trl_padfree.{api.used_by} "
        f"relies on the parameters {api.params})"
    )


def test_the_list_covers_every_override_of_a_private_trainer_method():
    """Every method of trl_padfree's trainers whose name is private and also a method of TRL's or transformers'
    trainer (an override) is in RELIED_ON."""
    import transformers
    import trl

    import trl_padfree.launch.atomic_save
    import trl_padfree.launch.whole_run
    import trl_padfree.rl_trainer
    import trl_padfree.trainer
    from trl_padfree import DPOTrainer, GRPOTrainer, KTOTrainer, RewardTrainer, RLOOTrainer, SFTTrainer

    ours = [DPOTrainer, GRPOTrainer, KTOTrainer, RewardTrainer, RLOOTrainer, SFTTrainer,
            trl_padfree.launch.atomic_save.AtomicCheckpoints, trl_padfree.launch.whole_run.WholeRunLog,
            trl_padfree.rl_trainer.PaddingFreeRLMixin, trl_padfree.trainer.PadfreeTrainerMixin]
    theirs = [trl.DPOTrainer, trl.GRPOTrainer, trl.KTOTrainer, trl.RewardTrainer, trl.RLOOTrainer, trl.SFTTrainer,
              transformers.Trainer]
    listed = {api.name for api in RELIED_ON}
    overrides = set()
    for cls in ours:
        for klass in cls.__mro__:
            if klass.__module__.startswith("trl_padfree"):
                for name in vars(klass):
                    if name.startswith("_") and not name.startswith("__") and any(hasattr(t, name) for t in theirs):
                        overrides.add(name)
    assert {"_compute_loss", "_get_per_token_logps_and_entropies", "_save_checkpoint"} <= overrides
    assert overrides <= listed, f"not in trl_padfree/_trl_private.py's RELIED_ON: {sorted(overrides - listed)}"
