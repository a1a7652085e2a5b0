"""``DataCollatorForCompletionOnlyLM``: TRL 0.19.1's collator, back for TRL 1.x and transformers 5.x.

Same call as before (``DataCollatorForCompletionOnlyLM(response_template, tokenizer=tok, padding_free=True)``),
without the old class's silent failures:

- string templates are found whatever tokenization context precedes them (see :mod:`trl_padfree.templates`);
- multi-turn masking trains every assistant turn whatever the order of turns (see :mod:`trl_padfree.masking`);
- padding is masked by position, never by token id, so with ``pad == eos`` the real EOS is still trained (TRL #976);
- examples without the response template are reported in one warning per batch (or raise, if asked);
- the padding-free batch carries ``cu_seq_lens_q/k`` with the shape varlen kernels want (TRL #3243), max lengths
  as Python ints (no device sync), and ``use_cache=False`` so that ``model(**batch)`` in a hand-written loop never
  builds a cache, which would make sdpa/eager attend across examples (transformers' masking_utils.create_causal_mask skips packed detection when a cache is passed).

Example:
    >>> from trl_padfree.testing import tiny_byte_level_tokenizer
    >>> tok = tiny_byte_level_tokenizer()
    >>> collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tok, padding_free=True)
    >>> texts = ["### Question: hi\\n### Answer: yes", "### Question: 2+2?\\n### Answer: 4"]
    >>> batch = collator([tok(t) for t in texts])
    >>> tok.decode([t for t, lab in zip(batch["input_ids"][0], batch["labels"][0]) if lab != -100])
    ' yes 4'
    >>> batch["position_ids"][0].tolist()[:4], batch["cu_seq_lens_q"].tolist(), batch["max_length_q"]
    ([0, 1, 2, 3], [0, 11, 25], 14)
    >>> sorted(k for k in batch)
    ['cu_seq_lens_k', 'cu_seq_lens_q', 'input_ids', 'labels', 'max_length_k', 'max_length_q', 'position_ids', 'seq_idx', 'use_cache']

Bare token ids are examples too (lists, tuples, 1-D integer tensors or arrays), and labels a dataset brings are kept;
``pad_to_multiple_of`` pads the flat row with a segment of its own (see :mod:`trl_padfree.inputs`, docs/collator.md):

    >>> plain = DataCollatorForCompletionOnlyLM(None, padding_free=True, pad_to_multiple_of=4)
    >>> batch = plain([[1, 2, 3], {"input_ids": [4, 5], "labels": [-100, 9]}])
    >>> batch["labels"].tolist(), batch["position_ids"].tolist(), batch["cu_seq_lens_q"].tolist()
    ([[-100, 2, 3, -100, 9, -100, -100, -100]], [[0, 1, 2, 0, 1, 0, 1, 2]], [0, 3, 5, 8])
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from transformers.data.data_collator import DataCollatorMixin

from .flattening import example_index, flatten_features, packed_batch, padded_batch, padded_length
from .inputs import VocabularyError, vocabulary_size
from .masking import trained_mask
from .templates import RowText, Template, concat_matches, find_matches, verify_text_matching
from .token_text import TokenText

TemplateLike = str | Sequence[int]


class TemplateNotFoundError(ValueError):
    """Raised by the collator with ``on_template_not_found="raise"``."""


@dataclass
class CollatorStats:
    """Running counts over every batch this collator built (in the process that ran it)."""

    batches: int = 0
    examples: int = 0
    tokens: int = 0  # real tokens
    padded_tokens: int = 0  # tokens a padded batch of the same examples would have had
    trained_tokens: int = 0
    templates_not_found: int = 0

    @property
    def padding_share(self) -> float:
        """Share of a padded batch's tokens that would have been padding."""
        return 1.0 - self.tokens / self.padded_tokens if self.padded_tokens else 0.0


class DataCollatorForCompletionOnlyLM(DataCollatorMixin):
    """Masks prompts so only completions are trained; optionally flattens the batch into one padding-free row.

    Args:
        response_template: the text (or token ids) that precedes every completion, e.g. ``"### Answer:"``; or
            None to keep the labels the dataset brings (SFTTrainer's prompt/completion datasets) and only flatten.
        instruction_template: for multi-turn data, the text (or ids) that starts a non-assistant turn; or a list of
            them (user, system, tool headers): any of them ends an assistant turn.
        tokenizer: the tokenizer that produced ``input_ids`` (needed for string templates and for padding).
        mlm: must be False (kept for compatibility with TRL 0.19.1's signature).
        ignore_index: label value of tokens that are not trained.
        padding_free: return one row without padding, with ``position_ids`` and sequence boundaries.
        pad_to_multiple_of: round the batch length up to a multiple: the padded batch's width, or the padding-free
            row's length (the padding then is a segment of its own, labels ``ignore_index``, positions restarting
            at 0, so loss and gradients do not change).
        return_tensors: only ``"pt"``.
        on_template_not_found: ``"warn"`` (default: the example is masked entirely, one warning per batch with a
            count and the first offender decoded), ``"raise"`` (a :class:`TemplateNotFoundError` with the example's
            index and decoded head) or ``"ignore"``.
        disable_cache: put ``use_cache=False`` in padding-free batches (keep True unless your model's forward
            rejects the argument).
    """

    def __init__(
        self, response_template: TemplateLike | None,
        instruction_template: TemplateLike | Sequence[TemplateLike] | None = None, *args: Any, mlm: bool = False,
        ignore_index: int = -100, padding_free: bool = False, tokenizer: Any = None,
        pad_to_multiple_of: int | None = None, return_tensors: str = "pt",
        on_template_not_found: Literal["warn", "raise", "ignore"] = "warn", disable_cache: bool = True,
    ):
        if args:  # TRL 0.19.1 forwarded extra positionals to DataCollatorForLanguageModeling(tokenizer, ...)
            if len(args) > 1 or tokenizer is not None:
                raise TypeError("DataCollatorForCompletionOnlyLM takes at most one extra positional argument (the "
                                "tokenizer); pass the others by keyword (mlm=..., pad_to_multiple_of=..., "
                                "return_tensors=...).")
            tokenizer = args[0]
        if mlm:
            raise ValueError("mlm=True is not supported: completion-only training is causal language modelling.")
        if return_tensors != "pt":
            raise ValueError(f"return_tensors={return_tensors!r} is not supported; use 'pt' (PyTorch tensors).")
        if pad_to_multiple_of is not None and (isinstance(pad_to_multiple_of, bool) or not isinstance(
                pad_to_multiple_of, int) or pad_to_multiple_of < 1):
            raise ValueError(f"pad_to_multiple_of must be a positive int (or None), got {pad_to_multiple_of!r}; for "
                             "example pad_to_multiple_of=64.")
        if on_template_not_found not in ("warn", "raise", "ignore"):
            raise ValueError(f"on_template_not_found must be 'warn', 'raise' or 'ignore', got {on_template_not_found!r}")
        self.tokenizer, self.mlm, self.ignore_index, self.padding_free = tokenizer, False, ignore_index, padding_free
        self.pad_to_multiple_of, self.return_tensors = pad_to_multiple_of, return_tensors
        self.on_template_not_found, self.disable_cache = on_template_not_found, disable_cache
        self.response_template, self.instruction_template = response_template, instruction_template
        self.stats, self._warned_second_eos, self._vocab_size = CollatorStats(), False, vocabulary_size(tokenizer)

        self._response = None if response_template is None else Template.from_user(response_template)
        if instruction_template is None:
            self._instructions: list[Template] | None = None
        elif isinstance(instruction_template, str) or (
            isinstance(instruction_template, Sequence) and instruction_template and isinstance(instruction_template[0], int)
        ):
            self._instructions = [Template.from_user(instruction_template)]  # type: ignore[arg-type]
        else:
            self._instructions = [Template.from_user(t) for t in instruction_template]  # type: ignore[union-attr]
            if not self._instructions:
                raise ValueError("instruction_template is an empty list; pass None for single-turn data")
        if self._response is None and self._instructions is not None:
            raise ValueError("instruction_template needs a response_template (the header of assistant turns)")
        templates = [t for t in (self._response, *(self._instructions or [])) if t is not None]
        self._text: TokenText | None = None
        if any(t.text is not None for t in templates):
            if tokenizer is None:
                raise ValueError("String templates need the tokenizer that tokenized the dataset: "
                                 "DataCollatorForCompletionOnlyLM(response_template, tokenizer=tokenizer, ...).")
            self._text = TokenText.from_tokenizer(tokenizer)
            for t in templates:
                if t.text is not None:
                    verify_text_matching(t, tokenizer, self._text)

    # ------------------------------------------------------------------ core
    def torch_call(self, features: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        ids, existing_labels, cu = self._flatten(features)
        seq_idx = example_index(cu)
        labels, found = self._labels(ids, existing_labels, cu, seq_idx)
        self._report_missing(ids, cu, found)
        lengths = cu[1:] - cu[:-1]
        self.stats.batches += 1
        self.stats.examples += int(lengths.size)
        self.stats.tokens += int(ids.size)
        self.stats.padded_tokens += int(lengths.size) * padded_length(lengths, self.pad_to_multiple_of)
        self.stats.trained_tokens += int(np.count_nonzero(labels != self.ignore_index))
        if self.padding_free:
            batch = packed_batch(ids, labels, cu, seq_idx, pad_to_multiple_of=self.pad_to_multiple_of,
                                 pad_id=self._pad_id() if self.pad_to_multiple_of else 0, ignore_index=self.ignore_index)
            if self.disable_cache:
                batch["use_cache"] = False
            return batch
        return padded_batch(ids, labels, cu, pad_id=self._pad_id(), ignore_index=self.ignore_index,
                            padding_side=getattr(self.tokenizer, "padding_side", "right") or "right",
                            pad_to_multiple_of=self.pad_to_multiple_of)

    def templates_found(self, features: Sequence[Any]) -> np.ndarray:
        """Per example, whether the response template occurs in it (all True without one); no labels are made.

        >>> DataCollatorForCompletionOnlyLM([7, 8]).templates_found([[1, 7, 8, 2], [1, 7, 2]]).tolist()
        [True, False]
        """
        ids, _, cu = self._flatten(features)
        found = np.full(cu.size - 1, self._response is None)
        if self._response is not None:
            row = RowText.build(self._text, ids) if self._text is not None else None
            found[find_matches(self._response, ids, cu, row).example] = True
        return found

    def _flatten(self, features: Sequence[Any]) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        try:
            return flatten_features(features, vocab_size=self._vocab_size, ignore_index=self.ignore_index)
        except VocabularyError:
            fresh = vocabulary_size(self.tokenizer)  # tokens may have been added since the collator was built
            if fresh == self._vocab_size:
                raise
            self._vocab_size = fresh
            if self._text is not None:  # and the token text table the string templates are searched in
                self._text = TokenText.from_tokenizer(self.tokenizer)
            return flatten_features(features, vocab_size=fresh, ignore_index=self.ignore_index)

    def _labels(self, ids: np.ndarray, existing: np.ndarray | None, cu: np.ndarray, seq_idx: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
        if self._response is None:  # no template: the labels the dataset brought (or every token) are trained
            mask, found = np.ones(ids.size, dtype=bool), np.ones(cu.size - 1, dtype=bool)
        else:
            row = RowText.build(self._text, ids) if self._text is not None else None
            responses = find_matches(self._response, ids, cu, row)
            instructions = None
            if self._instructions is not None:
                instructions = concat_matches([find_matches(t, ids, cu, row) for t in self._instructions])
            mask, found = trained_mask(ids.size, cu, responses, instructions, seq_idx)
        if existing is not None:  # the labels the dataset gave are kept (as TRL and transformers do)
            mask &= existing != self.ignore_index
        mask[cu[:-1]] = False  # the first token of an example is never a target (packed rows need this)
        self._untrain_second_eos(ids, cu, mask)
        return np.where(mask, ids if existing is None else existing, self.ignore_index), found

    def _untrain_second_eos(self, ids: np.ndarray, cu: np.ndarray, mask: np.ndarray) -> None:
        """Leave untrained an EOS that ends an example right after an EOS and whitespace only.

        A chat template's text ends its last turn with the end-of-turn token and a newline (ChatML:
        ``<|im_end|>\\n``); where that token is also the EOS (e.g. SmolLM2-Instruct), TRL's SFTTrainer appends the
        EOS to such a ``text`` (it does not end with the EOS) and the example would train a second end of turn after
        the newline. The template's own end of turn stays trained: exactly one; one warning says how to avoid the
        extra tokens.
        """
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if not isinstance(eos, int):
            return
        found = 0
        for start, end in zip(cu[:-1].tolist(), (cu[1:] - 1).tolist(), strict=True):
            if ids[end] != eos or not mask[end]:
                continue
            earlier = [j for j in range(end - 2, max(start, end - 5) - 1, -1) if ids[j] == eos]  # whitespace between
            if earlier and self.tokenizer.decode(ids[earlier[0] + 1 : end].tolist()).strip() == "":
                mask[end] = False
                found += 1
        if found and not self._warned_second_eos:
            self._warned_second_eos = True
            token = self.tokenizer.eos_token
            warnings.warn(f"{found} example(s) end in {token!r}, whitespace and {token!r} again (a chat template's "
                          f"text, to which TRL's SFTTrainer appended its EOS): the second {token!r} is not trained, the "
                          "template's own end of turn is; strip the trailing whitespace of the text (text.rstrip()) so "
                          "that TRL appends nothing", stacklevel=2)

    def _pad_id(self) -> int:  # the pad, else the EOS id (padding is masked by position: its id never matters)
        ids = (getattr(self.tokenizer, "pad_token_id", None), getattr(self.tokenizer, "eos_token_id", None))
        return int(next((i for i in ids if i is not None), 0))

    # ------------------------------------------------------------ reporting
    def _head(self, ids: np.ndarray, cu: np.ndarray, i: int, n: int = 60) -> str:
        piece = ids[cu[i] : cu[i + 1]]
        if self.tokenizer is not None:
            return repr(self.tokenizer.decode(piece[:n].tolist()))
        return str(piece[:n].tolist())

    def _report_missing(self, ids: np.ndarray, cu: np.ndarray, found: np.ndarray) -> None:
        if found.all():
            return
        missing = np.flatnonzero(~found)
        self.stats.templates_not_found += int(missing.size)
        if self.on_template_not_found == "ignore":
            return
        first = int(missing[0])
        where = f"example {first} of this batch, which begins {self._head(ids, cu, first)}"
        if self.on_template_not_found == "raise":
            raise TemplateNotFoundError(
                f"The response template {self._response} was not found in {where}. Check that the formatted text "
                "contains the template exactly (spaces and newlines included), or pass on_template_not_found='warn' "
                "to train without such examples.")
        warnings.warn(f"{missing.size} of {found.size} examples in this batch contain no response template "
                      f"{self._response} and are ignored in the loss (first: {where}). "
                      f"{self.stats.templates_not_found} so far. Pass on_template_not_found='raise' to stop instead.",
                      UserWarning, stacklevel=3)
