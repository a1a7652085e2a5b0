"""Running a task's variants, for every task alike (:func:`run_variants`): in this process, or each in a fresh worker
process (its peak memory its own), one after the other (``sequential``) or trained in lockstep (``interleaved``:
step i of every variant, in a rotating order, then step i+1, so that the drift of a shared machine's load hits
every variant alike); the worker's side (``python -m benchmarks --worker SPEC OUT``); the machine a run is on.

A task module gives ``config_from_dict`` and ``make_run(config, dataset, variant, isolated=...)``: an object with
``total_steps``, ``step()`` and ``finish()`` (its measurements, a JSON-serialisable dict); or, run only whole,
``run_variant(config, dataset, variant, isolated=...)``. A lockstep worker's protocol messages are JSON lines on its
stdout after :data:`PROTOCOL`; everything else it prints goes to stderr.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

PROTOCOL = "@@trl-padfree-bench "


def project_root() -> str:
    return str(Path(__file__).resolve().parents[1])


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on every platform
        return None


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def machine_info(device: str, threads: int = 0) -> dict[str, Any]:
    """CPU/GPU name, core count, torch threads (``threads`` if set, else torch's default) and library versions."""
    import torch
    import transformers

    from trl_padfree import __version__

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next((ln.split(":", 1)[1].strip() for ln in handle if ln.startswith("model name")), cpu)
    except OSError:
        pass
    info: dict[str, Any] = {
        "cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": threads or torch.get_num_threads(),
        "platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "trl": _version("trl"), "trl_padfree": __version__, "gpu": None,
        "load_average_start": load_average(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
        info["cuda"] = torch.version.cuda
    try:
        git = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=project_root(), capture_output=True,
                             text=True, timeout=10)
        info["git"] = git.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        info["git"] = None
    try:
        import flash_attn

        info["flash_attn"] = flash_attn.__version__
    except Exception:
        info["flash_attn"] = None
    return info


def tail(text: str, lines: int = 25) -> str:
    """The last ``lines`` lines of ``text``."""
    return "\n".join(text.strip().splitlines()[-lines:])


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a worker: this one, with the project root importable, and ``extra``."""
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (project_root(), env.get("PYTHONPATH")) if p)
    return env


def run_variant(task: ModuleType, config: Any, dataset: str | None, variant: str, *,
                isolated: bool = False) -> dict[str, Any]:
    """Train one variant, all steps, and return its measurements."""
    if hasattr(task, "run_variant"):
        return task.run_variant(config, dataset, variant, isolated=isolated)
    run = task.make_run(config, dataset, variant, isolated=isolated)
    while run.steps_left:
        run.step()
    return run.finish()


def serve(run: Any, output_path: str | Path) -> int:
    """The worker's side: ``ready`` with the step count, one ``step`` per command, ``finish`` writes the result."""
    channel, sys.stdout = sys.stdout, sys.stderr  # only protocol messages go to the parent's pipe

    def send(message: dict[str, Any]) -> None:
        channel.write(PROTOCOL + json.dumps(message) + "\n")
        channel.flush()

    send({"ready": True, "steps": run.total_steps})
    for line in sys.stdin:
        command = line.strip()
        if command == "step":
            send(run.step())
        elif command == "finish":
            Path(output_path).write_text(json.dumps(run.finish()))
            send({"done": True})
            return 0
        else:
            raise ValueError(f"unknown worker command {command!r} (expected 'step' or 'finish')")
    return 1  # the parent went away


def worker_main(spec_path: str, output_path: str) -> int:
    """The worker: one variant in this (fresh) process; ``interactive``: one step per ``step`` line on stdin."""
    spec = json.loads(Path(spec_path).read_text())
    task = importlib.import_module(spec["task"])
    config = task.config_from_dict(spec["config"])
    if spec["interactive"]:
        return serve(task.make_run(config, spec["dataset"], spec["variant"], isolated=True), output_path)
    Path(output_path).write_text(json.dumps(run_variant(task, config, spec["dataset"], spec["variant"],
                                                        isolated=True)))
    return 0


class LockstepWorker:
    """A fresh worker process (``command``) driven step by step over its stdin/stdout, as a run of this process."""

    def __init__(self, name: str, command: list[str], stderr_path: Path, out_path: Path,
                 env: dict[str, str]) -> None:
        self.name, self.out_path = name, out_path
        self.stderr = open(stderr_path, "w+")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True)
        self._steps: int | None = None

    def request(self, command: str | None) -> dict[str, Any]:
        """Send ``command`` (None: only wait) and return the worker's next protocol message."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            if command is not None:
                self.proc.stdin.write(command + "\n")
                self.proc.stdin.flush()
            for line in self.proc.stdout:
                if line.startswith(PROTOCOL):
                    return json.loads(line[len(PROTOCOL) :])
        except BrokenPipeError:
            pass
        code = self.proc.wait()
        self.stderr.seek(0)
        raise RuntimeError(f"the {self.name} worker failed (exit {code}):\n{tail(self.stderr.read())}")

    @property
    def total_steps(self) -> int:
        """Waits until the worker has built its run (data, model, optimizer): the steps it will train."""
        if self._steps is None:
            self._steps = int(self.request(None)["steps"])
        return self._steps

    def step(self) -> dict[str, Any]:
        return self.request("step")

    def finish(self) -> dict[str, Any]:
        self.request("finish")
        self.proc.wait()
        return json.loads(self.out_path.read_text())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


def run_in_lockstep(runs: list[Any], rotate: bool = True) -> list[dict[str, Any]]:
    """Train every run (a :class:`LockstepWorker` or a run of this process), step i of each (in a rotating order
    with ``rotate``) before step i+1; their results, in order.

    A run with fewer steps (token-budget batching can change the count) stops early; one with more runs on alone.
    Every worker is closed on the way out.
    """
    try:
        order = [(run, run.total_steps) for run in runs]
        for step in range(max(n for _, n in order)):
            shift = step % len(order) if rotate else 0
            for run, n in order[shift:] + order[:shift]:
                if step < n:
                    run.step()
        return [run.finish() for run in runs]
    finally:
        for run in runs:
            if isinstance(run, LockstepWorker):
                run.close()


def run_variants(task: ModuleType, config: Any, variants: list[str], schedule: str, dataset: str | None = None,
                 env: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Every variant of ``task`` on ``dataset``: ``schedule`` ``"in-process"`` (one after the other, here),
    ``"interleaved"`` (workers in lockstep) or ``"sequential"`` (one worker after the other, ``env`` added)."""
    if schedule == "in-process":
        return {name: run_variant(task, config, dataset, name) for name in variants}
    values = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else vars(config)
    env = worker_env(env)
    with tempfile.TemporaryDirectory(prefix="trl-padfree-bench-") as tmp:
        paths = {}
        for name in variants:
            spec, out = Path(tmp, f"{name}.spec.json"), Path(tmp, f"{name}.result.json")
            spec.write_text(json.dumps({"task": task.__name__, "config": values, "dataset": dataset, "variant": name,
                                        "interactive": schedule == "interleaved"}, default=str))
            paths[name] = ([sys.executable, "-m", "benchmarks", "--worker", str(spec), str(out)], out)
        label = {name: f"{dataset}/{name}" if dataset else name for name in variants}
        if schedule == "interleaved":
            workers = [LockstepWorker(label[name], command, Path(tmp, f"{name}.stderr"), out, env)
                       for name, (command, out) in paths.items()]
            return dict(zip(variants, run_in_lockstep(workers), strict=True))
        results = {}
        for name, (command, out) in paths.items():
            proc = subprocess.run(command, env=env, capture_output=True, text=True)
            if proc.returncode != 0 or not out.exists():
                raise RuntimeError(f"the {label[name]} worker failed (exit {proc.returncode}):\n"
                                   f"{tail(proc.stderr or proc.stdout)}")
            results[name] = json.loads(out.read_text())
        return results
