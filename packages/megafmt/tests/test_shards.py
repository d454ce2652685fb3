"""Shards of the preprocess input: byte ranges on line starts that cover every line once, in
order, and tokenize to the bytes of the whole file."""

import dataclasses
import gzip
import json
import random

import pytest

from megafmt.merging import merge
from megafmt.preprocess import PreprocessConfig
from megafmt.preprocess.inputs import expand_input, read_chunks
from megafmt.preprocess.pipeline import load_checked_tokenizer, new_progress, tokenize_into
from megafmt.preprocess.shards import plan_shards


def lines_file(path, count, seed):
    rng = random.Random(seed)
    with open(path, "w") as stream:
        for _ in range(count):
            stream.write(json.dumps({"text": "x" * rng.randint(0, 300)}) + "\n")


@pytest.mark.parametrize("seed", range(6))
def test_shards_cover_every_line_once_in_order(tmp_path, seed):
    rng = random.Random(seed)
    path = tmp_path / "input.jsonl"
    lines_file(path, rng.randint(1, 400), seed)
    data = path.read_bytes()
    files = expand_input(str(path))
    shards = plan_shards(files, rng.randint(1, 5000))
    assert shards[0].start == 0 and (shards[-1].end or len(data)) == len(data)
    for shard in shards:
        if shard.start:
            assert data[shard.start - 1 : shard.start] == b"\n"
    chunks = read_chunks(shards, chunk_bytes=rng.randint(1, 3000))
    assert b"".join(line for chunk in chunks for line in chunk.lines) == data


def test_small_and_compressed_files_are_one_shard_each(tmp_path):
    lines_file(tmp_path / "a.jsonl", 50, 0)
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(b'{"text": "a"}\n' * 999))
    shards = plan_shards(expand_input(str(tmp_path)), shard_bytes=10)
    assert [s.path.rsplit("/", 1)[1] for s in shards if s.end is None] == ["b.jsonl.gz"]
    assert len(shards) > 2


def test_shards_tokenized_apart_merge_into_the_whole_run(tmp_path):
    lines_file(tmp_path / "in.jsonl", 300, 1)
    config = PreprocessConfig(
        input=str(tmp_path / "in.jsonl"), output_prefix=str(tmp_path / "whole"), append_eod=True
    )
    tokenizer = load_checked_tokenizer(config)
    files = expand_input(config.input)
    tokenize_into(config, files, tokenizer, new_progress(config))
    parts = []
    for index, shard in enumerate(plan_shards(files, shard_bytes=4000)):
        part = dataclasses.replace(config, output_prefix=str(tmp_path / f"part{index}"))
        summary = tokenize_into(part, [shard], tokenizer, new_progress(part), in_process=True)
        parts.append(summary.outputs["text"])
    assert len(parts) > 3
    merge(str(tmp_path / "merged"), parts)
    for suffix in (".bin", ".idx"):
        whole = (tmp_path / f"whole_text_document{suffix}").read_bytes()
        assert (tmp_path / f"merged{suffix}").read_bytes() == whole
