"""The command lines launch tests share (``demo_argv``, ``train_argv``, ``ddp_train_argv``, ``dpo_argv``) and the
small data they read, all on the shipped demo model; running them is in tests/launch_runs.py."""

from __future__ import annotations

from pathlib import Path

import yaml
from launch_runs import write_short_demo_records
from paths import CONFIGS, DEMO, DEMO_MODEL

DEMO_YAML = CONFIGS / "demo.yaml"


def write_demo_data(out: Path) -> Path:
    """A few demo records as local JSONL in ``out`` (train.jsonl: 24, eval.jsonl: 8); returns ``out``."""
    for name, n in (("train", 24), ("eval", 8)):
        lines = (DEMO / "data" / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()[:n]
        (out / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def demo_argv(data_dir: Path, output_dir: Path, *extra: str, config: Path = DEMO_YAML) -> list[str]:
    """The demo config (or ``config``) on tiny local data, with absolute paths (independent of the current
    directory)."""
    return ["--config", str(config), "--model_name_or_path", str(DEMO_MODEL), "--train_file",
            str(data_dir / "train.jsonl"), "--eval_file", str(data_dir / "eval.jsonl"), "--output_dir",
            str(output_dir), "--max_steps", "2", *extra]


def write_yaml(path: Path, **changes: object) -> Path:
    config = yaml.safe_load(DEMO_YAML.read_text(encoding="utf-8"))
    config.update(changes)
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------- test_launch_train's runs

TRAIN_STEPS = 6
TRAIN_MAX_LENGTH = 96


def train_argv(data_dir: Path, output_dir: Path, *extra: str) -> list[str]:
    return demo_argv(data_dir, output_dir, "--max_steps", str(TRAIN_STEPS), "--max_length", str(TRAIN_MAX_LENGTH),
                     "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "8", "--learning_rate",
                     "2e-3", "--warmup_steps", "0", "--logging_steps", "1", "--eval_steps", "3", "--eval_on_start",
                     "false", *extra)


# ------------------------------------------------------------------------------------------- runs on several ranks

DDP_RECORDS, DDP_BATCH, DDP_STEPS = 32, 4, 2  # training records, per-device batch, steps


def write_ddp_data(out: Path) -> Path:
    """``DDP_RECORDS`` short demo records (train.jsonl) and the demo config without its eval data (config.yaml) in
    ``out``; returns ``out``."""
    write_short_demo_records(out / "train.jsonl", "train.jsonl", DDP_RECORDS, shorter_than=220)
    config = [line for line in DEMO_YAML.read_text(encoding="utf-8").splitlines()
              if not line.startswith(("eval_file:", "eval_strategy:", "eval_steps:", "eval_on_start:"))]
    (out / "config.yaml").write_text("\n".join(config) + "\n", encoding="utf-8")
    return out


def ddp_train_argv(data_dir: Path, out: Path, *extra: str) -> list[str]:
    """``write_ddp_data``'s config and records, one CPU thread per process."""
    return ["--config", str(data_dir / "config.yaml"), "--model_name_or_path", str(DEMO_MODEL), "--train_file",
            str(data_dir / "train.jsonl"), "--output_dir", str(out), "--max_steps", str(DDP_STEPS), "--max_length",
            "96", "--per_device_train_batch_size", str(DDP_BATCH), "--logging_steps", "1", "--warmup_steps", "0",
            "--torch_num_threads", "1", *extra]


# ------------------------------------------------------------------------------------------- DPO

DPO_STEPS = 6


def write_preference_data(out: Path) -> Path:
    """Tiny preference data in ``out`` (48 short training pairs, 16 eval pairs of the demo's); returns ``out``."""
    write_short_demo_records(out / "train.jsonl", "pref_train.jsonl", 48, shorter_than=400)
    write_short_demo_records(out / "eval.jsonl", "pref_eval.jsonl", 16, shorter_than=400)
    return out


def dpo_argv(data_dir: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--config", str(CONFIGS / "demo-dpo.yaml"), "--model_name_or_path", str(DEMO_MODEL),
        "--train_file", str(data_dir / "train.jsonl"), "--eval_file", str(data_dir / "eval.jsonl"),
        "--output_dir", str(out), "--max_steps", str(DPO_STEPS), "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "8", "--warmup_steps", "0", "--logging_steps", "1", "--eval_steps", "3",
        "--eval_on_start", "false", *extra,
    ]  # fmt: skip
