"""``trl-padfree grpo``: RL with verifiable rewards through :class:`trl_padfree.GRPOTrainer` (TRL's, padding-free);
``reward_funcs`` by name or import path, imported at validation (a wrong name: exit 2, nothing written).
``trl-padfree rloo`` (:mod:`.rloo`) is the same recipe with ``RLOOConfig``."""

from __future__ import annotations

import os
import pkgutil
import sys
from collections.abc import Callable, Sequence
from typing import Any

from trl_padfree.configs import GRPOConfig as CONFIG
from trl_padfree.rl_trainer import GRPOTrainer as TRAINER

from .. import steps
from ..config import ConfigError
from ..config import RewardFunctionArguments as ARGUMENTS
from ..validate import Range
from .preference_data import check_kinds

__all__ = ["ARGUMENTS", "CONFIG", "RANGES", "TRAINER", "check", "preview", "resolve_reward", "run", "settings"]

RANGES = {"beta": Range(0, hint="0 (TRL's default) loads no reference model")}


def check(cfg: Any) -> None:
    names = cfg.launch.reward_funcs or []
    if not names:
        raise ConfigError("reward_funcs is empty: name at least one reward, e.g. reward_funcs: [answer_prefix] "
                          "or reward_funcs: ['my_rewards:score'] (a module beside the config)")
    for name in names:
        resolve_reward(name)


def settings(cfg: Any) -> dict[str, Any]:  # (the summary has reward_funcs as a list)
    return {"prompt_once": prompt_once(cfg), "reward_funcs": ",".join(cfg.launch.reward_funcs or [])}


def run(cfg: Any, callbacks: Sequence[Any] = (), trainer_class: type = TRAINER) -> dict[str, Any]:
    tokenizer, data = steps.load_data(cfg, load_prompts, "prompts")
    model, cfg = steps.load_policy(cfg, layout=None)  # probed once prompt_once is known (unset: on where it can run)
    cfg.training.prompt_once, cfg.explicit = prompt_once(cfg), cfg.explicit | {"prompt_once"}
    steps.probe_model(cfg, model, layout="group")
    trainer = steps.make_trainer(cfg, trainer_class, tokenizer, model, data, callbacks,
                                 reward_funcs=[resolve_reward(name) for name in cfg.launch.reward_funcs])
    return steps.fit(cfg, trainer, data, {**settings(cfg), "reward_funcs": list(cfg.launch.reward_funcs)},
                     steps.eval_summary("mean reward", {"reward": ""}, {}, "logged step"))


TRL_REWARDS = ("accuracy_reward", "get_soft_overlong_punishment", "reasoning_accuracy_reward", "think_format_reward")


def resolve_reward(name: str) -> Callable[..., Any]:
    """The reward function called ``name`` (see ``reward_funcs``); a bad name is a :class:`ConfigError`.

    >>> resolve_reward("answer_prefix").__name__, resolve_reward("trl_padfree.rewards:exact_match").__name__
    ('answer_prefix', 'exact_match')
    """
    from trl_padfree.rewards import REWARDS

    if name in REWARDS:
        return REWARDS[name]
    if name in TRL_REWARDS:
        try:
            import trl.rewards

            reward = getattr(trl.rewards, name)
        except ImportError as exc:
            raise ConfigError(f"reward_funcs: {name!r} needs a package that is not installed ({exc}); install it "
                              "or choose another reward") from None
        if name == "get_soft_overlong_punishment":
            return reward(max_completion_len=1280, soft_punish_cache=256)  # trl grpo's values
        return reward
    if ":" in name or "." in name:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # as trl grpo: modules next to the config
        try:
            func = pkgutil.resolve_name(name)  # 'module:function' or 'module.function'
        except (ImportError, AttributeError, ValueError) as exc:
            raise ConfigError(f"reward_funcs: cannot import {name!r}: {exc}; write 'module:function'") from None
        if not callable(func):
            raise ConfigError(f"reward_funcs: {name!r} is a {type(func).__name__}, not a function")
        return func
    known = ", ".join([*sorted(REWARDS), *TRL_REWARDS])
    raise ConfigError(f"reward_funcs: {name!r} is not a known reward ({known}) nor an import path 'module:function'")


def check_prompt_records(dataset: Any, source: str) -> None:
    columns = list(dataset.column_names)
    if "prompt" not in columns:
        raise ConfigError(f"{source}: RL records need a 'prompt' (plus any columns the rewards read, e.g. "
                          f"'answer'); columns: {', '.join(columns)}")
    check_kinds(dataset.select_columns(["prompt"]), source, ["prompt"], ["prompt"])


def load_prompts(cfg: Any, tokenizer: Any) -> steps.Records:
    """The prompt records, with the answer column this package's rewards read (else step 1 fails in the reward)."""
    from trl_padfree.rewards import ANSWER_COLUMNS, REWARDS

    from ..data import load_splits

    train, eval_ds = load_splits(cfg.launch, cfg.training.seed, check=check_prompt_records)
    conversational = isinstance(train[0]["prompt"], list)
    if conversational and getattr(tokenizer, "chat_template", None) is None:
        raise ConfigError(f"the prompts are chat messages but the tokenizer of {cfg.model.model_name_or_path!r} "
                          "has no chat template; use text prompts")
    names, columns = [name for name in cfg.launch.reward_funcs or [] if name in REWARDS], set(train.column_names)
    if names and not columns & set(ANSWER_COLUMNS):
        raise ConfigError(
            f"{'train_file' if cfg.launch.train_file else 'dataset'}: reward_funcs {', '.join(names)} score a "
            f"completion against its known answer, but the records have no "
            f"{' or '.join(repr(c) for c in ANSWER_COLUMNS)} column (columns: {', '.join(sorted(columns))}); add the "
            "answer to each record or choose a reward that needs none (e.g. an import path 'module:function')")
    return steps.Records(train, eval_ds, "conversational" if conversational else "prompt")


def prompt_once(cfg: Any) -> bool:
    """The config's ``prompt_once``, else on where rows are padding-free and the attention ``padfree`` (or ``auto``)."""
    if "prompt_once" in cfg.explicit:
        return bool(cfg.training.prompt_once)
    return bool(cfg.padding_free) and cfg.attn_implementation in ("padfree", "auto")


def preview(cfg: Any, tokenizer: Any, n: int, color: bool = False) -> list[str]:
    """For the first ``n`` prompts, what one group forwards (shared) and scores."""
    training, data = cfg.training, load_prompts(cfg, tokenizer)
    g, c = training.num_generations, training.max_completion_length
    once = prompt_once(cfg)
    lines = [f"{len(data.train)} training prompts; each group: 1 prompt, {g} completions of up to {c} tokens "
             f"(padding_free={cfg.padding_free}, prompt_once={once})"]
    for index in range(min(n, len(data.train))):
        prompt = data.train[index]["prompt"]
        chat = isinstance(prompt, list)  # tokenized as TRL's GRPOTrainer does (return_dict: transformers 5)
        p = len((tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)
                 if chat else tokenizer(text=prompt))["input_ids"])
        text = str(prompt[-1]["content"]) if chat else prompt
        forwarded = p + g * c if once else g * (p + c)
        shown = text if len(text) <= 80 else text[:77] + "..."
        lines += [f"--- prompt {index} ({p} tokens): {shown!r}",
                  f"    shared: the prompt, forwarded {'once for the group' if once else f'{g} times (once per row)'}"
                  "; not scored",
                  f"    scored: each completion's tokens ({g} x up to {c}), attending to the prompt and to itself only",
                  f"    forwarded tokens at most: {forwarded} (padded TRL layout: {g * (p + c)})"]
    return lines
