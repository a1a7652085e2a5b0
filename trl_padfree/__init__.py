"""trl-padfree: padding-free, completion-only fine-tuning for TRL's SFTTrainer.

Importing the package registers the ``"padfree"`` attention implementation with transformers.
"""

from .attention import (  # registers "padfree"
    ATTN_IMPLEMENTATION,
    PadfreeAttentionError,
    pick_attn_implementation,
)
from .batching import TokenBudgetBatchSampler
from .chat_masks import ChatMaskError, chat_labels, label_chats
from .collator import CollatorStats, DataCollatorForCompletionOnlyLM, TemplateNotFoundError
from .configs import DPOConfig, GRPOConfig, KTOConfig, RewardConfig, RLOOConfig, SFTConfig
from .dpo import DPOTrainer
from .kto import KTOTrainer
from .preference import DataCollatorForPreference
from .probe import PackingLeakError, PackingReport, assert_packing_safe, check_packing
from .reward_trainer import RewardTrainer
from .rl_trainer import GRPOTrainer, RLOOTrainer
from .trainer import PackingCheckCallback, SFTTrainer, check_trainer_args

__version__ = "0.1.0"

__all__ = [
    "ATTN_IMPLEMENTATION", "ChatMaskError", "CollatorStats", "DPOConfig", "DPOTrainer",
    "DataCollatorForCompletionOnlyLM", "DataCollatorForPreference", "GRPOConfig", "GRPOTrainer", "KTOConfig",
    "KTOTrainer", "PackingCheckCallback", "PackingLeakError", "PackingReport", "PadfreeAttentionError",
    "RLOOConfig", "RLOOTrainer", "RewardConfig", "RewardTrainer", "SFTConfig", "SFTTrainer",
    "TemplateNotFoundError", "TokenBudgetBatchSampler", "__version__", "assert_packing_safe", "chat_labels",
    "check_packing", "check_trainer_args", "label_chats", "pick_attn_implementation",
]  # fmt: skip
