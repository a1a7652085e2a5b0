"""launch.rendezvous: the handshake that numbers torchrun attempts in a store that outlives them, carries a config
refused on one process to all, and agrees on the restart count. Ranks are threads over a real TCPStore here; the
torchrun runs are in tests/test_multinode.py (slow)."""

from __future__ import annotations

import importlib
import json
import threading
from typing import Any

import pytest
from torch.distributed import TCPStore

from trl_padfree.launch import rendezvous
from trl_padfree.launch.config import RefusedElsewhere
from trl_padfree.launch.rendezvous import KEY, join_attempt


@pytest.fixture
def store():
    """The store the ranks meet through (torchrun's agent hosts it); each rank gets a client of its own."""
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def client(store: TCPStore) -> TCPStore:
    return TCPStore("127.0.0.1", store.port, is_master=False)


def attempt(store: Any, world: int, order: list[int], **per_rank: Any) -> dict[int, Any]:
    """Run one attempt's handshake, one thread per rank started in ``order``; ``per_rank``: keyword -> {rank: value}."""
    got: dict[int, Any] = {}

    def rank(r: int) -> None:
        kwargs = {name: values.get(r) for name, values in per_rank.items() if r in values}
        try:
            got[r] = join_attempt(client(store), r, world, timeout=20, **kwargs)
        except Exception as exc:  # noqa: BLE001
            got[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in order]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return got


def test_every_attempt_gets_a_new_number_even_when_the_others_arrive_before_rank_0(store):
    for number in (1, 2, 3):  # the same store: torchrun's agent store across restarts
        got = attempt(store, 3, [2, 1, 0])
        assert {r: a.number for r, a in got.items()} == {0: number, 1: number, 2: number}


def test_a_rank_that_read_the_last_attempts_number_waits_for_the_new_one(store):
    """After attempt 1, rank 1 of attempt 2 finds number 1 and its old answer (another token) in the store, and
    rank 0 arrives a second later: rank 1 must not take number 1."""
    attempt(store, 2, [0, 1])
    got: dict[int, Any] = {}
    late = threading.Thread(target=lambda: got.update({1: join_attempt(client(store), 1, 2, timeout=20)}))
    late.start()
    threading.Event().wait(1.0)
    assert json.loads(store.get(f"{KEY}1/joined/1"))["token"] != json.loads(store.get(f"{KEY}1/answer/1"))["token"]
    got[0] = join_attempt(client(store), 0, 2, timeout=20)
    late.join(20)
    assert got[0].number == got[1].number == 2


def test_the_restart_count_is_the_largest_of_all_ranks(store):
    """A node restarted only because another node failed keeps TORCHELASTIC_RESTART_COUNT 0 (torch issue 135712)."""
    got = attempt(store, 3, [0, 1, 2], restarts={0: 0, 1: 1, 2: 0})
    assert {r: a.restarts for r, a in got.items()} == {0: 1, 1: 1, 2: 1}


@pytest.mark.parametrize("refusing", [0, 2])
def test_a_refusal_on_one_rank_reaches_every_other_rank(store, refusing):
    message = "unknown key 'learning_rat' in run.yaml; did you mean 'learning_rate'?"
    got = attempt(store, 3, [1, 2, 0], refusal={refusing: message})
    assert got[refusing].number == 1  # the refusing rank hands it over and stops with its own message
    for r in {0, 1, 2} - {refusing}:
        assert isinstance(got[r], RefusedElsewhere)
        assert str(got[r]) == (f"the config was refused on another process of the run, rank {refusing} "
                               f"(node 0, local rank 0): {message}")


def test_a_missing_rank_0_ends_the_wait_with_a_clear_error(store):
    with pytest.raises(TimeoutError, match=r"rank 1: global rank 0 did not take part in forming the process group "
                                           r"within 0.5 s"):
        join_attempt(store, 1, 2, timeout=0.5)


def test_the_hook_is_installed_in_torchs_registry_under_torchrun(monkeypatch):
    """The env:// handler that init_process_group really looks up is replaced (a lookup through
    ``torch.distributed.rendezvous`` finds the function of that name, not the module, and changed nothing)."""
    module = importlib.import_module("torch.distributed.rendezvous")
    original = module._rendezvous_handlers["env"]
    monkeypatch.setitem(module._rendezvous_handlers, "env", original)  # restored after the test
    assert not rendezvous.install_handshake()  # not under torchrun: nothing changes
    assert module._rendezvous_handlers["env"] is original
    for name, value in {"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    assert rendezvous.install_handshake()
    assert module._rendezvous_handlers["env"] is not original
    assert module._rendezvous_handlers["env"].trl_padfree_attempts
