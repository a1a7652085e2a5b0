"""trl-padfree: padding-free, completion-only fine-tuning for TRL's SFTTrainer."""

__version__ = "0.1.0"
