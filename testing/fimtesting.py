"""Fill-in-the-middle test support: code-like text, a byte-level BPE with the FIM sentinels
trained on it offline (no download), and a corpus of it.

Test support, not part of any package (pytest puts this folder on ``sys.path``; the FIM
benchmark adds it).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy

EOD = "<|endoftext|>"
SENTINELS = ["<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>"]
FILE_SEP = "<file_sep>"
WORDS = ["def", "return", "class", "import", "self", "value", "x", "for", "in", "if", "else"]
WORDS += ["(", ")", ":", "=", "+", "[", "]", ",", ".", "#", "0", "1", "é", "日本", "💡"]
WORDS += ["\n", "    ", "\t"]
#: Megatron-LM's default --fim-*-token strings by GPTFIMDatasetConfig key
FIM_EXTRA_TOKENS = {
    "prefix": "<fim_prefix>",
    "middle": "<fim_middle>",
    "suffix": "<fim_suffix>",
    "pad": "<fim_pad>",
    "eod": EOD,
}


def code_text(rng: random.Random, words: int) -> str:
    """``words`` random code-like words (multi-byte characters among them)."""
    return "".join(rng.choice(WORDS) + rng.choice([" ", ""]) for _ in range(words))


def write_tokenizer(directory: Path, vocab_size: int, texts: Iterable[str]) -> str:
    """Train a byte-level BPE on ``texts`` with the end-of-text token, the four sentinels and
    the split token, and save it in ``directory`` (tokenizer.json, tokenizer_config.json). The
    config declares the end-of-text token (eos) and the sentinels special, as transformers
    reads them (decoding removes those), but not the split token."""
    import tokenizers

    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOD, *SENTINELS, FILE_SEP],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOD,
        "extra_special_tokens": SENTINELS,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return str(directory)


def write_code_corpus(prefix: str, tokenizer: Any, texts: Iterable[str]) -> int:
    """A uint16 corpus at ``prefix``: one document per text, its ids and the EOD id (of a
    megafmt tokenizer); returns the token count."""
    from megafmt.builder import IndexedDatasetBuilder
    from megafmt.format import get_bin_path, get_idx_path

    builder = IndexedDatasetBuilder(get_bin_path(prefix), dtype=numpy.uint16)
    total = 0
    for text in texts:
        ids = numpy.array([*tokenizer.text_to_ids(text), tokenizer.eod], dtype=numpy.uint16)
        builder.add_document(ids, [len(ids)])
        total += len(ids)
    builder.finalize(get_idx_path(prefix))
    return total
