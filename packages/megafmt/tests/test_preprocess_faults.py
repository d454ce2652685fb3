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
from megafmt.preprocess.inputs import InputFile
from megafmt.preprocess.on_ray import _wait_for_shards
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


class ShardZeroFails:
    """The Ray calls ``_wait_for_shards`` makes, where shard 0's task fails while the other
    shards are still waiting (whatever the machine's load: no cluster, no timing)."""

    class exceptions:  # as Ray spells its module
        class RayError(Exception):
            pass

        class RayTaskError(RayError):
            def as_instanceof_cause(self) -> BadInputError:
                return BadInputError("in.jsonl bytes 0-100, line 1: not JSON")

    def __init__(self) -> None:
        self.cancelled: list[int] = []

    def wait(self, refs, num_returns, timeout):
        return [ref for ref in refs if ref == 0], [ref for ref in refs if ref != 0]

    def get(self, ref):
        raise self.exceptions.RayTaskError()

    def cancel(self, ref, force):
        self.cancelled.append(ref)


def test_the_first_failed_ray_shard_cancels_the_waiting_ones_at_once():
    ray = ShardZeroFails()
    shards = [InputFile("in.jsonl", 300, start=100 * n, end=100 * (n + 1)) for n in range(3)]
    with pytest.raises(BadInputError, match="line 1: not JSON") as caught:
        _wait_for_shards(ray, [0, 1, 2], shards, board=None, progress=None)
    assert ray.cancelled == [1, 2]
    assert caught.value.__notes__ == [
        "in Ray shard 0 of 3 (in.jsonl, bytes 0 to 100); 2 unfinished shards were cancelled"
    ]
