"""``trl-padfree dpo`` on bad preference data, templates and settings: exit 2, one line naming the cause and fix,
nothing written; the Python API's ``DPOTrainer`` raises naming the fix (issue 25, item 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launch_runs import assert_refused_in_one_line, run_launch, write_jsonl
from paths import DEMO, DEMO_MODEL, ROOT

SFT_LINE = "(a field of trl-padfree train, not of trl-padfree dpo)"


@pytest.fixture(scope="module")
def pairs() -> list[dict]:
    lines = (DEMO / "data" / "pref_train.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if len(line) < 300][:16]


def chat(pair: dict, system: bool = False) -> dict:
    turns = [{"role": "system", "content": "Answer briefly."}] if system else []
    return {"prompt": [*turns, {"role": "user", "content": pair["prompt"]}],
            "chosen": [{"role": "assistant", "content": pair["chosen"]}],
            "rejected": [{"role": "assistant", "content": pair["rejected"]}]}


def dpo_argv(tmp_path: Path, records: list[dict], *extra: str, evals: list[dict] = (),
             config: str = str(ROOT / "configs" / "demo-dpo.yaml")) -> list[str]:
    """The demo DPO config for 2 steps on ``records`` (and ``evals``, loaded and checked, not evaluated)."""
    files = [str(write_jsonl(tmp_path / f"{name}.jsonl", rows)) if rows else "" for name, rows in
             (("t", records), ("e", evals))]
    return ["--config", config, "--model_name_or_path", str(DEMO_MODEL), "--train_file", files[0], "--eval_file",
            files[1], "--eval_strategy", "no", "--eval_on_start", "false", "--max_steps", "2",
            "--per_device_train_batch_size", "4", "--logging_steps", "1", "--output_dir", str(tmp_path / "out"), *extra]


def refused(tmp_path: Path, records: list[dict], *extra: str, before_model: bool = True, **kw) -> str:
    argv = dpo_argv(tmp_path, records, *extra, **kw)
    return assert_refused_in_one_line("dpo", argv, tmp_path / "out", before_model=before_model)


def test_every_pair_dropped_by_truncation_is_refused_before_anything_is_written(tmp_path, pairs):
    """What TRL's DPOTrainer dropped is read from the trainer once built (``len(trainer.train_dataset)``)."""
    assert refused(tmp_path, pairs, "--max_length", "2", before_model=False) == (
        "train_file: all 16 training pairs would be dropped: TRL drops one whose prompt alone has max_length=2 "
        "tokens or more (no response token is left); raise max_length (or set max_length: null, no limit)"
    )
    long = [{**p, "prompt": p["prompt"] + " pad" * 60} for p in pairs[:4]]
    line = refused(tmp_path, pairs, "--max_length", "40", before_model=False, evals=long)
    assert line.startswith("eval_file: all 4 eval pairs would be dropped: TRL drops one")


SYSTEM_TEMPLATE = (DEMO_MODEL / "chat_template.jinja").read_text(encoding="utf-8").replace(
    "{% else %}", "{% elif message['role'] == 'system' %}### System: {{ message['content'] }}\n{% else %}")


def test_a_partial_drop_is_one_line_and_chat_template_path_renders_the_other_splits_kind(tmp_path, pairs):
    """One kind in each split is what TRL handles (it tokenizes each split by its own first record): text pairs to
    train, chat pairs with a system turn (that only chat_template_path's template renders) to evaluate."""
    (template := tmp_path / "with_system.jinja").write_text(SYSTEM_TEMPLATE, encoding="utf-8")
    long, evals = [{**p, "prompt": p["prompt"] + " pad" * 60} for p in pairs[:3]], [chat(p, system=True) for p in pairs]
    assert refused(tmp_path, pairs, evals=evals).startswith("eval_file record 0 (counting from 0): the chat template "
                                                            "cannot render it (TemplateError: ")
    argv = dpo_argv(tmp_path, long + pairs, "--max_length", "48", "--chat_template_path", str(template), evals=evals)
    code, stdout, stderr = run_launch(argv, "dpo")
    assert code == 0, stderr[-2000:]
    assert ("dropped 3 of 19 train pairs whose prompt alone has max_length=48 tokens or more (no response token is "
            "left; TRL drops them)") in stdout
    assert "Token indices sequence length is longer" not in stdout + stderr
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert (tmp_path / "out" / "chat_template.jinja").read_text(encoding="utf-8") == SYSTEM_TEMPLATE


@pytest.mark.parametrize("flag, value, expected", [
    ("f_divergence_type", "hellinger", "f_divergence_type: 'hellinger' is not one TRL knows; use one of reverse_kl, "
                                       "forward_kl, js_divergence, alpha_divergence (reverse_kl, the default, is "
                                       "standard DPO)"),
    ("loss_type", "nope", "loss_type: 'nope' is not a DPO loss type; use one of sigmoid, "),
    ("response_template", "### Answer:", SFT_LINE),
    ("instruction_template", "### Question:", SFT_LINE),
    ("completion_only_loss", "true", SFT_LINE),
])
def test_a_bad_or_sft_only_setting_is_one_line(tmp_path, pairs, flag, value, expected):
    assert expected in refused(tmp_path, pairs, f"--{flag}", value)
    config = tmp_path / "c.yaml"  # the same in a config file
    config.write_text((ROOT / "configs" / "demo-dpo.yaml").read_text() + f"\n{flag}: {value!r}\n")
    assert expected in refused(tmp_path, pairs, config=str(config))


MIX = (": the data mixes plain-text and conversational records, which TRL tokenizes differently (a chat template, "
       "EOS); use one kind: convert the records of one kind, or put them in separate files and runs")
TYPE = "must be a string or a list of chat messages ({'role', 'content'}), got "


@pytest.mark.parametrize(("records", "expected"), [
    (lambda p: [chat(x) for x in p[:5]] + [chat(x, system=True) for x in p[5:]],
     "record 5 (counting from 0): the chat template cannot render it (TemplateError: The demo chat template supports "
     "only user and assistant roles, got system); change the record to what the template accepts, or set "
     "chat_template_path to a template that accepts it"),
    (lambda p: p[:8] + [chat(x) for x in p[8:]],
     "record 8 (counting from 0): 'prompt' is chat messages (conversational), but in record 0 'prompt' is plain text"
     + MIX),
    (lambda p: [chat(x) for x in p[:3]] + p[3:],
     "record 3 (counting from 0): 'prompt' is plain text, but in record 0 'prompt' is chat messages (conversational)"
     + MIX),
    (lambda p: [*p[:2], {**p[2], "chosen": [{"role": "assistant", "content": " 47"}]}],
     "record 2 (counting from 0): 'chosen' is chat messages (conversational), but in record 0 'prompt' is plain text"
     + MIX),
    (lambda p: [*p[:2], {**p[2], "chosen": {"text": "x"}}], f"record 2 (counting from 0): 'chosen' {TYPE}an object; "
                                                            "fix the record"),
    (lambda p: [*p[:2], {**p[2], "rejected": 47}], f"record 2 (counting from 0): 'rejected' {TYPE}a number; fix the "
                                                   "record"),
])  # fmt: skip
def test_a_bad_record_is_one_line_naming_it_and_the_fix(tmp_path, pairs, records, expected):
    assert refused(tmp_path, records(pairs)) == f"train_file {expected}"


@pytest.fixture(scope="module")
def api():
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig

    from trl_padfree.testing import tiny_llama

    tokenizer = AutoTokenizer.from_pretrained(DEMO_MODEL)
    data = Dataset.from_dict({"prompt": ["a b"], "chosen": [" c"], "rejected": [" d"]})
    return tokenizer, data, lambda **kw: DPOConfig(output_dir="unused", use_cpu=True, bf16=False, report_to=[], **kw), \
        lambda: tiny_llama(vocab_size=len(tokenizer))


def test_api_model_from_a_config_needs_a_tokenizer_and_a_reference(api):
    from trl_padfree import DPOTrainer

    tokenizer, data, config, model = api
    with pytest.raises(ValueError, match=r"^DPOTrainer needs processing_class=tokenizer for this model: it was built "
                                         r"from a config, so it has no name or path to load a tokenizer from"):
        DPOTrainer(model(), args=config(), train_dataset=data)
    with pytest.raises(ValueError, match=r"^DPOTrainer needs ref_model= for this model: .*pass "
                                         r"ref_model=copy\.deepcopy\(model\)"):
        DPOTrainer(model(), args=config(), train_dataset=data, processing_class=tokenizer)
    policy = model()  # with the reference given, it builds
    import copy

    DPOTrainer(policy, ref_model=copy.deepcopy(policy), args=config(), train_dataset=data, processing_class=tokenizer)


def test_api_ref_model_given_as_a_path_names_the_fix(api, tmp_path):
    from trl_padfree import DPOTrainer

    tokenizer, data, config, model = api
    with pytest.raises(TypeError, match=r"^ref_model must be a model \(a transformers PreTrainedModel\) or None, got "
                                        r"the string '.*nope', a path that does not exist: load it first, "
                                        r"ref_model=AutoModelForCausalLM\.from_pretrained\(path\)"):
        DPOTrainer(model(), ref_model=str(tmp_path / "nope"), args=config(), train_dataset=data,
                   processing_class=tokenizer)
    with pytest.raises(ValueError, match=r"^f_divergence_type='hellinger' is not one TRL knows"):
        DPOTrainer(model(), ref_model=model(), args=config(f_divergence_type="hellinger"), train_dataset=data,
                   processing_class=tokenizer)
