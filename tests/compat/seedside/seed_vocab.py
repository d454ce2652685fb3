"""Runs inside the seed worker: the model's vocabulary size the seed commit's
``build_tokenizer`` sets in a job's arguments, and what megaindex reads of those arguments in
the same process (as a switched Megatron-LM's GPTDataset does)."""

from __future__ import annotations

from seed_tokenizers import _tokenizer_args


def padded_vocabulary(vocab_size: int, divisible_by: int, tensor_parallel: int) -> dict:
    """A NullTokenizer job's ``vocab_size`` and ``padded_vocab_size`` after the seed's
    ``build_tokenizer``, and megaindex's ``megatron_padded_vocab_size()`` then."""
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
    from megatron.training import global_vars

    from megaindex.megatron_args import megatron_padded_vocab_size

    flags = ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(vocab_size)]
    args = _tokenizer_args(flags)
    args.make_vocab_size_divisible_by = divisible_by
    args.tensor_model_parallel_size = tensor_parallel
    args.padded_vocab_size = None
    args.pad_vocab_size = True  # a training job's default (TrainingConfig)
    global_vars._GLOBAL_ARGS = args
    try:
        tokenizer = build_tokenizer(args)
        return {
            "vocab_size": tokenizer.vocab_size,
            "padded_vocab_size": args.padded_vocab_size,
            "megaindex_reads": megatron_padded_vocab_size(),
        }
    finally:
        global_vars._GLOBAL_ARGS = None
