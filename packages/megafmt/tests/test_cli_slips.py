"""Command lines one step off: a tokenizer file without its type, sizes that are not numbers,
corpus prefixes with a suffix or without preprocess's ``_<key>_document``, a missing output
folder. Each ends in an error naming what was given and what to give instead, or in the
behaviour that was meant; none ends in a traceback or in an output that looks right."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from megafmt.cli.main import main

DOCUMENTS = [[[1, 2, 3], [4, 5]], [[6]]]


def mega(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def jsonl(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "hello"}\n')
    return str(source)


@pytest.mark.parametrize(
    "flags",
    [
        ["--tokenizer-model", "tok.json"],
        ["--vocab-file", "vocab.json", "--merge-file", "merges.txt"],
        ["--tokenizer-metadata", "meta.json"],
    ],
)
def test_a_tokenizer_file_without_its_type_is_refused(jsonl, tmp_path, flags):
    out = str(tmp_path / "out" / "o")
    with pytest.raises(SystemExit) as caught:
        main(["preprocess", "--input", jsonl, "--output-prefix", out, *flags])
    message = str(caught.value.code)
    assert f"{flags[0]} {flags[1]}" in message and "without --tokenizer-type" in message
    assert "HuggingFaceTokenizer" in message
    assert not (tmp_path / "out").exists()  # nothing written


def test_find_optimal_num_workers_with_ray_is_refused_before_the_tokenizer_loads(jsonl, tmp_path):
    missing = str(tmp_path / "no-such-tokenizer")
    argv = ["preprocess", "--input", jsonl, "--output-prefix", str(tmp_path / "o")]
    argv += ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", missing]
    with pytest.raises(SystemExit, match="does not combine with --ray"):
        main([*argv, "--ray", "--find-optimal-num-workers"])


def test_without_a_type_or_a_file_the_bytes_tokenizer_is_used(jsonl, tmp_path, capsys):
    out = str(tmp_path / "o")
    status, _, err = mega(capsys, "preprocess", "--input", jsonl, "--output-prefix", out)
    assert status == 0, err
    assert os.path.getsize(out + "_text_document.bin") == 2 * len("hello")  # a uint16 a byte


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "one", "1e999"])
def test_chunk_mb_that_is_not_a_positive_number_is_a_usage_error(jsonl, tmp_path, capsys, value):
    args = ["preprocess", "--input", jsonl, "--output-prefix", str(tmp_path / "o")]
    with pytest.raises(SystemExit) as caught:
        main([*args, f"--chunk-mb={value}"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "argument --chunk-mb" in err and repr(value) in err
    assert not list(tmp_path.glob("o*"))


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--workers", "two"),
        ("--log-interval", "1.5"),
        ("--vocab-size", "x"),
        ("--max-documents", "-3"),
        ("--ray-shard-mb", "1e3"),
        ("--workers-to-check", "x"),
    ],
)
def test_numbers_that_are_not_numbers_are_usage_errors(jsonl, tmp_path, capsys, flag, value):
    args = ["preprocess", "--input", jsonl, "--output-prefix", str(tmp_path / "o")]
    with pytest.raises(SystemExit) as caught:
        main([*args, flag, value])
    assert caught.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["info", "verify", "merge"])
def test_a_prefix_with_its_suffix_names_the_prefix_meant(make_corpus, tmp_path, capsys, command):
    prefix = make_corpus(DOCUMENTS)
    args = [str(tmp_path / "merged"), prefix + ".bin"] if command == "merge" else [prefix + ".bin"]
    status, _, err = mega(capsys, command, *args)
    assert status == 1
    assert f"did you mean {prefix!r}?" in err and "without .bin" in err


@pytest.mark.parametrize("command", ["info", "verify", "merge"])
def test_a_preprocess_prefix_without_its_key_names_the_outputs(jsonl, tmp_path, capsys, command):
    out = str(tmp_path / "o")
    assert mega(capsys, "preprocess", "--input", jsonl, "--output-prefix", out)[0] == 0
    args = [str(tmp_path / "merged"), out] if command == "merge" else [out]
    status, _, err = mega(capsys, command, *args)
    assert status == 1
    assert f"did you mean {out + '_text_document'!r}?" in err


def test_merge_makes_a_missing_output_folder(make_corpus, tmp_path, capsys):
    prefix = make_corpus(DOCUMENTS)
    out = tmp_path / "new" / "deeper" / "merged"
    status, _, err = mega(capsys, "merge", str(out), prefix)
    assert status == 0, err
    for suffix in (".bin", ".idx"):
        merged = (tmp_path / "new" / "deeper" / f"merged{suffix}").read_bytes()
        assert merged == Path(prefix + suffix).read_bytes()


def test_merge_into_a_dangling_link_names_it(make_corpus, tmp_path, capsys):
    prefix = make_corpus(DOCUMENTS)
    os.symlink(tmp_path / "gone", tmp_path / "out")
    status, _, err = mega(capsys, "merge", str(tmp_path / "out" / "merged"), prefix)
    assert status == 1
    assert "the output's folder must be a folder" in err and "which does not exist" in err
