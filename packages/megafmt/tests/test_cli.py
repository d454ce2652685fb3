import json
import os
import shutil
import subprocess
import sys

import numpy
import pytest

from megafmt import IndexedDataset, get_bin_path, get_idx_path
from megafmt.cli.main import main

DOCUMENTS = [[[1, 2, 3], [4, 5]], [[6]], [[], [7, 8, 9, 10]], [[11, 12]]]


def mega(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_info_reports_counts_and_percentiles(make_corpus, capsys):
    prefix = make_corpus(DOCUMENTS, dtype=numpy.uint16)
    status, out, _ = mega(capsys, "info", prefix, "--json")
    assert status == 0
    (report,) = json.loads(out)
    assert report["dtype"] == "uint16" and report["dtype_code"] == 8
    assert (report["documents"], report["sequences"], report["tokens"]) == (4, 6, 12)
    assert (report["idx_bytes"], report["bin_bytes"]) == (146, 24)
    assert report["multimodal"] is False
    # sequence lengths 3 2 1 0 4 2; document lengths 5 1 4 2 (by hand)
    assert report["sequence_lengths"] == {
        "count": 6,
        "mean": 2.0,
        "min": 0,
        "max": 4,
        "percentiles": {"50": 2, "90": 4, "99": 4},
    }
    assert report["document_lengths"]["max"] == 5 and report["document_lengths"]["min"] == 1
    status, out, _ = mega(capsys, "info", prefix)
    assert "uint16 (code 8)" in out and "tokens           12" in out


@pytest.mark.parametrize("suffix, what", [(".bin", "token file"), (".idx", "index file")])
def test_info_names_a_directory_in_a_file_s_place(make_corpus, capsys, suffix, what):
    prefix = make_corpus(DOCUMENTS)
    os.remove(prefix + suffix)
    os.mkdir(prefix + suffix)
    status, _, err = mega(capsys, "info", prefix)
    assert status == 1 and f"{prefix}{suffix}: found a directory where the {what} belongs" in err


def test_verify_exit_status(make_corpus, capsys):
    prefix = make_corpus(DOCUMENTS)
    assert mega(capsys, "verify", prefix)[:2] == (0, f"OK {prefix}\n")
    os.truncate(get_bin_path(prefix), 8)
    status, _, err = mega(capsys, "verify", prefix)
    assert status == 1
    assert err.startswith(f"FAIL [bin_size] {prefix}.bin: expected 48 bytes")


def test_dump_a_document_or_a_sequence(make_corpus, capsys):
    prefix = make_corpus(DOCUMENTS)
    assert mega(capsys, "dump", prefix, "--doc", "0")[1] == "1 2 3\n4 5\n"
    assert mega(capsys, "dump", prefix, "--doc", "-1")[1] == "11 12\n"
    assert mega(capsys, "dump", prefix, "--seq", "4")[1] == "7 8 9 10\n"
    out = mega(capsys, "dump", prefix, "--doc", "2", "--json")[1]
    assert json.loads(out) == {"sequences": [[], [7, 8, 9, 10]], "document": 2}
    status, _, err = mega(capsys, "dump", prefix, "--doc", "4")
    assert status == 1 and "document 4 out of range: the corpus has 4" in err


def test_dump_shows_modes_of_multimodal_corpora(make_corpus, capsys):
    prefix = make_corpus([[[1], [2]]], modes=[[3, 4]])
    out = mega(capsys, "dump", prefix, "--doc", "0", "--json")[1]
    assert json.loads(out) == {"sequences": [[1], [2]], "document": 0, "modes": [3, 4]}


def split_into_a_folder(make_corpus, tmp_path):
    """DOCUMENTS as two corpora in a folder, the second half's named first."""
    parts = tmp_path / "parts"
    parts.mkdir()
    for name, documents in (("b", DOCUMENTS[2:]), ("a", DOCUMENTS[:2])):
        prefix = make_corpus(documents, name=name)
        for path in (get_bin_path(prefix), get_idx_path(prefix)):
            shutil.move(path, parts)
    return parts


def test_merge_prefixes_and_directories(make_corpus, tmp_path, capsys):
    parts = split_into_a_folder(make_corpus, tmp_path)
    (parts / "notes.txt").write_text("ignored")
    whole = make_corpus(DOCUMENTS, name="whole")
    out_prefix = str(tmp_path / "merged")
    status, _, err = mega(capsys, "merge", out_prefix, str(parts))
    assert status == 0, err
    assert "merged 2 corpora" in err and "4 documents, 6 sequences, 12 tokens" in err
    for suffix in (".bin", ".idx"):
        with open(out_prefix + suffix, "rb") as a, open(whole + suffix, "rb") as b:
            assert a.read() == b.read()

    status, _, err = mega(capsys, "merge", out_prefix, whole)
    assert status == 1 and "exists; pass overwrite (--force)" in err
    assert mega(capsys, "merge", "--force", out_prefix, whole, whole)[0] == 0
    assert len(IndexedDataset(out_prefix)) == 12


def test_merge_refuses_a_directory_with_an_unpaired_file(make_corpus, tmp_path, capsys):
    (tmp_path / "lone.bin").write_bytes(b"")
    status, _, err = mega(capsys, "merge", str(tmp_path / "out"), str(tmp_path))
    assert status == 1 and "lone.bin has no .idx beside it" in err


def test_merge_refuses_writing_over_an_input(make_corpus, capsys):
    prefix = make_corpus(DOCUMENTS)
    status, _, err = mega(capsys, "merge", "--force", prefix, prefix)
    assert status == 1 and "the output is also an input" in err


def test_unknown_command_names_its_provider(capsys, monkeypatch):
    from megafmt.cli.main import COMMANDS

    monkeypatch.setitem(COMMANDS._providers, "frobnicate", "it is provided by megafrob")
    status, _, err = mega(capsys, "frobnicate", "now")
    assert status == 2
    assert "unknown mega command 'frobnicate'; available: " in err
    assert "dump, " in err and "info, merge" in err
    assert err.rstrip().endswith("it is provided by megafrob")
    assert mega(capsys, "infoo")[2].endswith("(did you mean 'info'?)\n")


def test_console_script_is_installed(make_corpus):
    prefix = make_corpus(DOCUMENTS)
    script = os.path.join(os.path.dirname(sys.executable), "mega")
    result = subprocess.run([script, "--help"], capture_output=True, text=True, check=True)
    for command in ("info", "verify", "dump", "merge"):
        assert command in result.stdout
    result = subprocess.run([script, "verify", prefix], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout == f"OK {prefix}\n"


def test_merge_of_a_multimodal_corpus_keeps_modes(make_corpus, tmp_path, capsys):
    prefix = make_corpus([[[1], [2]]], modes=[[3, 4]])
    out_prefix = str(tmp_path / "out")
    assert mega(capsys, "merge", out_prefix, prefix, prefix)[0] == 0
    assert IndexedDataset(out_prefix, multimodal=True).sequence_modes.tolist() == [3, 4, 3, 4]


@pytest.mark.parametrize("args", [["verify"], ["dump", "x"]])
def test_usage_errors_exit_2(capsys, args):
    with pytest.raises(SystemExit) as caught:
        main(args)
    assert caught.value.code == 2


def test_merge_takes_merge_datasets_flags(make_corpus, tmp_path, capsys):
    parts = split_into_a_folder(make_corpus, tmp_path)
    whole = make_corpus(DOCUMENTS, name="whole")
    out_prefix = str(tmp_path / "merged")
    arguments = ["--input", str(parts), "--output-prefix", out_prefix, "--multimodal"]
    status, _, err = mega(capsys, "merge", *arguments[:4])
    assert status == 0, err
    for suffix in (".bin", ".idx"):
        with open(out_prefix + suffix, "rb") as a, open(whole + suffix, "rb") as b:
            assert a.read() == b.read()
    status, _, err = mega(capsys, "merge")
    assert status == 1 and "needs an output and inputs" in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--ray-address", "127.0.0.1:1"], "--ray-address take effect with --ray only"),
        (["--sft", "--ray"], "--ray and --find-optimal-num-workers preprocess plain text only"),
    ],
)
def test_preprocess_refuses_flags_it_would_ignore(tmp_path, extra, message):
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "a"}\n')
    args = ["preprocess", "--input", str(source), "--output-prefix", str(tmp_path / "out")]
    with pytest.raises(SystemExit, match=message):
        main([*args, "--tokenizer-type", "NullTokenizer", "--vocab-size", "10", *extra])
    assert not list(tmp_path.glob("out*"))
