"""Moved to :mod:`.model` (issue 31): this name stays until launch/steps.py and launch/preview.py import from there."""

from .model import load_pretrained, load_tokenizer  # noqa: F401
