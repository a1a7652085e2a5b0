"""The private methods and functions of TRL and transformers that trl_padfree overrides or calls: what breaks on a
TRL or transformers upgrade. (torch's are behind accessors in :mod:`trl_padfree._torch_private`.)

:data:`RELIED_ON` lists each one with the parameters relied on (the leading ones, in order, as the override
defines or the call passes them) and the module that relies on it; ``tests/test_torch_private.py`` checks that
each still exists with those parameters (``inspect.signature``), on the newest and on the lowest supported TRL.

Overridden by the trainers (a rename makes the override dead code: the trainer silently stops being padding-free):

- ``trl.DPOTrainer._compute_loss(model, inputs, return_outputs)``: ``dpo.py``
- ``trl.KTOTrainer._compute_loss(model, inputs, return_outputs)``: ``kto.py``
- ``trl.GRPOTrainer._get_per_token_logps_and_entropies`` and ``trl.RLOOTrainer``'s (``model, input_ids,
  attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss``): ``rl_trainer.py``
- ``trl.GRPOTrainer._generate(prompts)`` and ``trl.RLOOTrainer``'s: ``throughput.py`` (timed: the
  generation seconds of the training logs)
- ``trl.DPOTrainer._precompute_ref_logps``: ``launch/tasks/dpo.py`` (no progress bar when the output is not a terminal)
- ``transformers.Trainer._save_checkpoint(model, trial)`` and ``_get_output_dir(trial)``:
  ``launch/atomic_save.py`` (atomic checkpoints)
- ``transformers.Trainer._maybe_log_save_evaluate``: ``launch/whole_run.py``
- ``transformers.Trainer._issue_warnings_after_load(load_result)``: ``trainer.py``
- ``transformers.PreTrainedModel.should_save_on_this_rank(is_main_process)``: replaced on the model by
  ``launch/run_record.py`` (``save_on_each_node`` on several nodes)

Called:

- ``trl.DPOTrainer._prepare_dataset(dataset, processing_class, args, dataset_name)``: ``launch/tasks/dpo.py``
- ``trl.data_utils._tokenize(processing_class, input)``: ``launch/tasks/preference_data.py`` (skipped where TRL lacks it)
- ``trl.scripts._hf_argparser.string_to_bool(v)``: ``launch/config.py``
- ``transformers.Trainer._load_from_checkpoint(resume_from_checkpoint)``: ``launch/run_record.py``
- ``transformers.Trainer._remove_unused_columns(dataset, description)`` and
  ``_get_collator_with_removed_columns(data_collator, description)``: ``trainer.py``
- ``transformers.PreTrainedModel._from_config(config)``: the probes' docstring examples
- ``transformers.PretrainedConfig._attn_implementation`` (a property, no parameters): ``attention.py``,
  ``probe.py``, ``launch/model.py``

>>> sorted({api.owner.split(".")[0] for api in RELIED_ON})
['transformers', 'trl']
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RELIED_ON", "PrivateAPI"]


@dataclass(frozen=True)
class PrivateAPI:
    """``owner.name`` (``owner``: a dotted module, or module and class), the parameters relied on (``self``
    included for methods; None for an attribute), and the module of trl_padfree that relies on it."""

    owner: str
    name: str
    params: tuple[str, ...] | None
    used_by: str


_RL_PARAMS = ("self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy",
              "compute_aux_loss")

RELIED_ON: tuple[PrivateAPI, ...] = (
    PrivateAPI("trl.DPOTrainer", "_compute_loss", ("self", "model", "inputs", "return_outputs"), "dpo"),
    PrivateAPI("trl.KTOTrainer", "_compute_loss", ("self", "model", "inputs", "return_outputs"), "kto"),
    PrivateAPI("trl.GRPOTrainer", "_get_per_token_logps_and_entropies", _RL_PARAMS, "rl_trainer"),
    PrivateAPI("trl.RLOOTrainer", "_get_per_token_logps_and_entropies", _RL_PARAMS, "rl_trainer"),
    PrivateAPI("trl.GRPOTrainer", "_generate", ("self", "prompts"), "throughput"),
    PrivateAPI("trl.RLOOTrainer", "_generate", ("self", "prompts"), "throughput"),
    PrivateAPI("trl.DPOTrainer", "_precompute_ref_logps", ("self",), "launch.tasks.dpo"),
    PrivateAPI("trl.DPOTrainer", "_prepare_dataset", ("self", "dataset", "processing_class", "args", "dataset_name"),
               "launch.tasks.dpo"),
    PrivateAPI("trl.data_utils", "_tokenize", ("processing_class", "input"), "launch.tasks.preference_data"),
    PrivateAPI("trl.scripts._hf_argparser", "string_to_bool", ("v",), "launch.config"),
    PrivateAPI("transformers.Trainer", "_save_checkpoint", ("self", "model", "trial"), "launch.atomic_save"),
    PrivateAPI("transformers.Trainer", "_get_output_dir", ("self", "trial"), "launch.atomic_save"),
    PrivateAPI("transformers.Trainer", "_maybe_log_save_evaluate", ("self",), "launch.whole_run"),
    PrivateAPI("transformers.Trainer", "_issue_warnings_after_load", ("self", "load_result"), "trainer"),
    PrivateAPI("transformers.Trainer", "_load_from_checkpoint", ("self", "resume_from_checkpoint"),
               "launch.run_record"),
    PrivateAPI("transformers.Trainer", "_remove_unused_columns", ("self", "dataset", "description"), "trainer"),
    PrivateAPI("transformers.Trainer", "_get_collator_with_removed_columns", ("self", "data_collator", "description"),
               "trainer"),
    PrivateAPI("transformers.PreTrainedModel", "should_save_on_this_rank", ("self", "is_main_process"),
               "launch.run_record"),
    PrivateAPI("transformers.PreTrainedModel", "_from_config", ("config",), "probe (docstrings)"),
    PrivateAPI("transformers.PretrainedConfig", "_attn_implementation", None, "attention, probe, launch.model"),
)
