"""How the processes of one torchrun attempt meet: keys of their own in a store that outlives attempts, a config
refused on one process reaching all of them, and one answer on every rank to "is this a restart?".

**Stale addresses.** By default (torch >= 2.5) torchrun hands its workers the agent's own TCPStore
(``TORCHELASTIC_USE_AGENT_STORE=True``). That store lives as long as torchrun, so after a restart
(``--max_restarts N``) it still holds the dead attempt's process-group keys, among them every rank's gloo (or NCCL)
address. A new rank that reads a peer's key before that peer has written it again connects to a process that no
longer exists: ``Gloo connectFullMesh failed ... Connection refused`` (measured: the restarted group of a 2-rank
``--max_restarts 1`` run failed so in 5 of 6 tries of a bare script, and in 1 of 4 and 5 of 8 tries of a training
run). torch prefixes nothing per attempt, and ``TORCHELASTIC_RESTART_COUNT`` cannot serve as a prefix: each node's
agent counts its own restarts, and a node restarted because another node failed may keep its count (torch issue
135712). :func:`join_attempt` therefore numbers the attempts in the store itself: global rank 0 takes the next
number (an atomic ``add``) and publishes it; every other rank answers under that number and waits for rank 0 to
echo its own random token back, so a number left over from an earlier attempt (whose echo, if any, carries another
token) is recognised and read again. The process group then keys everything under that number.

**A config refused on one process.** A process whose config is refused before it joins the process group (a typo,
a YAML error: parsing the config is what creates the group) would leave the others waiting in
``init_process_group`` for as long as its timeout (30 minutes by default; measured: a typo on one of two torchrun
nodes left the other waiting until it was killed). :func:`refuse_in_rendezvous` takes part in the same handshake
with the refusal as its answer, rank 0 tells every rank, and all of them stop with that line (exit 2).

**Leaving together.** The rendezvous store of a multi-node run lives in one node's torchrun agent. When that
agent's worker exits first, the agent exits and takes the store with it, and an agent on another node whose worker
is still shutting down looks at the store once more and dies of ``RendezvousConnectionError: ... Broken pipe``
instead of reporting its worker's exit code (seen once in CI: a refusing node ended with exit 1 and a torch
traceback under the refusal line). So when a run stops on a refusal, every rank first marks that it is leaving
and waits for the others' marks (:func:`leave_together`), and a rank whose agent hosts the store then lingers
:data:`HOST_LINGER` seconds, so that the other agents see their workers' exit first.

**Is this a restart?** :func:`restart_attempt` is the largest ``TORCHELASTIC_RESTART_COUNT`` of all ranks, so that
every node of a restarted run resumes (``resume_from_checkpoint`` unset or ``auto``), not only the node whose worker
failed.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .._torch_private import rendezvous_handlers
from .config import ConfigError, RefusedElsewhere
from .console import where

__all__ = [
    "Attempt", "agent_hosts_store", "agree_on_config", "gather_reports", "install_handshake", "join_attempt",
    "leave_together", "refuse_in_rendezvous", "restart_attempt",
]

KEY = "trl_padfree/attempts/"  # the handshake's keys in the launcher's store
POLL, MAX_POLL = 0.01, 0.5  # seconds between a waiting rank's looks at the store: the first, the longest
_RESTART: list[int] = []  # restart_attempt's answer, once agreed with the other ranks
_REFUSAL: list[str] = []  # this process's refusal, handed to the handshake by refuse_in_rendezvous
DEFAULT_TIMEOUT = timedelta(minutes=30)  # torch's default process-group timeout; also how long a refusal is offered
HOST_LINGER = 3.0  # seconds a refusing run's rank on the store's node waits before exiting (leave_together)
LEAVE_WAIT = 30.0  # the longest a rank waits for the others to mark that they are leaving


def local_restart_count() -> int:
    """This node's ``TORCHELASTIC_RESTART_COUNT`` (0 outside torchrun or on the first attempt)."""
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return 0


def restart_attempt() -> int:
    """How many times torchrun has restarted this run's workers: the largest ``TORCHELASTIC_RESTART_COUNT`` of all
    ranks, as agreed when the process group formed (:func:`join_attempt`), else this node's count."""
    return _RESTART[-1] if _RESTART else local_restart_count()


@dataclass(frozen=True)
class Attempt:
    """What every rank of one attempt agreed on when its process group formed."""

    number: int  # 1 for the first group formed through the store, 2 after a restart, ...
    restarts: int  # the largest TORCHELASTIC_RESTART_COUNT of all ranks


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _verdict(refusals: list[Any]) -> RefusedElsewhere:
    """``refusals``: ``(rank, where, message)`` of every refusing process."""
    shown = "; ".join(f"rank {rank} ({place}): {message}" for rank, place, message in refusals)
    return RefusedElsewhere(f"the config was refused on another process of the run, {shown}")



def agent_hosts_store() -> bool:
    """Whether this process's torchrun agent (its parent, or the parent's parent when a wrapper sits between)
    listens on a TCP port: under torchrun that is the agent holding the rendezvous store. False outside torchrun
    and where it cannot be told.

    >>> agent_hosts_store()  # not under torchrun
    False
    """
    if not _under_torchrun():
        return False
    import psutil

    try:
        process = psutil.Process(os.getppid())
        for _ in range(2):
            connections = getattr(process, "net_connections", None) or process.connections  # psutil < 6
            if any(c.status == psutil.CONN_LISTEN for c in connections(kind="tcp")):
                return True
            process = process.parent()
            if process is None:
                return False
    except psutil.Error:
        return False
    return False


def leave_together(store: Any, number: int, rank: int, world_size: int) -> None:
    """Mark in ``store`` that ``rank`` leaves attempt ``number`` (stopped by a refusal) and wait, at most
    :data:`LEAVE_WAIT` s, for every rank's mark; then linger :data:`HOST_LINGER` s where this node's agent holds the
    store (see the module docstring).

    >>> from torch.distributed import HashStore
    >>> store = HashStore()
    >>> store.set(KEY + "7/left/1", "1")
    >>> leave_together(store, 7, 0, 2)  # rank 1 has left already: returns at once
    >>> store.check([KEY + "7/left/0"])
    True
    """
    store.set(f"{KEY}{number}/left/{rank}", "1")
    with contextlib.suppress(Exception):  # a rank that died meanwhile: leave anyway
        store.wait([f"{KEY}{number}/left/{peer}" for peer in range(world_size)], timedelta(seconds=LEAVE_WAIT))
    if agent_hosts_store():
        time.sleep(HOST_LINGER)


def join_attempt(store: Any, rank: int, world_size: int, timeout: float, refusal: str | None = None,
                 restarts: int = 0) -> Attempt:
    """This attempt of the run, the same on every rank: its number (1 for the first process group formed through
    ``store``, 2 after a restart, ...) and the largest of the ranks' ``restarts`` (see the module docstring).

    Global rank 0 takes the number and answers every other rank; the others wait for that answer. ``refusal``: this
    rank's config was refused (the message); every rank but the refusing ones then raises
    :class:`~trl_padfree.launch.config.RefusedElsewhere` naming them. Raises ``TimeoutError`` after ``timeout``
    seconds without every answer (a process that never started).

    >>> import threading
    >>> from torch.distributed import HashStore
    >>> store, got = HashStore(), {}
    >>> def rank(r, refusal=None):
    ...     try:
    ...         got[r] = join_attempt(store, r, 2, timeout=30, refusal=refusal).number
    ...     except ValueError as exc:
    ...         got[r] = str(exc)
    >>> def attempt(*refusals):  # rank 1 first, as after a restart where it reads the last attempt's number
    ...     ranks = [threading.Thread(target=rank, args=(r, refusals[r])) for r in (1, 0)]
    ...     _ = [t.start() for t in ranks], [t.join() for t in ranks]
    ...     print(got[0], "|", got[1])
    >>> attempt(None, None)  # a run, then its restart through the same store
    1 | 1
    >>> attempt(None, None)
    2 | 2
    >>> attempt(None, "learning_rat: unknown key")
    the config was refused on another process of the run, rank 1 (node 0, local rank 0): learning_rat: unknown key | 3
    """
    deadline = time.monotonic() + timeout
    current = KEY + "current"
    if rank == 0:
        number = int(store.add(KEY + "count", 1))
        store.set(current, str(number))
        joined: dict[int, dict[str, Any]] = {}
        for peer in range(1, world_size):
            key = f"{KEY}{number}/joined/{peer}"
            store.wait([key], timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
            joined[peer] = json.loads(_text(store.get(key)))
        refusals = [(0, where(), refusal)] if refusal else []
        refusals += [(peer, view["where"], view["refusal"]) for peer, view in joined.items() if view["refusal"]]
        restarts = max([restarts, *(view["restarts"] for view in joined.values())])
        for peer, view in joined.items():
            store.set(f"{KEY}{number}/answer/{peer}",
                      json.dumps({"token": view["token"], "refusals": refusals, "restarts": restarts}))
        if refusals:
            leave_together(store, number, 0, world_size)
            if not refusal:
                raise _verdict(refusals)
        return Attempt(number, restarts)
    token = uuid.uuid4().hex
    mine = json.dumps({"token": token, "refusal": refusal, "restarts": restarts, "where": where()})
    pause = POLL
    while time.monotonic() < deadline:
        time.sleep(pause)  # looks at the store slow down to one every MAX_POLL s: thousands of ranks share it
        pause = min(pause * 1.5, MAX_POLL)
        if not store.check([current]):
            continue
        number = int(_text(store.get(current)))
        store.set(f"{KEY}{number}/joined/{rank}", mine)
        answer = f"{KEY}{number}/answer/{rank}"
        while time.monotonic() < deadline:
            if store.check([answer]):
                view = json.loads(_text(store.get(answer)))
                if view["token"] != token:
                    break  # the answer of an earlier attempt: rank 0 of this one has not published its number yet
                if view["refusals"]:
                    leave_together(store, number, rank, world_size)
                    if not refusal:
                        raise _verdict(view["refusals"])
                return Attempt(number, view["restarts"])
            if int(_text(store.get(current))) != number:
                break  # rank 0 of this attempt published a newer number
            time.sleep(pause)
            pause = min(pause * 1.5, MAX_POLL)
    raise TimeoutError(
        f"rank {rank}: global rank 0 did not take part in forming the process group within {timeout:g} s "
        "(it never started, or failed before; see its output)"
    )


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ and "MASTER_PORT" in os.environ


def install_handshake() -> bool:
    """Under torchrun (also behind ``accelerate launch``), make every process take part in :func:`join_attempt`
    when the process group forms, key the group by the attempt's number and keep the agreed restart count (see the
    module docstring). Call before
    the process group is created; returns whether it applies (False outside torchrun or where torch no longer has
    the hook).

    It wraps torch's ``env://`` rendezvous (the private ``torch.distributed.rendezvous._rendezvous_handlers``
    registry; ``torch.distributed.rendezvous`` as an attribute is the function, hence the import by name in :mod:`trl_padfree._torch_private`).
    """
    if not _under_torchrun():
        return False
    import torch.distributed as dist

    handlers = rendezvous_handlers()  # torch's private registry (trl_padfree._torch_private)
    original = handlers.get("env") if isinstance(handlers, dict) else None
    if original is None:
        return False
    if getattr(original, "trl_padfree_attempts", False):
        return True

    def env_per_attempt(url: str, **kwargs: Any) -> Any:
        timeout = kwargs.get("timeout") or DEFAULT_TIMEOUT
        for store, rank, world_size in original(url, **kwargs):
            refusal = _REFUSAL[-1] if _REFUSAL else None
            attempt = join_attempt(store, rank, world_size, timeout.total_seconds(), refusal, local_restart_count())
            _RESTART.append(attempt.restarts)
            yield dist.PrefixStore(f"{KEY}{attempt.number}/group/", store), rank, world_size

    env_per_attempt.trl_padfree_attempts = True  # type: ignore[attr-defined]
    handlers["env"] = env_per_attempt
    return True


def refuse_in_rendezvous(error: ConfigError) -> None:
    """This process refused its config before joining the process group: tell the others through the launcher's
    store (the handshake of :func:`join_attempt`), so that they stop too instead of waiting for it. A no-op outside
    torchrun or once the process group exists (then the caller agrees with a collective)."""
    import torch.distributed as dist

    if isinstance(error, RefusedElsewhere) or dist.is_initialized() or not install_handshake():
        return
    from torch.distributed import rendezvous

    _REFUSAL.append(str(error))
    try:
        next(rendezvous("env://", timeout=DEFAULT_TIMEOUT))  # the handshake alone, no process group
    except Exception:  # noqa: BLE001  (the refusal is printed by the caller whatever becomes of this)
        pass


def agree_on_config(error: ConfigError | None) -> None:
    """Call on every process once it has parsed and checked its config (``error``: why it was refused, or None).

    With a process group of several processes every rank learns whether any refused (an all-gather): the others
    raise :class:`~trl_padfree.launch.config.RefusedElsewhere` naming the refusing ranks and their reasons, so that
    all exit 2 with that line instead of failing later on a lost peer. A process refused before the group formed
    hands its refusal to the handshake instead (:func:`refuse_in_rendezvous`).
    """
    import torch.distributed as dist

    if isinstance(error, RefusedElsewhere):
        return
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        if error is not None:
            refuse_in_rendezvous(error)
        return
    refusals = gather_reports(None if error is None else str(error))
    if refusals and agent_hosts_store():
        time.sleep(HOST_LINGER)  # the other nodes' agents see their workers' exit first (module docstring)
    if refusals and error is None:
        raise _verdict(refusals)


def gather_reports(report: Any) -> list[tuple[int, str, Any]]:
    """``(rank, where, report)`` of every process whose ``report`` is not None, in rank order: an all-gather over
    the process group, so every process must call it (and all then take the same path)."""
    import torch.distributed as dist

    views: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(views, None if report is None else (where(), report))
    return [(rank, *view) for rank, view in enumerate(views) if view is not None]
