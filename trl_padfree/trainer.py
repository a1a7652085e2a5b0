"""This package's ``SFTTrainer`` and what all its trainers share (:class:`PadfreeTrainerMixin`).

- :func:`check_trainer_args`: fails early, naming the fix, on settings that conflict with a collator that flattens
  by itself; :class:`PackingCheckCallback`: the packing probe once before training;
- :class:`SFTTrainer`: ``trl.SFTTrainer`` with both wired in for this package's padding-free collator, token-budget
  batches (``max_tokens_per_batch``) and the scored-positions LM head.
"""

from __future__ import annotations

import inspect
import os
from functools import partial
from typing import Any

import torch
import trl
from transformers import TrainerCallback

from .attention import ATTN_IMPLEMENTATION
from .batching import TokenBudgetBatchSampler
from .collator import DataCollatorForCompletionOnlyLM
from .configs import SFTConfig as PadfreeSFTConfig
from .configs import trainer_keywords, trainer_settings
from .formatting import FormattingFunc, first_record
from .recurrent import prepare_packed_layers, refuse_shared_prompt
from .threads import torch_threads, training_threads
from .throughput import RealTokensLog


def is_padding_free_collator(collator: Any) -> bool:
    return isinstance(collator, DataCollatorForCompletionOnlyLM) and collator.padding_free


def check_trainer_args(args: Any, collator: Any) -> None:
    """Raise a ``ValueError`` naming the fix when trainer arguments conflict with a flattening collator."""
    if not is_padding_free_collator(collator) or args is None:
        return
    if getattr(args, "padding_free", False) and not isinstance(args, PadfreeSFTConfig):  # (there: this collator's)
        raise ValueError(
            "SFTConfig(padding_free=True) conflicts with DataCollatorForCompletionOnlyLM(padding_free=True): TRL "
            "rejects any custom collator in its own padding-free mode. Set padding_free=False in SFTConfig; the "
            "collator flattens the batch itself."
        )
    if getattr(args, "packing", False) and getattr(args, "packing_strategy", None) in {"bfd", "bfd_split"}:
        raise ValueError(
            f"SFTConfig(packing=True, packing_strategy={args.packing_strategy!r}) turns on TRL's own padding-free "
            "mode, which rejects any custom collator. Set packing=False: the collator keeps the same examples in "
            "the same mini-batches and flattens each batch itself (the paper's setting)."
        )


class PackingCheckCallback(TrainerCallback):
    """Runs the packing probe once, when training begins, on the trained model and ``models`` (e.g. a separate
    reference): :func:`~trl_padfree.probe.assert_packing_safe`, or with a trainer's ``layout`` (``"preference"``,
    ``"group"``, ``"reward"``) :func:`~trl_padfree.probe.assert_layout_packing_safe`; raises ``PackingLeakError``
    if packed examples leak, else prints one line (so that a run's log shows the probe ran and passed)."""

    def __init__(self, layout: str | None = None, prompt_once: bool = False, models: list[Any] | tuple[Any, ...] = (),
                 **probe_kwargs: Any) -> None:
        self.layout, self.prompt_once, self.models, self.probe_kwargs = layout, prompt_once, list(models), probe_kwargs
        self.report = None  # the trained model's (the first probed)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        from .probe import assert_layout_packing_safe, assert_packing_safe, training_rtol

        for m in [] if self.report is not None else [model, *self.models]:
            if m is None:
                continue
            kwargs = {"rtol": training_rtol(args), **self.probe_kwargs}
            if self.layout is None:
                report = assert_packing_safe(m, **kwargs)
            else:
                report = assert_layout_packing_safe(m, self.layout, prompt_once=self.prompt_once, **kwargs)
            self.report = self.report or report
            if state.is_world_process_zero:
                print(probe_passed_line(report, self.layout, self.prompt_once), flush=True)
        return control


def probe_passed_line(report: Any, layout: str | None = None, prompt_once: bool = False) -> str:
    """The one log line of a passed packing probe (the launcher prints the same line)."""
    if layout is None:
        what, compared, unit = "packing probe", "logit", "examples"
    else:
        name = {"group": "RL"}.get(layout, layout)
        what = f"{name} probe ({'prompt-once' if prompt_once else 'padding-free'})"
        compared, unit = "score" if layout == "reward" else "logit", "sequences"
    return (f"[trl-padfree] {what}: {report.model_type} with {report.attn_implementation!r} keeps packed {unit} "
            f"apart (max {compared} diff {report.max_abs_diff:.2g} <= tolerance {report.tolerance:.2g})")


def token_budget_dataloader(trainer: Any, max_tokens: int) -> Any:
    """The training ``DataLoader`` of ``trainer`` with token-budget mini-batches, prepared by its accelerator: a
    :class:`~trl_padfree.batching.TokenBudgetBatchSampler` per rank (seeded by ``data_seed``, else ``seed``), which
    deals the batches out itself (accelerate's sharding made a pass-through). Epochs have a constant number of
    batches, so step arithmetic, resumed epochs and gradient accumulation stay exact."""
    from transformers.trainer_utils import seed_worker

    args, dataset = trainer.args, trainer.train_dataset
    if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__len__"):
        raise ValueError(
            "max_tokens_per_batch needs a training dataset with a length (a datasets.Dataset or a map-style "
            "torch Dataset), not an iterable/streaming one: drop max_tokens_per_batch or load the data in memory"
        )
    column_names = getattr(dataset, "column_names", None)  # the token count of every example, by index
    if column_names is not None and "input_ids" not in column_names:
        raise ValueError(f"max_tokens_per_batch needs a tokenized dataset with a 'input_ids' column; it has "
                         f"{column_names}")
    lengths = ([len(ids) for ids in dataset["input_ids"]] if column_names is not None
               else [len(dataset[i]["input_ids"]) for i in range(len(dataset))])
    sampler = TokenBudgetBatchSampler(
        lengths, max_tokens, shuffle=True, seed=args.data_seed if args.data_seed is not None
        else args.seed, num_replicas=trainer.accelerator.num_processes, rank=trainer.accelerator.process_index,
        drop_last=args.dataloader_drop_last)
    collator = trainer.data_collator
    if hasattr(dataset, "column_names"):
        dataset = trainer._remove_unused_columns(dataset, description="Training")
    else:
        collator = trainer._get_collator_with_removed_columns(collator, description="Training")
    params: dict[str, Any] = dict(
        batch_sampler=sampler, collate_fn=collator, num_workers=args.dataloader_num_workers,
        pin_memory=args.dataloader_pin_memory, persistent_workers=args.dataloader_persistent_workers,
        worker_init_fn=partial(seed_worker, num_workers=args.dataloader_num_workers, rank=args.process_index))
    if args.dataloader_num_workers > 0:
        params["prefetch_factor"] = args.dataloader_prefetch_factor
    loader = trainer.accelerator.prepare(torch.utils.data.DataLoader(dataset, **params))
    keep_rank_batches(loader, sampler)
    trainer.token_budget_sampler = sampler
    return loader


def keep_rank_batches(loader: Any, sampler: TokenBudgetBatchSampler) -> None:
    """Make accelerate's ``BatchSamplerShard`` around ``sampler`` (which yields only this rank's batches) a
    pass-through that forwards ``set_epoch`` (which reaches the wrapper once ``skip_first_batches`` wraps it)."""
    shard = getattr(loader, "batch_sampler", None)
    if shard is not sampler and getattr(shard, "batch_sampler", None) is sampler:
        shard.num_processes, shard.process_index = 1, 0
        shard.set_epoch = sampler.set_epoch


def install_scored_head(model: Any, outputs: tuple[str, ...], enabled: bool, main_process: bool = True, *,
                        temperature: float = 1.0, cast_lm_head_to_fp32: bool = False) -> str:
    """Add :func:`trl_padfree.scored_head.add_scored_head` to ``model`` (its base model under PEFT, where TRL adds
    its fused head); return ``"scored"`` or ``"trl: <why>"`` (printed when the model is the reason).

    ``temperature`` and ``cast_lm_head_to_fp32``: those TRL gave its own fused head (GRPO/RLOO divide the logits by
    ``args.temperature``)."""
    from accelerate.utils import is_peft_model

    from .scored_head import add_scored_head, remove_scored_head

    target = model.get_base_model() if is_peft_model(model) else model
    if not enabled:
        remove_scored_head(target)  # (a model given the scored head by an earlier trainer)
        return "trl: scored_lm_head=False"
    reason = add_scored_head(target, outputs=outputs, temperature=temperature,
                             cast_lm_head_to_fp32=cast_lm_head_to_fp32)
    if reason is None:
        return "scored"
    if main_process:
        print(f"[trl-padfree] LM head: TRL's fused head, not the scored-positions head ({reason})", flush=True)
    return f"trl: {reason}"


def require_padfree_attention(model: Any, what: str = "prompt_once=True") -> None:
    """Refuse a model whose attention would ignore :data:`~trl_padfree.attention.KV_INDEX` (shared prompt keys), or
    that has recurrent layers, which cannot share a prompt's state (:func:`trl_padfree.recurrent.refuse_shared_prompt`)."""
    refuse_shared_prompt(model, what)
    attn = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if attn != ATTN_IMPLEMENTATION:
        raise ValueError(
            f"{what} needs attn_implementation='padfree' (it alone reads the shared prompt keys), but the model "
            f"uses {attn!r}, which would let the rejected response attend to the chosen one. Load the model with "
            "attn_implementation='padfree' (it runs flash-attn or torch's varlen kernel on a GPU), or set "
            "prompt_once=False."
        )


class PadfreeTrainerMixin(RealTokensLog):
    """What this package's trainers add to TRL's (before the TRL class in the bases): their settings and probe
    (:meth:`_padfree_settings`, :meth:`_padfree_setup`), the CPU thread policy during ``train()``, a closed progress
    bar when a run fails, real tokens/s in the logs (:mod:`trl_padfree.throughput`), no "missing key" warning for a
    tied weight on resume, a model card true for a local base model, and ``use_cache: true`` in the saved config."""

    torch_num_threads: int | str | None = "auto"
    padfree: bool = False
    prompt_once: bool = False

    def _padfree_settings(self, trainer: str, args: Any, kwargs: dict[str, Any], padfree: bool | None = None,
                          **given: Any) -> dict[str, Any]:
        """Read the package's settings of ``trainer`` (:func:`~trl_padfree.configs.trainer_settings`; its deprecated
        keywords taken out of ``kwargs``, or given) into ``torch_num_threads``, ``scored_lm_head``, ``padfree``
        (``padfree``, else the ``padding_free`` setting, else ``args.padding_free``) and ``prompt_once``; refuse
        ``prompt_once`` without ``padding_free``."""
        settings = trainer_settings(trainer, args, **{**trainer_keywords(trainer, kwargs), **given})
        self.torch_num_threads = settings["torch_num_threads"]
        self.scored_lm_head = settings.get("scored_lm_head", True)
        if padfree is None:
            padfree = settings.get("padding_free", getattr(args, "padding_free", False))
        self.padfree = bool(padfree)
        self.prompt_once = bool(settings["prompt_once"])
        if self.prompt_once and not self.padfree:
            config = trainer.replace("Trainer", "Config")
            raise ValueError(f"prompt_once=True needs {config}(padding_free=True) (trl_padfree.{config}).")
        return settings

    def _padfree_setup(self, layout: str, check_packing: bool, outputs: tuple[str, ...] = (),
                       ref_outputs: tuple[str, ...] = ("log_probs",), **head: Any) -> None:
        """After TRL's ``__init__``: the scored-positions head on policy and reference (``outputs`` /
        ``ref_outputs``, none for a reward model), the ``prompt_once`` checks and the layout probe's callback."""
        ref = getattr(self, "ref_model", None)
        ref = self.accelerator.unwrap_model(ref) if ref is not None else None
        if outputs:
            main = self.is_world_process_zero()
            self.lm_head_state = install_scored_head(self.model, outputs, self.scored_lm_head, main, **head)
            self.ref_lm_head_state = None if ref is None else install_scored_head(
                ref, ref_outputs, self.scored_lm_head, main, **head)
        if self.prompt_once:
            what = "prompt_once=True" + (" (siblings must not see each other)" if layout == "group" else "")
            if getattr(self, "aux_loss_enabled", False):  # (a tiny gpt-oss: gradients 2e-3 relative off)
                raise ValueError(
                    f"{what} with the MoE router load-balancing loss (router_aux_loss_coef > 0) is not exact: that "
                    "loss averages over the tokens forwarded, and a shared prompt is forwarded once instead of once "
                    "per response. Set router_aux_loss_coef=0.0 in the trainer's config, or prompt_once=False."
                )
            for m in (self.accelerator.unwrap_model(self.model), ref):
                if m is not None:
                    require_padfree_attention(m, what)
        if check_packing:
            self.add_callback(PackingCheckCallback(layout, self.prompt_once, [ref] if ref is not None else []))

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train`` with the CPU threads of ``torch_num_threads``; a run that fails (e.g. the packing probe
        stops it) closes its progress bar (else a stray ``0%| | 0/N`` is printed at exit)."""
        threads = self.torch_num_threads
        if threads == "auto":
            threads, why = training_threads(self.model, self.args.device.type)
            if threads is not None and self.is_world_process_zero():
                which = (f" instead of torch's {torch.get_num_threads()}" if threads != torch.get_num_threads()
                         else ", torch's own count")
                print(f"[trl-padfree] torch threads: {threads}{which} ({why}); set OMP_NUM_THREADS or call "
                      "torch.set_num_threads() to choose", flush=True)
        for model in (self.model, getattr(self, "ref_model", None)):  # recurrent layers: reset at every boundary
            if model is not None:
                prepare_packed_layers(model)
        with torch_threads(threads):
            try:
                result = super().train(*args, **kwargs)
                self._write_model_card()
                return result
            except BaseException:
                from transformers.trainer_callback import ProgressCallback

                for callback in self.callback_handler.callbacks:
                    if isinstance(callback, ProgressCallback) and callback.training_bar is not None:
                        callback.training_bar.close()
                        callback.training_bar = None
                raise

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """transformers' check, without calling a tied weight (saved once, under the name it is tied to) missing:
        ``Trainer`` warned "missing keys ... ['lm_head.weight']" on every resume of a model with tied embeddings."""
        names_of: dict[int, list[str]] = {}  # the names of every parameter tensor (several where tied)
        for name, param in self.model.named_parameters(remove_duplicate=False):
            names_of.setdefault(id(param), []).append(name)
        missing_now = set(load_result.missing_keys)
        tied = {n for names in names_of.values() if len(names) > 1 and not missing_now.issuperset(names) for n in names}
        missing = [k for k in load_result.missing_keys if k not in tied]
        if len(missing) != len(load_result.missing_keys):
            load_result = load_result._replace(missing_keys=missing)
        super()._issue_warnings_after_load(load_result)

    def _write_model_card(self) -> None:
        """The model card at the end of training, whatever ``save_strategy`` (TRL writes it only with a checkpoint,
        so ``save_strategy="no"`` left none): named as TRL's ``_save_checkpoint`` names it. A card that cannot be
        written is one warning line, not a lost run."""
        if not self.args.should_save:
            return
        hub = self.args.hub_model_id
        name = hub.split("/")[-1] if hub else os.path.basename(os.path.normpath(self.args.output_dir))
        try:
            self.create_model_card(model_name=name)
        except Exception as exc:  # (the trained model is still in memory; the caller saves it)
            from .exception_text import one_line

            print(f"[trl-padfree] warning: no model card written to {self.args.output_dir}: {one_line(exc)}",
                  flush=True)

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        """TRL's model card (``output_dir/README.md``), true for a local base model: TRL's said "a fine-tuned version
        of [None](https://huggingface.co/None)" and ``model="None"``; this one names the base model's path and,
        without a Hub repository, loads the model from ``output_dir``."""
        hub_model_id = self.hub_model_id
        if hub_model_id is None:
            self.hub_model_id = self.args.output_dir
        try:
            super().create_model_card(*args, **kwargs)
        finally:
            self.hub_model_id = hub_model_id
        path = os.path.join(self.args.output_dir, "README.md")
        if not self.is_world_process_zero() or not os.path.isfile(path):
            return
        base = getattr(getattr(self.model, "config", None), "_name_or_path", "") or ""
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        fixed = text.replace("[None](https://huggingface.co/None)",
                             f"the local model `{base}`" if base else "a local model")
        if fixed != text:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(fixed)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save as ``Trainer`` does, with ``use_cache: true`` in the saved ``config.json`` (training runs without a
        KV cache; generation from the saved model expects it on). The model in memory keeps False."""
        config = getattr(self.accelerator.unwrap_model(self.model), "config", None)
        if config is None or getattr(config, "use_cache", None) is not False:
            return super().save_model(output_dir, _internal_call)
        config.use_cache = True
        try:
            super().save_model(output_dir, _internal_call)
        finally:
            config.use_cache = False


def formatting_func_told(bound: dict[str, Any]) -> Any:
    """``SFTTrainer``'s ``formatting_func`` (if any) wrapped in a :class:`~trl_padfree.formatting.FormattingFunc`,
    told on the first training (else eval) record how it is written: per example (TRL 1.x) or for batches (TRL
    0.10, the blog post's convention)."""
    func = bound.get("formatting_func")
    if func is None:
        return None
    wrapped = FormattingFunc(func)
    record = first_record(bound.get("train_dataset"))
    record = record if record is not None else first_record(bound.get("eval_dataset"))
    dataset_kwargs = getattr(bound.get("args"), "dataset_kwargs", None) or {}
    if record is not None and "input_ids" not in record and not dataset_kwargs.get("skip_prepare_dataset"):
        wrapped.tell(record)  # (TRL ignores formatting_func on a tokenized dataset: then it is never called)
    return wrapped


def tokenizer_of(processing_class: Any, model: Any) -> Any:
    """The tokenizer of ``processing_class`` (a processor's own), or, without one, ``model``'s, loaded from its name
    or path as TRL loads it."""
    if processing_class is None:
        from transformers import AutoTokenizer

        name = model if isinstance(model, str) else getattr(getattr(model, "config", None), "_name_or_path", None)
        processing_class = AutoTokenizer.from_pretrained(name)
    return getattr(processing_class, "tokenizer", processing_class)


def config_collator(config: Any, collator: Any, bound: dict[str, Any]) -> Any:
    """The collator of a :class:`trl_padfree.SFTConfig`: ``collator`` if one was passed (checked against the
    config), else :class:`~trl_padfree.DataCollatorForCompletionOnlyLM` built from ``response_template``,
    ``instruction_template``, ``padding_free`` and ``pad_to_multiple_of`` where one of the first three is set,
    else None (TRL's)."""
    templates = config.response_template is not None or config.instruction_template is not None
    if collator is not None:
        if templates:
            raise ValueError("SFTConfig(response_template=..., instruction_template=...) build the collator, and a "
                             "data_collator was passed too: give the templates to your collator, or pass no "
                             "data_collator")
        if config.padding_free and not is_padding_free_collator(collator):
            raise ValueError(f"SFTConfig(padding_free=True) conflicts with data_collator={type(collator).__name__}, "
                             "which does not flatten: pass DataCollatorForCompletionOnlyLM(..., padding_free=True) "
                             "or no data_collator (SFTTrainer builds it), or set padding_free=False")
        return collator
    if not (config.padding_free or templates):
        return None
    if config.assistant_only_loss:
        raise ValueError("SFTConfig(assistant_only_loss=True) is read by TRL's collator, and this one trains what "
                         "follows response_template: set assistant_only_loss=False (and instruction_template for "
                         "multi-turn data)")
    record = first_record(bound.get("train_dataset")) or {}
    if config.response_template is None and "completion" in record and config.completion_only_loss is not False:
        raise ValueError("SFTConfig(padding_free=True) without response_template would train the prompts of this "
                         "prompt/completion data: set response_template, or completion_only_loss=False to train "
                         "them")
    instruction = config.instruction_template
    if isinstance(instruction, list) and len(instruction) == 1:
        instruction = instruction[0]
    multiple = config.pad_to_multiple_of
    return DataCollatorForCompletionOnlyLM(
        config.response_template, instruction, tokenizer=tokenizer_of(bound.get("processing_class"), bound.get("model")),
        padding_free=config.padding_free, pad_to_multiple_of=multiple if isinstance(multiple, int) else None)


class SFTTrainer(PadfreeTrainerMixin, trl.SFTTrainer):
    """``trl.SFTTrainer`` that validates its settings for this collator and probes the model before training.

    Its settings are :class:`trl_padfree.SFTConfig` fields (with TRL's ``SFTConfig``, their defaults); the trainer
    keywords ``check_packing``, ``max_tokens_per_batch``, ``torch_num_threads`` and ``scored_lm_head`` still work
    for one release (a ``DeprecationWarning``; one that contradicts the config is an error). With
    ``padding_free=True`` (or a ``response_template``) and no ``data_collator`` it builds
    :class:`~trl_padfree.DataCollatorForCompletionOnlyLM`. ``max_tokens_per_batch=N`` fills every mini-batch of a
    rank with whole examples up to ``N`` real tokens (:func:`token_budget_dataloader`). ``formatting_func`` may be
    written per example or for batches (TRL 0.10's convention; :mod:`trl_padfree.formatting`). ``scored_lm_head``
    (default True) scores TRL's loss with :mod:`trl_padfree.scored_head`; ``self.lm_head_state`` says which head.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        given = trainer_keywords("SFTTrainer", kwargs)
        bound = inspect.signature(trl.SFTTrainer.__init__).bind_partial(None, *args, **kwargs).arguments
        del bound["self"]
        config = bound.get("args")
        settings = trainer_settings("SFTTrainer", config, **given)
        self.scored_lm_head, self.torch_num_threads = settings["scored_lm_head"], settings["torch_num_threads"]
        self.max_tokens_per_batch = settings["max_tokens_per_batch"]
        self.token_budget_sampler: TokenBudgetBatchSampler | None = None
        ours = isinstance(config, PadfreeSFTConfig)
        if ours:
            bound["data_collator"] = config_collator(config, bound.get("data_collator"), bound)
        collator = bound.get("data_collator")
        check_trainer_args(config, collator)
        bound["formatting_func"] = formatting_func_told(bound)
        own_padding_free = ours and config.padding_free
        if own_padding_free:
            config.padding_free = False  # TRL's own padding-free mode refuses a custom collator; the flat batch is ours
        try:
            super().__init__(**bound)
        finally:
            if own_padding_free:
                config.padding_free = True
        if settings["check_packing"] and is_padding_free_collator(collator):
            self.add_callback(PackingCheckCallback())

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        """TRL's ``compute_loss``, with the scored-positions LM head (:meth:`use_scored_lm_head`) added first."""
        self.use_scored_lm_head()
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)

    def use_scored_lm_head(self) -> str:
        """Give the model :mod:`trl_padfree.scored_head` (once) for TRL's ``model(**inputs, fused_lm_head=True)``,
        unless ``scored_lm_head=False``; return ``self.lm_head_state``: ``"scored"``, or ``"trl: <why>"`` where TRL's
        fused head scores (a fallback for the model is said in one line)."""
        state = getattr(self, "lm_head_state", None)
        if state is None:
            state = self.lm_head_state = install_scored_head(
                self.model, ("log_probs", "entropy", "is_top1"), self.scored_lm_head, self.is_world_process_zero())
        return state

    def get_train_dataloader(self) -> Any:
        if self.max_tokens_per_batch is None:
            return super().get_train_dataloader()
        return token_budget_dataloader(self, self.max_tokens_per_batch)
