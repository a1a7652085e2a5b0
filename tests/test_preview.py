"""``trl-padfree preview``: the demo config's first examples exactly as the trainer sees them, and bad input."""

from __future__ import annotations

import pytest
from paths import ROOT

from trl_padfree import cli

EXPECTED = """\
--- example 0 (71 tokens, 29 trained) ---
### Question: Write the words in capital letters: blue green pink pear bird red red red pear hat box cat green dog \
pink red hat bird green box green green blue cow green pig hat pear
### Answer:[[ BLUE GREEN PINK PEAR BIRD RED RED RED PEAR HAT BOX CAT GREEN DOG PINK RED HAT BIRD GREEN BOX GREEN \
GREEN BLUE COW GREEN PIG HAT PEAR<|eos|>]]
--- example 1 (67 tokens, 54 trained) ---
### Question: Count from 4 to 56.
### Answer:[[ 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 \
40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56<|eos|>]]
---
trained tokens: 291 of 549 (53.0%) in 8 training examples (format: template)
examples without a trained token (dropped before training): 0 of 8
examples without the response template among the first 8: 0
"""


def test_preview_of_the_demo_config_is_exact_and_in_the_docs(in_root, capsys, tmp_path):
    assert cli.main(["preview", "--config", "configs/demo.yaml", "-n", "2", "--max_train_examples", "8",
                     "--output_dir", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out == EXPECTED
    assert not (tmp_path / "out").exists()  # nothing written
    text = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")  # docs/usage.md shows this command and output
    assert "$ trl-padfree preview --config configs/demo.yaml -n 2 --max_train_examples 8\n" + EXPECTED + "```" in text


def test_preview_counts_examples_without_the_template(in_root, capsys, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "### Question: a\\n### Answer: b"}\n{"text": "no template here"}\n', encoding="utf-8")
    assert cli.main(["preview", "--config", "configs/demo.yaml", "--train_file", str(data), "--template", "",
                     "--eval_file", "", "--eval_strategy", "no", "--eval_on_start", "false", "-n", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:3] == ["### Question: a", "### Answer:[[ b<|eos|>]]"]
    assert out[-2:] == ["examples without a trained token (dropped before training): 1 of 2",
                        "examples without the response template among the first 2: 1"]


@pytest.mark.parametrize(("extra", "message"), [
    (["--response_templat", "x"], "unknown option '--response_templat' on the command line; did you mean "
     "'response_template'?"),
    (["-n", "0"], "-n must be at least 1, got 0"),
    (["--response_template", "### Reply:"], "response_template '### Reply:' was found in none of the first 8"),
])
def test_preview_bad_input_exits_2_with_one_line(in_root, capsys, tmp_path, extra, message):
    assert cli.main(["preview", "--config", "configs/demo.yaml", "--max_train_examples", "8", "--output_dir",
                     str(tmp_path / "out"), *extra]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("trl-padfree preview: error: " + message)
    assert captured.err.count("\n") == 1 and captured.out == ""
    assert not (tmp_path / "out").exists()


def test_preview_of_chat_data_without_templates(in_root, capsys, tmp_path):
    """messages data without templates: every assistant turn trained; no template count where there is none."""
    config = tmp_path / "chat.yaml"
    config.write_text("model_name_or_path: trl_padfree/demo/model\ntrain_file: trl_padfree/demo/data/chat_train.jsonl\n"
                      f"output_dir: {tmp_path / 'out'}\nmax_train_examples: 4\n", encoding="utf-8")
    assert cli.main(["preview", "--config", str(config), "-n", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("### Answer:[[ ") == out.split("---\n")[1].count("### Answer:") > 1  # every turn trained
    assert out.endswith("examples without a trained token (dropped before training): 0 of 4\n")


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("trainer", ["DPOTrainer", "KTOTrainer", "RewardTrainer"])
def test_preview_prepares_preference_records_as_the_built_trl_trainer(trainer, chat, demo_tokenizer, tmp_path):
    """preview builds no trainer: the records it shows (tokenized, those over max_length dropped) are those of the
    built trainer's train_dataset."""
    import trl
    from datasets import Dataset
    from launch_runs import demo_records
    from paths import DEMO_MODEL
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from trl_padfree.launch.tasks.preference_data import prepared_by_trl

    rows = demo_records("pref_train.jsonl", 8)
    if chat:
        rows = [{key: [{"role": "user" if key == "prompt" else "assistant", "content": text.strip()}]
                 for key, text in row.items()} for row in rows]
    args = getattr(trl, trainer.replace("Trainer", "Config"))(output_dir=str(tmp_path), report_to=[], bf16=False,
                                                                         max_length=40)
    auto = AutoModelForSequenceClassification if trainer == "RewardTrainer" else AutoModelForCausalLM
    model = auto.from_pretrained(DEMO_MODEL, **({"num_labels": 1} if trainer == "RewardTrainer" else {}))
    built = getattr(trl, trainer)(model=model, args=args, train_dataset=Dataset.from_list(rows),
                                  processing_class=demo_tokenizer).train_dataset
    ours = prepared_by_trl(getattr(trl, trainer), Dataset.from_list(rows), demo_tokenizer, args)
    columns = [c for c in ("prompt_ids", "chosen_ids", "rejected_ids", "completion_ids", "label") if c in built.column_names]
    assert 0 < len(built) < len(rows) * (2 if trainer == "KTOTrainer" else 1)  # some dropped
    assert ours.select_columns(columns).to_list() == built.select_columns(columns).to_list()
