"""``trl-padfree train|dpo|grpo|rloo|reward|kto --config configs/NAME.yaml [--field value ...]`` (also
``python scripts/train.py`` under any launcher). Exit codes: 0 done (or stopped by SIGTERM / Ctrl-C with a
checkpoint saved), 2 bad input (one line on stderr, nothing written), 1 failed."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from .config import ConfigError, LaunchArguments, LaunchConfig, parse_arguments

__all__ = ["ConfigError", "LaunchArguments", "LaunchConfig", "load_config", "main", "parse_arguments"]


def load_config(argv: Sequence[str], check_environment: bool = True, task: str = "sft") -> LaunchConfig:
    """Parse and validate ``argv`` as ``main`` does, loading nothing (``check_environment=False``: not the checks
    that depend on this machine)."""
    from .demo import builtin_config, resolve_package_paths
    from .validate import validate_config

    cfg = parse_arguments(builtin_config(argv), task=task)  # --config demo: the demo config shipped in the package
    cfg = resolve_package_paths(cfg)  # trl_padfree/demo/... paths of an installed package, from any directory
    return validate_config(cfg, check_environment=check_environment)


def main(argv: Sequence[str] | None = None, callbacks: Sequence[Any] = (), task: str = "sft") -> int:
    """Run the recipe ``task`` of :mod:`.tasks` on ``argv`` (parse and check, the machine's defaults, the run line,
    the recipe's ``run``, with extra Trainer ``callbacks``); returns the exit code."""
    from ..threads import torch_threads
    from .console import is_main_process, quiet_progress, quiet_replicas, say
    from .defaults import apply_defaults
    from .distributed import check_process_group, finish, plan_nodes
    from .steps import RunError
    from .tasks import get_task, prog
    from .validate import describe

    argv = list(sys.argv[1:] if argv is None else argv)
    quiet_replicas()  # under a distributed launcher only the first process of each node logs, from the very start
    try:
        cfg = load_config(argv, task=task)
        cfg, _ = apply_defaults(cfg)
        cfg, layout = plan_nodes(cfg)  # several processes: who writes what, one run id
        say("run: " + ", ".join(f"{k}={v}" for k, v in describe(cfg).items())
            + (f", processes={layout}" if layout else ""))
        check_process_group(cfg.training)  # before anything is written
        for note in cfg.notes:
            say(note)
        threads = cfg.training.torch_num_threads
        with torch_threads(None if threads == "auto" else threads), quiet_progress():
            get_task(task).run(cfg, callbacks)  # (the Trainer's own bar follows disable_tqdm)
    except (ConfigError, RunError) as exc:  # bad input (2), or a failure of the run, e.g. a final save on a full disk
        if is_main_process():
            print(f"{prog(task)}: error: {exc}", file=sys.stderr, flush=True)
        return finish(2 if isinstance(exc, ConfigError) else 1)
    except SystemExit as exc:  # --help
        return finish(exc.code if isinstance(exc.code, int) else 0)
    except BaseException as exc:  # noqa: BLE001  (re-raised where there is no process group)
        return finish(1, exc)
    return finish(0)  # every rank of a multi-process run leaves the process group, see launch.distributed
