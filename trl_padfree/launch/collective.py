"""Decisions every process of a run takes together, so that none waits in a collective the others skipped:
whether a flag is set anywhere (:func:`any_process`), and which process failed first (:func:`first_failure`).
Outside a process group both are local.
"""

from __future__ import annotations

from ..exception_text import one_line

__all__ = ["any_process", "first_failure"]


def any_process(flag: bool) -> bool:
    """Whether ``flag`` is set on any process (an all-reduce when distributed), so that all take the same path."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flag
    device = torch.device("cpu") if dist.get_backend() == "gloo" else torch.device("cuda", torch.cuda.current_device())
    tensor = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())


def first_failure(error: BaseException | None, collective: bool = True) -> str | None:
    """``": <reason>"`` of the first process whose part failed (``" on rank R (node N, local rank L): <reason>"``
    under several processes), or None when none did. With ``collective`` every process must call it: the reasons
    are gathered (a barrier), so that all take the same path and name the same process."""
    import torch.distributed as dist

    reason = None if error is None else one_line(error, limit=200)
    if not (dist.is_available() and dist.is_initialized()):
        return None if reason is None else f": {reason}"
    from .console import where

    rank = dist.get_rank()
    if not collective:
        return None if reason is None else f" on rank {rank} ({where()}): {reason}"
    from .rendezvous import gather_reports

    failures = gather_reports(reason)
    if not failures:
        return None
    rank, place, reason = failures[0]
    return f" on rank {rank} ({place}): {reason}"
