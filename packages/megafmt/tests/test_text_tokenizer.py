"""The huggingface tokenizer as a TextTokenizer (what FIM and decoding ask): Megatron's library
method names, special tokens as the config files declare them to transformers. Equality with
the seed commit's HuggingFaceTokenizer over transformers: tests/compat/test_fim_compat.py."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy
import pytest
from fimtesting import EOD, FILE_SEP, SENTINELS, code_text, write_tokenizer

from megafmt.errors import PluginError
from megafmt.tokenizers import TextTokenizer, TokenizerOptions, load_text_tokenizer

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    rng = random.Random(0)
    texts = [code_text(rng, 30) for _ in range(300)]
    return write_tokenizer(tmp_path_factory.mktemp("text-tokenizer"), 300, texts)


def load(directory):
    return load_text_tokenizer("huggingface", TokenizerOptions(model=str(directory)))


def test_round_trip_and_lookups(tokenizer_dir):
    text = load(tokenizer_dir)
    assert isinstance(text, TextTokenizer)
    ids = text.text_to_ids("def x(self):\n    return 日本")
    assert ids == text.encode_batch(["def x(self):\n    return 日本"])[0]
    assert text.ids_to_text(ids) == "def x(self):\n    return 日本"
    assert text.ids_to_text(numpy.array(ids, dtype=numpy.uint16)) == "def x(self):\n    return 日本"
    assert text.tokens_to_ids([EOD, "<fim_pad>", "no-such-token"]) == [0, 4, None]


def test_declared_special_tokens_are_removed_others_kept(tokenizer_dir):
    text = load(tokenizer_dir)
    ids = text.text_to_ids(f"def{SENTINELS[0]} x{FILE_SEP}y{EOD}")
    # the sentinels and the eos are declared special; the split token is not
    assert text.ids_to_text(ids) == f"def x{FILE_SEP}y"
    assert text.ids_to_text(ids, remove_special_tokens=False) == (
        f"def{SENTINELS[0]} x{FILE_SEP}y{EOD}"
    )
    # ids outside the vocabulary have no token: left out, as transformers' None tokens are
    assert text.ids_to_text([*ids[:1], 10_000, -1]) == "def"


@pytest.mark.parametrize(
    ("files", "removed"),
    [
        ({"tokenizer_config.json": {"eos_token": EOD}}, {EOD}),
        (
            {"tokenizer_config.json": {"additional_special_tokens": [FILE_SEP]}},
            {FILE_SEP},
        ),
        (
            {
                "tokenizer_config.json": {"pad_token": {"content": "<fim_pad>"}},
                "special_tokens_map.json": {"extra_special_tokens": ["<fim_middle>"]},
            },
            {"<fim_pad>", "<fim_middle>"},
        ),
    ],
)
def test_special_tokens_are_the_declared_ones(tokenizer_dir, tmp_path, files, removed):
    """Named ones and the further list (under its transformers 5 name or the older one), from
    either file."""
    (tmp_path / "tokenizer.json").write_bytes((Path(tokenizer_dir) / "tokenizer.json").read_bytes())
    for name, config in files.items():
        (tmp_path / name).write_text(json.dumps(config))
    text = load(tmp_path)
    candidates = [EOD, *SENTINELS, FILE_SEP]
    ids = text.tokens_to_ids(candidates)
    for token, token_id in zip(candidates, ids, strict=True):
        expected = "" if token in removed else token
        assert text.ids_to_text([token_id]) == expected, token


def test_a_tokenizer_that_cannot_decode_is_refused():
    with pytest.raises(PluginError, match="the bytes tokenizer cannot turn ids into text"):
        load_text_tokenizer("bytes", TokenizerOptions())
