"""Every use of torch's private APIs, one small accessor each, so that a torch upgrade breaks here (and in
``tests/test_torch_private.py``, one test per accessor) instead of somewhere inside a run.

- :func:`rendezvous_handlers`: ``torch.distributed.rendezvous._rendezvous_handlers``, the registry of
  ``init_method`` schemes that ``init_process_group`` consults; the launch wraps its ``"env"`` entry (a callable
  ``(url, **kwargs)`` yielding ``(store, rank, world_size)``) to number torchrun's attempts
  (``launch/rendezvous.py``, ``install_handshake``).
- :func:`pg_timeout_setter`: ``torch.distributed.distributed_c10d._set_pg_timeout(timeout, group=None)``, which
  sets the default process group's timeout after it was created; the launch applies ``ddp_timeout`` to gloo
  groups with it (transformers passes it on GPUs only; ``launch/distributed.py``).
- :func:`registered_groups`: ``torch.distributed.distributed_c10d._world.pg_map``, every process group that exists
  (the default one included); the launch keeps a reference to each at exit so that their C++ destructors never
  run (``launch/distributed.py``, ``end_process_group``).

Each returns None (or the fallback it names) where torch no longer has the API, and its caller skips what it needs
it for; the tests fail instead. Outside torch, the ones the trainers rely on in TRL and transformers are listed in
:mod:`trl_padfree._trl_private`.

>>> callable(rendezvous_handlers()["env"]), callable(pg_timeout_setter())
(True, True)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["pg_timeout_setter", "registered_groups", "rendezvous_handlers"]


def rendezvous_handlers() -> dict[str, Callable[..., Any]] | None:
    """torch's registry ``scheme -> rendezvous handler`` (a mutable dict; ``"env"`` serves ``env://``), or None.

    ``torch.distributed.rendezvous`` as an attribute is the function, hence the import of the module by name.
    """
    module = importlib.import_module("torch.distributed.rendezvous")
    handlers = getattr(module, "_rendezvous_handlers", None)
    return handlers if isinstance(handlers, dict) else None


def pg_timeout_setter() -> Callable[..., None] | None:
    """``_set_pg_timeout(timeout: timedelta, group=None)``: set an existing process group's timeout (torch >= 2.3),
    or None."""
    import torch.distributed as dist

    return getattr(dist.distributed_c10d, "_set_pg_timeout", None)


def registered_groups() -> list[Any]:
    """Every process group torch holds (its private registry), or ``[dist.group.WORLD]`` where the registry is not
    found."""
    import torch.distributed as dist

    world = getattr(dist.distributed_c10d, "_world", None)
    return list(getattr(world, "pg_map", None) or [dist.group.WORLD])
