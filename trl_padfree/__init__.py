"""trl-padfree: padding-free, completion-only fine-tuning for TRL's SFTTrainer."""

from .collator import CollatorStats, DataCollatorForCompletionOnlyLM, TemplateNotFoundError

__version__ = "0.1.0"

__all__ = ["CollatorStats", "DataCollatorForCompletionOnlyLM", "TemplateNotFoundError", "__version__"]
