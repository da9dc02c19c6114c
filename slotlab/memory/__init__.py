"""The memory interface the decision core runs on, and its implementations (see base.py)."""

from slotlab.memory.base import (
    SEQ_RM_FULL, SEQ_RM_NO, SEQ_RM_PART, SEQ_RM_RS, Batch, Memory, MemoryInfo, SeqRmRefused, SlotSampler, Vocab, check_memory,
    protocol_mismatches, require_seq_rm,
)

__all__ = ["Batch", "Memory", "MemoryInfo", "SlotSampler", "Vocab", "check_memory", "protocol_mismatches", "require_seq_rm", "SeqRmRefused",
           "SEQ_RM_NO", "SEQ_RM_PART", "SEQ_RM_FULL", "SEQ_RM_RS"]
