"""``trl_padfree.SFTTrainer`` trains with the thread count the launch picks, unless the user chose one (torch's
default 2 threads on a busy 2-core machine trained the demo 10-17x slower than 1)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from paths import DEMO_MODEL
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import SFTConfig

from trl_padfree import DataCollatorForCompletionOnlyLM, SFTTrainer
from trl_padfree.testing import tiny_llama
from trl_padfree.threads import torch_default_threads


class Threads(TrainerCallback):
    """Records torch's thread count at every training step."""

    def on_step_begin(self, args, state, control, **kwargs):
        self.seen.append(torch.get_num_threads())


@pytest.fixture
def default_threads(monkeypatch):
    """No thread count chosen: no OMP_NUM_THREADS / MKL_NUM_THREADS, torch at its default (restored after)."""
    default = torch_default_threads()
    if default < 2:
        pytest.skip("one physical core: torch's default is already 1 thread")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(default)
    yield default
    torch.set_num_threads(before)


def train(tmp_path: Path, model=None, **kwargs) -> list[int]:
    tok = AutoTokenizer.from_pretrained(DEMO_MODEL)
    if model is None:
        model = AutoModelForCausalLM.from_pretrained(DEMO_MODEL, attn_implementation="padfree")  # hidden size 128
    ds = Dataset.from_dict({"text": [f"### Question: q{i}\n### Answer: a{i}" for i in range(8)]})
    args = SFTConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=2, report_to=[],
                     save_strategy="no", use_cpu=True, bf16=False, activation_checkpointing=False,
                     dataloader_pin_memory=False)  # fmt: skip
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok, padding_free=True)
    threads = Threads()
    threads.seen = []
    trainer = SFTTrainer(model, args=args, train_dataset=ds, processing_class=tok, data_collator=collator,
                         callbacks=[threads], **kwargs)  # fmt: skip
    trainer.train()
    return threads.seen


def test_without_a_chosen_count_the_demo_model_trains_on_one_thread(default_threads, tmp_path, capsys):
    assert train(tmp_path) == [1, 1]
    assert torch.get_num_threads() == default_threads  # restored after train()
    lines = [line for line in capsys.readouterr().out.splitlines() if "torch threads" in line]
    assert lines == [
        f"[trl-padfree] torch threads: 1 instead of torch's {default_threads} (training on the CPU, hidden size "
        "128: one thread per 256); set OMP_NUM_THREADS or call torch.set_num_threads() to choose"
    ]


def test_a_count_the_user_chose_is_kept_and_torch_num_threads_sets_or_leaves_it(default_threads, tmp_path, capsys,
                                                                                monkeypatch):
    torch.set_num_threads(default_threads + 1)
    assert train(tmp_path) == [default_threads + 1] * 2
    torch.set_num_threads(default_threads)
    with monkeypatch.context() as env:
        env.setenv("OMP_NUM_THREADS", str(default_threads))
        assert train(tmp_path) == [default_threads] * 2
    assert train(tmp_path, torch_num_threads=None) == [default_threads] * 2
    assert train(tmp_path, torch_num_threads=3) == [3, 3]
    assert torch.get_num_threads() == default_threads
    assert "torch threads" not in capsys.readouterr().out
    with pytest.raises(ValueError, match="torch_num_threads must be 'auto', a positive integer or None, got 0"):
        train(tmp_path, torch_num_threads=0)


@pytest.mark.parametrize("idle", [8.0, 1.2])
def test_the_count_is_said_also_when_it_is_torchs_and_a_busy_machine_gets_fewer(default_threads, tmp_path, capsys,
                                                                                monkeypatch, idle):
    # hidden size 512: 2 threads (torch's own count on 2 cores, said too); a busy core (idle 1.2) bounds it to 1
    import trl_padfree.threads as threads_module

    if default_threads != 2:
        pytest.skip("the expected lines are those of a machine with 2 physical cores")
    monkeypatch.setattr(threads_module, "idle_cores", lambda interval=0.25: idle, raising=False)  # the machine's load, fixed
    model = tiny_llama(vocab_size=768, hidden_size=512, num_hidden_layers=1, attn_implementation="padfree")
    seen = train(tmp_path, model, check_packing=False)
    lines = [line for line in capsys.readouterr().out.splitlines() if "torch threads" in line]
    why = "training on the CPU, hidden size 512: one thread per 256"
    tail = "; set OMP_NUM_THREADS or call torch.set_num_threads() to choose"
    if idle > 2:
        assert seen == [2, 2]
        assert lines == [f"[trl-padfree] torch threads: 2, torch's own count ({why}){tail}"]
    else:
        assert seen == [1, 1]
        assert lines == [f"[trl-padfree] torch threads: 1 instead of torch's 2 ({why}, at most 2; 1.2 of "
                         f"{os.cpu_count()} cores idle now){tail}"]
