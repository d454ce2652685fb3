"""What megaindex reads of Megatron-LM's arguments when a switched Megatron-LM builds its
datasets (pretrain_gpt.py makes the ``GPTDatasetConfig`` from its arguments, less the fields
that are megaindex's own).

``megatron.training`` is never imported here: a process that runs Megatron-LM has it loaded
and its arguments parsed; anywhere else there are none to read, and megaindex's defaults hold.
"""

from __future__ import annotations

import sys


def megatron_padded_vocab_size() -> int | None:
    """The model's vocabulary size in this process's Megatron-LM arguments: their
    ``padded_vocab_size``, which Megatron-LM's ``build_tokenizer`` sets (before pretrain_gpt.py
    makes the dataset config) to the tokenizer's size padded to a multiple of
    ``make_vocab_size_divisible_by`` x ``tensor_model_parallel_size``. None outside a
    Megatron-LM run, or before it set them."""
    global_vars = sys.modules.get("megatron.training.global_vars")
    if global_vars is None:
        return None
    try:
        args = global_vars.get_args()
    except (AssertionError, AttributeError):  # not parsed yet, or another Megatron-LM layout
        return None
    padded = vars(args).get("padded_vocab_size")
    return padded if isinstance(padded, int) and not isinstance(padded, bool) else None
