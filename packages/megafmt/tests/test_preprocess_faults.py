"""``mega preprocess`` on bad input with a busy worker pool: a bad line at a seeded random place
ends in the clear error naming its file and line (never a pool teardown's "Bad file descriptor"
traceback), with no worker left running and nothing at the output; ``--append-eod`` with a
tokenizer that has no end-of-document token says where it was looked for."""

from __future__ import annotations

import json
import multiprocessing
import random
import shutil

import pytest

from megafmt.errors import PluginError
from megafmt.preprocess import BadInputError, PreprocessConfig, preprocess
from megafmt.tokenizers import TokenizerOptions

WORDS = ["alpha", "beta", "\u65e5\u672c", ""]
#: bad lines of every kind the plain-text path refuses, and what its error says of each
BAD_LINES = {
    b'{"text": broken\n': "not JSON",
    b'{"text": 5}\n': "holds int, expected a string",
    b'{"title": "x"}\n': "missing key 'text'",
    b'{"text": "\xff\xfe"}\n': "invalid UTF-8",
    b'{"text": "a \\ud800 b"}\n': "lone surrogate",
    b"[1, 2]\n": "",
}


@pytest.mark.parametrize("seed", range(6))
def test_a_bad_line_at_a_random_place_ends_in_its_own_error(tmp_path, seed):
    rng = random.Random(seed)
    bad, said = rng.choice(list(BAD_LINES.items()))
    total = rng.randint(200, 2000)
    where = rng.randint(1, total)
    source = tmp_path / "in.jsonl"
    with open(source, "wb") as stream:
        for number in range(1, total + 1):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 40)))
            good = (json.dumps({"text": words}) + "\n").encode()
            stream.write(bad if number == where else good)
    before = set(multiprocessing.active_children())
    config = PreprocessConfig(
        input=str(source),
        output_prefix=str(tmp_path / "out" / "o"),
        workers=rng.choice([2, 4, 8]),
        chunk_bytes=rng.choice([64, 512, 4096]),
    )
    with pytest.raises(BadInputError) as caught:
        preprocess(config)
    assert f"{source}, line {where}: " in str(caught.value) and said in str(caught.value)
    assert set(multiprocessing.active_children()) <= before  # every worker has exited
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []


def test_append_eod_with_a_bare_tokenizer_json_says_where_the_eod_is_looked_for(tmp_path):
    pytest.importorskip("tokenizers")
    from megafmt.sft.testing import write_sft_tokenizer

    full = write_sft_tokenizer(tmp_path / "full")
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(full / "tokenizer.json", bare / "tokenizer.json")
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "hello"}\n')
    config = PreprocessConfig(
        input=str(source),
        output_prefix=str(tmp_path / "o"),
        tokenizer_type="HuggingFaceTokenizer",
        tokenizer_options=TokenizerOptions(model=str(bare / "tokenizer.json")),
        append_eod=True,
    )
    with pytest.raises(PluginError) as caught:
        preprocess(config)
    message = str(caught.value)
    assert str(bare / "tokenizer.json") in message
    assert "tokenizer_config.json" in message and "eos_token" in message
