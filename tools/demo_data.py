"""The demo's data: two corpora of real English text that ship with Python, a BPE tokenizer
trained on them, and the blended datasets and loaders built from the preprocessed corpora.

The corpora need no network: ``pydoc_data.topics`` (the help texts of the language reference)
and the docstrings of the standard library's modules, classes and functions, read from their
source files with ``ast`` (nothing is imported). Both the demo (tools/demo.py) and its gloo
ranks (tools/demo_ranks.py) build the datasets through ``build_datasets``: the ranks hit the
cache the demo wrote.
"""

from __future__ import annotations

import ast
import json
import sysconfig
from pathlib import Path
from typing import Any

#: the tokenizer's end-of-document token (its tokenizer_config.json names it eos_token)
EOD_TOKEN = "<|endoftext|>"


def reference_topics() -> list[str]:
    """The language reference's help topics, one document per paragraph block of a topic."""
    from pydoc_data.topics import topics

    documents = []
    for name in sorted(topics):
        blocks = [block.strip() for block in topics[name].split("\n\n\n")]
        documents += [block for block in blocks if len(block) > 40]
    return documents


def library_docstrings(limit: int) -> list[str]:
    """Up to ``limit`` docstrings of the standard library, in a fixed order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    documents: list[str] = []
    skipped = {"site-packages", "test", "tests", "idle_test"}
    for path in sorted(stdlib.rglob("*.py")):
        if skipped & set(path.relative_to(stdlib).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        nodes = [tree, *ast.walk(tree)]
        for node in nodes:
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef):
                text = ast.get_docstring(node)
                if text and len(text) > 40:
                    documents.append(text)
                    if len(documents) == limit:
                        return documents
    return documents


def write_jsonl(path: Path, documents: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as stream:
        for text in documents:
            stream.write(json.dumps({"text": text}) + "\n")


def train_tokenizer(documents: list[str], folder: Path, vocab_size: int) -> Path:
    """A byte-level BPE tokenizer.json trained on ``documents`` (offline, seconds), with a
    tokenizer_config.json naming its end-of-document token, as a HuggingFace folder has."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOD_TOKEN}))
    return folder


def dataset_tokenizer(settings: dict[str, Any]) -> Any:
    """What GPTDataset needs of the tokenizer: its EOD, vocabulary size and identity."""
    from megaindex.tokenizer import IdentifiedTokenizer

    return IdentifiedTokenizer(
        eod=settings["eod"],
        vocab_size=settings["vocab_size"],
        unique_identifiers={"class": "demo-bpe", "tokenizer": settings["tokenizer"]},
    )


def build_datasets(settings: dict[str, Any]) -> list[Any]:
    """The blended train, valid and test datasets of the demo's two corpora (split 90,8,2)."""
    from megaindex import BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig

    config = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=settings["seq_length"],
        blend=(settings["prefixes"], settings["weights"]),
        split="90,8,2",
        tokenizer=dataset_tokenizer(settings),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        path_to_cache=settings["cache"],
    )
    builder = BlendedMegatronDatasetBuilder(GPTDataset, settings["samples"], lambda: True, config)
    return builder.build()


def training_loader(
    settings: dict[str, Any], dp_rank: int, dp_size: int, workers: int, consumed: int
) -> Any:
    """megaload's loader of the training split for one data-parallel rank."""
    from megaload import DataLoaderConfig, build_pretraining_data_loader

    train = build_datasets(settings)[0]
    config = DataLoaderConfig(
        micro_batch_size=settings["micro_batch_size"],
        global_batch_size=settings["micro_batch_size"] * dp_size,
        data_parallel_rank=dp_rank,
        data_parallel_size=dp_size,
        num_workers=workers,
    )
    return build_pretraining_data_loader(train, consumed, config)
