"""Runs inside the seed worker (testing/seedref.py): the seed commit's SFT tokenizer and dataset,
built as pretrain_gpt.py builds them under ``--sft``, their samples returned as numpy arrays."""

from __future__ import annotations


class SeedSFTTokenizer:
    """What Megatron's text-tokenizer wrapper gives the SFT dataset of its ``sft`` library."""

    def __init__(self, path: str, prompt_format: str) -> None:
        from megatron.core.tokenizers import MegatronTokenizer
        from megatron.core.tokenizers.text.libraries.sft_tokenizer import SFTTokenizer

        self.library = SFTTokenizer(path, prompt_format)
        # the identity the seed's build_tokenizer gives --tokenizer-type SFTTokenizer
        self.wrapper_identifiers = MegatronTokenizer.from_pretrained(
            tokenizer_path=path, metadata_path={"library": "sft"}, prompt_format=prompt_format
        ).unique_identifiers

    def tokenize_conversation(self, conversation, return_target, add_generation_prompt):
        return self.library.tokenize_conversation(
            conversation, return_target, add_generation_prompt
        )

    @property
    def eod(self) -> int:
        return self.library.eod

    @property
    def pad(self) -> int:
        return self.library.pad_id

    @property
    def vocab_size(self) -> int:
        return self.library.vocab_size

    @property
    def unique_identifiers(self) -> dict:
        return self.wrapper_identifiers


def tokenize(path: str, prompt_format: str, conversations: list) -> list:
    """The seed tokenizer's ids and targets of each conversation, or the error it raised."""
    tokenizer = SeedSFTTokenizer(path, prompt_format)
    results = []
    for conversation in conversations:
        try:
            tokens, target = tokenizer.tokenize_conversation(conversation, True, False)
            results.append((tokens.tolist(), target.tolist()))
        except (AssertionError, ValueError) as error:
            results.append(type(error).__name__)
    return results, tokenizer.eod, tokenizer.pad


def samples(
    jsonl: str, tokenizer_path: str, prompt_format: str, settings: dict, count: int
) -> list:
    """The seed's SFT train samples 0..count-1 (and ``len``), as pretrain_gpt.py builds them."""
    train = build(jsonl, tokenizer_path, prompt_format, settings)
    return len(train), [as_numpy(train[i]) for i in range(count)]


def samples_at(
    jsonl: str, tokenizer_path: str, prompt_format: str, settings: dict, indices: list
) -> list:
    """The seed's SFT train samples at ``indices`` (any ints: negative ones too), or for an
    index it fails on, the error's type name."""
    train = build(jsonl, tokenizer_path, prompt_format, settings)
    results = []
    for idx in indices:
        try:
            results.append(as_numpy(train[idx]))
        except Exception as error:  # the seed's failure, reported as data
            results.append(type(error).__name__)
    return results


def as_numpy(sample: dict) -> dict:
    return {key: value.numpy() for key, value in sample.items()}


def build(jsonl: str, tokenizer_path: str, prompt_format: str, settings: dict):
    """The seed's SFT train dataset over ``jsonl``, as pretrain_gpt.py builds it."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
    from megatron.training.datasets.sft_dataset import SFTDataset

    config = GPTDatasetConfig(
        random_seed=settings["seed"],
        sequence_length=settings["sequence_length"],
        blend=([jsonl], None),
        split=settings["split"],
        tokenizer=SeedSFTTokenizer(tokenizer_path, prompt_format),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        context_parallel_size=settings["context_parallel_size"],
    )
    train, _, _ = BlendedMegatronDatasetBuilder(
        SFTDataset, settings["sizes"], lambda: True, config
    ).build()
    return train
