"""``preprocess``: documents, EOD, keys, partitions, bad lines and interrupts.

Expected arrays are worked out by hand from the rules of Megatron's preprocess_data.py (the
byte-for-byte comparison with megatron-core lives in the cross-package compat tests).
"""

import errno
import gzip
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy
import pytest

from megafmt import IndexedDataset, IndexedDatasetBuilder, manifest_path, read_manifest
from megafmt.cli.main import main
from megafmt.errors import OutputBlockedError, PluginError, ReadError
from megafmt.preprocess import BadInputError, PreprocessConfig, preprocess
from megafmt.preprocess.encoding import Encoder, EncodeSettings
from megafmt.preprocess.inputs import Chunk
from megafmt.tokenizers import TokenizerOptions


def write_jsonl(path, records, opener=open):
    with opener(path, "wt", encoding="utf-8") as stream:
        for record in records:
            stream.write((record if isinstance(record, str) else json.dumps(record)) + "\n")
    return str(path)


def documents(prefix):
    """Each document as its list of sequences (lists of ids)."""
    dataset = IndexedDataset(prefix)
    bounds = dataset.document_indices
    return [
        [dataset[i].tolist() for i in range(int(a), int(b))] for a, b in itertools.pairwise(bounds)
    ]


def run(tmp_path, source, output="c", **settings):
    config = PreprocessConfig(
        input=source, output_prefix=str(tmp_path / "out" / output), **settings
    )
    return preprocess(config)


NULL = {"tokenizer_type": "null", "tokenizer_options": TokenizerOptions(vocab_size=100)}


def test_bytes_tokenizer_documents_eod_and_empty_texts(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "ab"}, {"text": ""}, {"text": "é"}])
    summary = run(tmp_path, source, append_eod=True)
    prefix = summary.outputs["text"]
    assert prefix == str(tmp_path / "out" / "c_text_document")
    # "é" is two UTF-8 bytes; the empty text is a document with no sequence and no EOD
    assert documents(prefix) == [[[97, 98, 256]], [], [[195, 169, 256]]]
    assert IndexedDataset(prefix).document_indices.tolist() == [0, 1, 1, 2]
    assert IndexedDataset(prefix).sequence_lengths.dtype == numpy.int32
    assert numpy.dtype(IndexedDataset(prefix).index.dtype) == numpy.uint16
    assert (summary.documents, summary.tokens) == (3, 6)


def test_null_tokenizer_keys_lists_and_dtype(tmp_path):
    records = [
        {"text": "1 2 3", "title": "7"},
        {"text": ["4 5", "6"], "title": "8 9"},  # a list value is a list of sentences
    ]
    source = write_jsonl(tmp_path / "in.jsonl", records)
    summary = run(tmp_path, source, json_keys=("text", "title"), append_eod=True, **NULL)
    # EOD is --vocab-size - 1 (99); it joins the last sentence of a document
    assert documents(summary.outputs["text"]) == [[[1, 2, 3, 99]], [[4, 5], [6, 99]]]
    assert documents(summary.outputs["title"]) == [[[7, 99]], [[8, 9, 99]]]
    wide = run(
        tmp_path,
        source,
        tokenizer_type="NullTokenizer",  # Megatron's name is an alias
        tokenizer_options=TokenizerOptions(vocab_size=70000),
    )
    assert numpy.dtype(IndexedDataset(wide.outputs["text"]).index.dtype) == numpy.int32


def test_partitions_deal_lines_round_robin_and_workers_do_not_change_bytes(tmp_path):
    records = [{"text": str(i)} for i in range(10)]
    source = write_jsonl(tmp_path / "in.jsonl", records)
    dealt = run(tmp_path, source, partitions=3, workers=2, chunk_bytes=8, **NULL)
    # partition 0 holds lines 0 3 6 9, partition 1 lines 1 4 7, partition 2 lines 2 5 8
    order = [0, 3, 6, 9, 1, 4, 7, 2, 5, 8]
    assert documents(dealt.outputs["text"]) == [[[i]] for i in order]
    with open(dealt.outputs["text"] + ".bin", "rb") as stream:
        expected = stream.read()
    again = run(tmp_path, source, partitions=3, workers=1, chunk_bytes=1 << 20, **NULL)
    with open(again.outputs["text"] + ".bin", "rb") as stream:
        assert stream.read() == expected
    sequential = run(tmp_path, source, partitions=3, keep_sequential_samples=True, **NULL)
    assert documents(sequential.outputs["text"]) == [[[i]] for i in range(10)]


def test_inputs_gzip_zstd_globs_and_directories(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    folder = tmp_path / "corpus"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl.gz", [{"text": "1"}, {"text": "2"}], gzip.open)
    with zstandard.open(folder / "b.jsonl.zst", "wt", encoding="utf-8") as stream:
        stream.write('{"text": "3"}\n')
    write_jsonl(folder / "c.jsonl", [{"text": "4"}])
    (folder / "notes.txt").write_text("not input")
    expected = [[[1]], [[2]], [[3]], [[4]]]
    assert documents(run(tmp_path, str(folder), **NULL).outputs["text"]) == expected
    glob_run = run(tmp_path, str(folder / "*.jsonl*"), **NULL)
    assert documents(glob_run.outputs["text"]) == expected
    assert [f["path"] for f in read_manifest(glob_run.outputs["text"])["inputs"]] == [
        str(folder / name) for name in ("a.jsonl.gz", "b.jsonl.zst", "c.jsonl")
    ]
    with pytest.raises(FileNotFoundError, match="no such file"):
        run(tmp_path, str(tmp_path / "missing.jsonl"), **NULL)


def numbered_lines(count: int) -> bytes:
    return "".join(json.dumps({"text": str(i % 90)}) + "\n" for i in range(count)).encode()


def test_a_zstd_input_of_several_frames_and_a_zstd_suffix_is_read_whole(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    lines = numbered_lines(3000)
    cut = lines.index(b"\n", len(lines) // 2) + 1
    frames = [zstandard.ZstdCompressor().compress(part) for part in (lines[:cut], lines[cut:])]
    for name in ("in.jsonl.zst", "in.jsonl.zstd"):
        (tmp_path / name).write_bytes(b"".join(frames))
        prefix = run(tmp_path, str(tmp_path / name), output=name, **NULL).outputs["text"]
        assert documents(prefix) == [[[i % 90]] for i in range(3000)]


@pytest.mark.parametrize("kind", ["zst", "gz", "xz"])
@pytest.mark.parametrize("damage", ["cut short", "corrupt"])
def test_a_damaged_compressed_input_is_an_error_naming_the_file(tmp_path, kind, damage):
    """A truncated download must not become a shorter corpus: zstandard's stream reader takes
    the end of a cut frame for the end of the data."""
    import lzma

    zstandard = pytest.importorskip("zstandard")
    lines = numbered_lines(20000)
    packed = {
        "zst": zstandard.ZstdCompressor().compress,
        "gz": gzip.compress,
        "xz": lzma.compress,
    }[kind](lines)
    if damage == "cut short":
        packed = packed[: len(packed) * 6 // 10]
    else:
        middle = len(packed) // 2
        packed = (
            packed[:middle]
            + bytes(b ^ 0x5A for b in packed[middle : middle + 64])
            + (packed[middle + 64 :])
        )
    source = tmp_path / f"in.jsonl.{kind}"
    source.write_bytes(packed)
    with pytest.raises(OSError, match=rf"^{re.escape(str(source))}: reading failed"):
        run(tmp_path, str(source), **NULL)
    assert not os.path.exists(tmp_path / "out" / "c_text_document.bin")
    if damage != "cut short":  # read in small blocks, garbage may reach the parser first
        return
    # in blocks of 4 KiB of text: the lines before the block that failed are named (a cut
    # gzip or xz stream fails where it ends; zstd's reader finds a cut frame at its start)
    with pytest.raises(OSError) as raised:
        run(tmp_path, str(source), chunk_bytes=4096, **NULL)
    where = re.search(
        r"reading failed (after line (\d+), within the 4,096 bytes of text after it|within its "
        r"first 4,096 bytes of text): ",
        str(raised.value),
    )
    assert where is not None, str(raised.value)
    if kind != "zst":
        assert where[2] is not None and 0 < int(where[2]) < 20000, str(raised.value)


def test_an_input_that_cannot_be_opened_says_so(tmp_path, monkeypatch):
    from megafmt.preprocess import inputs

    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "1"}])

    def refused(path):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(inputs, "_open", refused)
    with pytest.raises(OSError, match=r"in\.jsonl: cannot be opened: Permission denied$"):
        run(tmp_path, source, **NULL)


def test_a_folder_s_hidden_files_are_not_input_so_outputs_may_be_written_into_it(tmp_path):
    folder = tmp_path / ".cache" / "data"  # a hidden folder above the input hides nothing
    folder.mkdir(parents=True)
    write_jsonl(folder / "a.jsonl", [{"text": "1"}, {"text": "2"}])
    (folder / ".hidden.jsonl").write_text("not input")
    settings = {**NULL, "output_prefix": str(folder / "out")}
    # the second run finds the first one's outputs and .mega/ manifests; a pattern matches
    # hidden names only where it names them, as Python's glob (the seed tool's) does
    for source in (folder, folder, folder / "**" / "*.json*", folder / "*.jsonl"):
        summary = preprocess(PreprocessConfig(input=str(source), **settings))
        assert documents(summary.outputs["text"]) == [[[1]], [[2]]]
    assert os.path.isdir(folder / ".mega")
    with pytest.raises(BadInputError, match=r"\.hidden\.jsonl, line 1: not JSON"):  # named
        preprocess(PreprocessConfig(input=str(folder / ".*.jsonl"), **settings))


@pytest.mark.parametrize("seed", range(5))
def test_line_ends_are_those_of_python_s_text_mode_whatever_the_block_size(seed):
    """Megatron's tool iterates its input in text mode: "\r\n" and a lone "\r" end a line.
    Random lines with every kind of line end, read in blocks of random sizes (a "\r\n" split
    between two blocks among them), give the bytes text mode gives, cut after newlines."""
    import io
    import random

    from megafmt.preprocess.inputs import _line_blocks

    rng = random.Random(seed)
    pieces = [rng.choice([b'{"text": "a b"}', b"x", b"", b" \t"]) for _ in range(300)]
    data = b"".join(p + rng.choice([b"\n", b"\r\n", b"\r", b"\r\r\n"]) for p in pieces)
    data += rng.choice([b"", b"tail", b"tail\r"])
    expected = io.TextIOWrapper(io.BytesIO(data), encoding="latin-1", newline=None).read()
    for block_bytes in (1, 2, 3, rng.randrange(4, 64), 1 << 20):
        blocks = list(_line_blocks(io.BytesIO(data), block_bytes=block_bytes))
        assert b"".join(blocks) == expected.encode("latin-1"), block_bytes
        assert all(block.endswith(b"\n") for block in blocks[:-1])


def test_a_file_with_old_mac_line_ends_is_read_line_by_line(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"text": "1"}\r{"text": "2"}\r\n{"text": "3"}\r')
    assert documents(run(tmp_path, str(source), **NULL).outputs["text"]) == [[[1]], [[2]], [[3]]]


def test_reading_very_repetitive_zstd_holds_little_of_it_at_once(tmp_path):
    """One call of the decompressor returns all its input decompresses to: it is given fewer
    compressed bytes where they decompress to more, so 100 MB of one repeated line (compressed
    to kilobytes) is never whole in memory."""
    import tracemalloc

    zstandard = pytest.importorskip("zstandard")
    from megafmt.preprocess.decompress import decompressing

    line = b'{"text": "the same line again"}\n'
    packed = zstandard.ZstdCompressor(level=19).compress(line * (100_000_000 // len(line)))
    assert len(packed) < 1 << 20
    (tmp_path / "in.jsonl.zst").write_bytes(packed)
    tracemalloc.start()
    try:
        with open(tmp_path / "in.jsonl.zst", "rb") as raw:
            stream = decompressing(raw, "in.jsonl.zst")
            assert stream.read(len(line)) == line
            _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 48 << 20, peak  # all at once: about 200 MB


def test_a_tokenizer_plugin_written_before_parallel_is_called_as_before():
    from megafmt.preprocess.encoding import _with_parallel

    calls = []

    def old_style(texts):
        calls.append(texts)
        return []

    def new_style(texts, parallel=None):
        calls.append(parallel)
        return []

    _with_parallel(old_style, False)(["a"])
    _with_parallel(new_style, False)(["a"])
    _with_parallel(new_style, None)(["a"])
    assert calls == [["a"], False, None]


def test_an_existing_file_named_like_a_glob_is_read_as_that_file(tmp_path):
    # "data[1].jsonl" also reads as a pattern matching "data1.jsonl"
    named = write_jsonl(tmp_path / "data[1].jsonl", [{"text": "7"}])
    write_jsonl(tmp_path / "data1.jsonl", [{"text": "8"}])
    assert documents(run(tmp_path, named, **NULL).outputs["text"]) == [[[7]]]
    # a name that does not exist is a pattern
    pattern = str(tmp_path / "data[1-9].jsonl")
    assert documents(run(tmp_path, pattern, output="p", **NULL).outputs["text"]) == [[[8]]]


def test_the_input_rule_is_in_the_cli_help(capsys):
    with pytest.raises(SystemExit):
        main(["preprocess", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "A file or directory of exactly that name wins over reading the name as a glob" in (
        help_text
    )


BAD_LINES = [
    '{"text": "1"}',
    "not json",
    '{"title": "2"}',
    '{"text": 3}',
    '{"text": "1  2"}',  # two spaces: not a null-tokenizer text
    '{"text": "500"}',  # beyond the vocabulary but within uint16: kept, as Megatron does
    '{"text": "70000"}',  # does not fit uint16
    '{"text": "4"}',
]


def test_a_bad_line_stops_the_run_with_file_and_line(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", BAD_LINES)
    with pytest.raises(BadInputError, match=r"in\.jsonl, line 2: not JSON"):
        run(tmp_path, source, **NULL)
    assert not os.listdir(tmp_path / "out")  # nothing written, not even a partial file


def test_skip_bad_lines_counts_and_names_them(tmp_path):
    raw = (tmp_path / "in.jsonl").open("wb")
    raw.write(("\n".join(BAD_LINES) + "\n").encode())
    raw.write(b'{"text": "\xff"}\n')  # invalid UTF-8
    raw.close()
    summary = run(tmp_path, str(tmp_path / "in.jsonl"), skip_bad_lines=True, **NULL)
    assert documents(summary.outputs["text"]) == [[[1]], [[500]], [[4]]]
    assert summary.skipped_lines == 6
    reasons = " ".join(summary.first_skipped)
    for expected in ("in.jsonl:2 (not JSON", ":3 (missing key 'text')", ":4 (key 'text' holds int"):
        assert expected in reasons
    assert ":5 (the null tokenizer expects integers" in reasons
    assert ":7 (token id 70000 does not fit the output dtype uint16)" in reasons
    assert read_manifest(summary.outputs["text"])["skipped_lines"] == 6
    (tmp_path / "utf8.jsonl").write_bytes(b'{"text": "1"}\n{"text": "\xff"}\n')
    with pytest.raises(BadInputError, match=r"utf8\.jsonl, line 2: invalid UTF-8 at byte 10"):
        run(tmp_path, str(tmp_path / "utf8.jsonl"), **NULL)


def test_manifest_records_how_the_corpus_was_made(tmp_path, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "1 2"}])
    prefix = run(tmp_path, source, append_eod=True, **NULL).outputs["text"]
    manifest = read_manifest(prefix)
    assert manifest["tokenizer"]["type"] == "null"
    assert (manifest["tokenizer"]["eod"], manifest["tokenizer"]["vocab_size"]) == (99, 100)
    assert (manifest["documents"], manifest["sequences"], manifest["tokens"]) == (1, 1, 3)
    assert manifest["dtype"] == "uint16" and manifest["flags"]["append_eod"] is True
    assert manifest["inputs"] == [{"path": source, "size": os.path.getsize(source)}]
    other = run(
        tmp_path,
        source,
        "other",
        tokenizer_type="null",
        tokenizer_options=TokenizerOptions(vocab_size=200),
    ).outputs["text"]
    assert read_manifest(other)["tokenizer"]["fingerprint"] != manifest["tokenizer"]["fingerprint"]
    assert main(["info", prefix]) == 0
    out = capsys.readouterr().out
    assert "tokenizer" in out and "null" in out and "eod 99" in out


def test_a_manifest_at_megafmt_0_1_s_place_is_read_and_replaced(tmp_path, capsys):
    """megafmt 0.1.0 wrote ``<prefix>.manifest.json`` beside the pair; now it goes into
    ``.mega/``, out of merge_datasets.py's way: the old one is read, and a rerun removes it."""
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "1 2"}])
    prefix = run(tmp_path, source, **NULL).outputs["text"]
    assert sorted(os.listdir(tmp_path / "out")) == [
        ".mega",
        "c_text_document.bin",
        "c_text_document.idx",
    ]
    os.replace(manifest_path(prefix), prefix + ".manifest.json")
    assert read_manifest(prefix)["tokenizer"]["eod"] == 99
    assert main(["info", prefix]) == 0 and "eod 99" in capsys.readouterr().out
    run(tmp_path, source, **NULL)
    assert not os.path.exists(prefix + ".manifest.json")
    assert read_manifest(prefix)["tokenizer"]["eod"] == 99


@pytest.mark.parametrize("number", [errno.EMFILE, errno.EACCES])
def test_a_manifest_that_cannot_be_read_is_an_error_naming_it(tmp_path, monkeypatch, number):
    # a raw "Too many open files" or "Permission denied" before, naming nothing of megafmt's
    import builtins

    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "1 2"}])
    prefix = run(tmp_path, source, **NULL).outputs["text"]
    real_open = builtins.open

    def refusing(file, *args, **kwargs):
        if str(file) == manifest_path(prefix):
            raise OSError(number, os.strerror(number), str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", refusing)
    with pytest.raises(ReadError) as raised:
        read_manifest(prefix)
    message = str(raised.value)
    assert message.startswith(f"{manifest_path(prefix)}: the corpus's manifest cannot be read")
    assert raised.value.errno == number
    assert ("open-files limit" in message) == (number == errno.EMFILE)


def test_cli_takes_megatron_flags(tmp_path, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "5 6"}, {"text": "7"}])
    status = main(
        [
            "preprocess",
            "--input",
            source,
            "--output-prefix",
            str(tmp_path / "m"),
            "--tokenizer-type",
            "NullTokenizer",
            "--vocab-size",
            "10",
            "--append-eod",
            "--workers",
            "2",
            "--partitions",
            "2",
            "--log-interval",
            "1",
        ]
    )
    assert status == 0
    assert documents(str(tmp_path / "m_text_document")) == [[[5, 6, 9]], [[7, 9]]]
    err = capsys.readouterr().err
    assert "docs/s" in err and "MB/s" in err and "tokens/s" in err
    assert "preprocessed 2 documents, 5 tokens" in err
    status = main(
        [
            "preprocess",
            "--input",
            source,
            "--output-prefix",
            str(tmp_path / "n"),
            "--tokenizer-type",
            "NullTokenizer",
        ]
    )
    assert status == 1
    assert "the null tokenizer needs --vocab-size" in capsys.readouterr().err


def test_add_documents_equals_add_document_one_by_one(tmp_path):
    docs = [[[1, 2], [3]], [], [[4, 5, 6]], [[7], [], [8]]]
    one = IndexedDatasetBuilder(str(tmp_path / "one.bin"), dtype=numpy.uint16)
    for doc in docs:
        one.add_document([t for s in doc for t in s], [len(s) for s in doc])
    one.finalize(str(tmp_path / "one.idx"))
    bulk = IndexedDatasetBuilder(str(tmp_path / "bulk.bin"), dtype=numpy.uint16)
    bulk.add_documents([1, 2, 3], [2, 1], [2, 0])
    bulk.add_documents(numpy.array([4, 5, 6, 7, 8]), [3, 1, 0, 1], [1, 3])
    bulk.finalize(str(tmp_path / "bulk.idx"))
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"one{suffix}").read_bytes() == (tmp_path / f"bulk{suffix}").read_bytes()
    bad = IndexedDatasetBuilder(str(tmp_path / "bad.bin"), dtype=numpy.uint16)
    with pytest.raises(ValueError, match="the lengths add up to 3 tokens, but 2 were given"):
        bad.add_documents([1, 2], [3], [1])
    with pytest.raises(ValueError, match="the documents hold 2 sequences, but 1 lengths"):
        bad.add_documents([1, 2], [2], [2])
    bad.abort()


def _children(pid):
    """The process ids whose parent is ``pid`` (Linux /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stream:
                    fields = stream.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


SLOW_RUN = """
import sys
from megafmt.preprocess import PreprocessConfig, preprocess
preprocess(PreprocessConfig(input=sys.argv[1], output_prefix=sys.argv[2], workers=1,
                            chunk_bytes=4096, log_interval=10**9))
"""


def test_an_interrupted_run_leaves_no_complete_looking_output_and_a_rerun_works(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "x" * 2000} for _ in range(40000)])
    output = str(tmp_path / "out" / "c")
    process = subprocess.Popen([sys.executable, "-c", SLOW_RUN, source, output])
    deadline = time.monotonic() + 60
    partial = None
    while time.monotonic() < deadline and process.poll() is None:
        names = os.listdir(tmp_path / "out") if os.path.isdir(tmp_path / "out") else []
        partial = next((n for n in names if n.endswith(".partial")), None)
        if partial and os.path.getsize(tmp_path / "out" / partial) > 1 << 20:
            break
        time.sleep(0.02)
    assert process.poll() is None, "the run finished before it could be interrupted"
    workers = _children(process.pid)
    assert workers, "the run had no worker processes"
    process.send_signal(signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{pid}") for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in workers if os.path.exists(f"/proc/{pid}")], "orphaned workers"
    names = os.listdir(tmp_path / "out")
    assert not [n for n in names if n.endswith((".bin", ".idx", ".manifest.json"))], names
    assert main(["verify", output + "_text_document"]) != 0
    summary = preprocess(PreprocessConfig(input=source, output_prefix=output, workers=2))
    assert summary.documents == 40000
    assert sorted(os.listdir(tmp_path / "out")) == [
        ".mega",
        "c_text_document.bin",
        "c_text_document.idx",
    ]  # the killed run's partial files were cleared
    assert os.listdir(tmp_path / "out" / ".mega") == ["c_text_document.manifest.json"]
    assert main(["verify", output + "_text_document"]) == 0


def test_split_sentences_without_nltk_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "nltk", None)  # as if NLTK were not installed
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "One. Two."}])
    with pytest.raises(PluginError, match="--split-sentences needs NLTK: pip install nltk"):
        run(tmp_path, source, split_sentences=True)
    assert not os.path.exists(tmp_path / "out")  # refused before anything was written


def test_a_full_disk_names_the_files_being_written(tmp_path, monkeypatch):
    import errno

    from megafmt.builder import IndexedDatasetBuilder

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(IndexedDatasetBuilder, "add_documents", full)
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "a b"}])
    with pytest.raises(
        OSError, match=r"No space left on device \(writing .*out/c_text_document\.bin\)"
    ):
        run(tmp_path, source, workers=1)
    assert not list((tmp_path / "out").glob("*.bin"))  # nothing half-written is left


def test_find_optimal_num_workers_reports_then_runs_everything(tmp_path, capsys):
    """The tool's trial per worker count and its ranking, then the whole input with the fastest
    count: the same bytes as a plain run (the tool's trials stop at --max-documents)."""
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": f"{i} {i % 7} 3"} for i in range(300)])
    base = ["preprocess", "--input", source, "--append-eod", "--tokenizer-type", "NullTokenizer",
            "--vocab-size", "100", "--chunk-mb", "0.001", "--partitions", "2"]  # fmt: skip
    assert main([*base, "--output-prefix", str(tmp_path / "plain"), "--workers", "2"]) == 0
    capsys.readouterr()
    tuned = [*base, "--output-prefix", str(tmp_path / "tuned"), "--find-optimal-num-workers",
             "--max-documents", "50"]  # fmt: skip
    assert main([*tuned, "--workers-to-check", "2", "3", "4"]) == 0
    report = capsys.readouterr().out
    assert "Removing num_workers (3) from workers list because it's not divisible by " \
        "num_partitions (2)" in report  # fmt: skip
    assert "Processing data with 2 workers." in report
    assert "Processing data with 4 workers." in report
    ranking = report[report.index("Performance results (fastest → slowest):") :]
    assert ranking.count(" workers → avg. docs/s: ") == 2
    assert "The most optimal num of workers is " in ranking
    for suffix in (".bin", ".idx"):
        name = f"_text_document{suffix}"
        assert (tmp_path / f"tuned{name}").read_bytes() == (tmp_path / f"plain{name}").read_bytes()
    assert main([*tuned, "--workers-to-check", "3"]) != 0
    assert "--workers-to-check 3: no count is a positive multiple of --partitions 2" in (
        capsys.readouterr().err
    )


def test_parquet_input_gives_the_bytes_of_the_same_documents_as_jsonl(tmp_path):
    """Seeded random documents (non-ASCII, empty texts, a list-of-sentences column), as jsonl
    and as a parquet file of several row groups read in several chunks: identical outputs."""
    pyarrow = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")
    rng = numpy.random.default_rng(16)
    alphabet = [*"abcdefgh éüßж中", "\n", "😀"]

    def text():
        return "".join(rng.choice(alphabet, int(rng.integers(0, 40))))

    records = [
        {"text": text(), "title": [text() for _ in range(int(rng.integers(0, 4)))]}
        for _ in range(300)
    ]
    records[5]["text"] = ""
    source = write_jsonl(tmp_path / "in.jsonl", records)
    table = pyarrow.Table.from_pylist(records)
    parquet.write_table(table, tmp_path / "in.parquet", row_group_size=70)
    settings = dict(json_keys=("text", "title"), append_eod=True, workers=2, chunk_bytes=4096)
    from_jsonl = run(tmp_path, source, output="j", **settings)
    from_parquet = run(tmp_path, str(tmp_path / "in.parquet"), output="p", **settings)
    assert (from_parquet.documents, from_parquet.tokens) == (300, from_jsonl.tokens)
    for key in ("text", "title"):
        for suffix in (".bin", ".idx"):
            with (
                open(from_jsonl.outputs[key] + suffix, "rb") as a,
                open(from_parquet.outputs[key] + suffix, "rb") as b,
            ):
                assert a.read() == b.read(), (key, suffix)
    assert len(documents(from_parquet.outputs["title"])) == 300
    # its bytes are counted, batch by batch, to the file's size (the progress's MB and rate)
    assert from_parquet.input_bytes == os.path.getsize(tmp_path / "in.parquet")


def test_a_bad_row_of_a_parquet_input_is_named_as_a_row(tmp_path):
    pyarrow = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")
    parquet.write_table(pyarrow.table({"text": ["1", "2", None]}), tmp_path / "in.parquet")
    with pytest.raises(BadInputError, match=r"in\.parquet, row 3: key 'text' holds"):
        run(tmp_path, str(tmp_path / "in.parquet"), **NULL)


@pytest.mark.parametrize("damage", ["not UTF-8", "cut short"])
def test_a_damaged_parquet_input_is_an_error_naming_the_file_and_row(tmp_path, damage):
    pyarrow = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")
    folder = tmp_path / "in"
    folder.mkdir()
    parquet.write_table(pyarrow.table({"text": ["the fox", "dog"]}), folder / "a.parquet")
    damaged = folder / "b.parquet"
    if damage == "not UTF-8":
        raw = pyarrow.array([b"fine", b"also fine", b"a\xffb"], pyarrow.binary())
        strings = pyarrow.Array.from_buffers(pyarrow.string(), len(raw), raw.buffers())
        parquet.write_table(pyarrow.table({"text": strings}), damaged)
        expected = r"row 3: a string that is not UTF-8"
    else:
        parquet.write_table(pyarrow.table({"text": ["x"] * 3000}), damaged, row_group_size=500)
        damaged.write_bytes(damaged.read_bytes()[:300])
        expected = r"reading parquet failed at row 1 or in the rows after it: "
    with pytest.raises(OSError, match=rf"^{re.escape(str(damaged))}: {expected}"):
        run(tmp_path, str(folder), **NULL)


def test_parquet_input_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    (tmp_path / "in.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # importing it raises ImportError
    with pytest.raises(PluginError, match=r"in\.parquet: .*needs pyarrow.*megafmt\[parquet\]"):
        run(tmp_path, str(tmp_path / "in.parquet"))


@pytest.mark.parametrize("tokenizer", ["bytes", "huggingface"])
def test_a_lone_surrogate_is_a_bad_line_that_names_it(tmp_path, tokenizer):
    """JSON can escape half of a surrogate pair, which is no UTF-8: the bytes tokenizer raises
    ValueError on it, the tokenizers library TypeError; either way the line is named."""
    settings = {}
    if tokenizer == "huggingface":
        tokenizers = pytest.importorskip("tokenizers")
        vocab = {"h": 0, "e": 1, "l": 2, "o": 3, "w": 4, "r": 5, "d": 6, "Ġ": 7}
        bpe = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, []))
        bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.save(str(tmp_path / "tokenizer.json"))
        settings = {
            "tokenizer_type": "huggingface",
            "tokenizer_options": TokenizerOptions(model=str(tmp_path)),
        }
    lines = ['{"text": "hello"}', '{"text": "caf\\ud83d world"}', '{"text": "world"}']
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    why = "key 'text' holds a lone surrogate U+D83D at character 3, which is not UTF-8"
    with pytest.raises(BadInputError, match=re.escape(f"line 2: {why}")):
        run(tmp_path, source, **settings)
    summary = run(tmp_path, source, skip_bad_lines=True, **settings)
    assert len(documents(summary.outputs["text"])) == 2
    assert summary.first_skipped == [f"{source}:2 ({why})"]


def test_an_id_beyond_64_bits_is_a_bad_line_not_an_overflow(tmp_path):
    lines = ['{"text": "1"}', '{"text": "3 99999999999999999999"}', '{"text": "2"}']
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    summary = run(tmp_path, source, skip_bad_lines=True, **NULL)
    assert documents(summary.outputs["text"]) == [[[1]], [[2]]]
    assert summary.first_skipped == [
        f"{source}:2 (token id 99999999999999999999 does not fit the output dtype uint16)"
    ]


@pytest.mark.parametrize("append_eod", [False, True])
def test_a_sentence_longer_than_a_sequence_holds_is_a_bad_line_not_a_wrapped_length(
    tmp_path, monkeypatch, append_eod
):
    # a sequence holds 2**31 - 1 tokens (an int32 length); four here, so a test can pass it
    from megafmt.preprocess import encoded, encoding

    monkeypatch.setattr(encoded, "MAX_SEQUENCE_TOKENS", 4)
    monkeypatch.setattr(encoding, "MAX_SEQUENCE_TOKENS", 4)
    long = "1 2 3 4" if append_eod else "1 2 3 4 5"  # five tokens, with the EOD or without
    lines = ['{"text": "1"}', json.dumps({"text": ["6 7 8 9", long]}), '{"text": "2"}']
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    # a forked worker encodes with the limit set here (a fork server's would import its own)
    settings = dict(append_eod=append_eod, workers=1, start_method="fork", **NULL)
    summary = run(tmp_path, source, skip_bad_lines=True, **settings)
    eod = [99] if append_eod else []
    assert documents(summary.outputs["text"]) == [[[1, *eod]], [[2, *eod]]]
    assert summary.first_skipped == [
        f"{source}:2 (a sentence of 5 tokens; a sequence holds at most 4 (its length is an "
        "int32 in the .idx))"
    ]
    with pytest.raises(BadInputError, match=r"in\.jsonl, line 2: a sentence of 5 tokens"):
        run(tmp_path, source, output="d", **settings)


def test_an_end_of_document_id_the_dtype_cannot_hold_is_refused_before_any_work(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "1"}])
    options = TokenizerOptions(vocab_size=100, null_eod_id=70000)
    with pytest.raises(PluginError, match="end-of-document id 70000 does not fit uint16"):
        run(tmp_path, source, append_eod=True, tokenizer_type="null", tokenizer_options=options)
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


def test_a_type_error_that_is_no_refused_text_stops_the_run(monkeypatch):
    """A TypeError is a bad line only for a text that is not UTF-8; any other is a fault to
    see, not a line to skip (with --skip-bad-lines it would empty the corpus)."""
    encoder = Encoder(EncodeSettings("bytes", TokenizerOptions(), ("text",), False, "uint16"))

    def broken(texts):
        raise TypeError("a bug")

    monkeypatch.setattr(encoder, "_encode_batch", broken)
    with pytest.raises(TypeError, match="a bug"):
        encoder.encode(Chunk("in.jsonl", 1, 0, b'{"text": "a"}', 13))


@pytest.mark.parametrize("name", ["pipe.jsonl", "pipe.jsonl.gz"])
def test_input_from_a_named_pipe_gives_the_bytes_of_the_file(tmp_path, name):
    """A pipe (``mkfifo``, a shell's ``<(zcat ...)``) is read as a stream: fsspec's local
    files seek to their end when opened, which a pipe refuses."""
    import threading

    text = "".join(json.dumps({"text": f"document {n} é"}) + "\n" for n in range(50)).encode()
    plain = tmp_path / "in.jsonl"
    plain.write_bytes(text)
    fifo = tmp_path / name
    os.mkfifo(fifo)
    payload = gzip.compress(text) if name.endswith(".gz") else text

    def write() -> None:
        with open(fifo, "wb") as writer:  # opens once the run opens the pipe
            writer.write(payload)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    assert main(["preprocess", "--input", str(fifo), "--output-prefix", str(tmp_path / "a")]) == 0
    writer.join(timeout=60)
    assert main(["preprocess", "--input", str(plain), "--output-prefix", str(tmp_path / "b")]) == 0
    for suffix in (".bin", ".idx"):
        piped = (tmp_path / f"a_text_document{suffix}").read_bytes()
        assert piped == (tmp_path / f"b_text_document{suffix}").read_bytes()


@pytest.mark.parametrize("partitions", [1, 2])
def test_a_key_that_cannot_be_written_replaces_no_other_key_s_output(tmp_path, partitions):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "1 2", "title": "3"}])
    old = run(tmp_path, source, json_keys=("text", "title"), **NULL).outputs
    os.remove(old["title"] + ".bin")
    os.mkdir(old["title"] + ".bin")  # the second key's place holds a folder
    kept = [old["text"] + ".bin", old["text"] + ".idx", old["title"] + ".idx"]
    before = {path: Path(path).read_bytes() for path in kept}
    changed = write_jsonl(tmp_path / "new.jsonl", [{"text": "4 5 6", "title": "7"}])
    with pytest.raises(OutputBlockedError, match=r"c_title_document.bin: found a directory where"):
        run(tmp_path, changed, json_keys=("text", "title"), partitions=partitions, **NULL)
    assert {path: Path(path).read_bytes() for path in kept} == before  # the old outputs
    assert sorted(os.listdir(tmp_path / "out")) == [  # no partial file left
        ".mega", "c_text_document.bin", "c_text_document.idx", "c_title_document.bin",
        "c_title_document.idx",
    ]  # fmt: skip
