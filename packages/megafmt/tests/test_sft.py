"""SFT data in megafmt: the jsonl line index, the SFT tokenizer's prompt formats, the
pre-tokenized form and ``mega preprocess --sft``."""

from __future__ import annotations

import json
import os
import pickle
import random
import sys
from pathlib import Path

import numpy
import pytest

pytest.importorskip("tokenizers")

from megafmt.cli.main import main
from megafmt.preprocess import BadInputError
from megafmt.protocols import ConversationSource
from megafmt.sft import (
    IGNORE_INDEX,
    JsonlLineIndex,
    SFTTokenizer,
    TokenizedConversations,
    get_loss_mask_path,
    split_conversations,
    write_tokenized,
)
from megafmt.sft import lines as lines_module
from megafmt.sft.testing import random_messages, write_sft_jsonl, write_sft_tokenizer

GOOD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return write_sft_tokenizer(tmp_path_factory.mktemp("sft-tokenizer"))


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def test_the_index_skips_blank_lines_and_keeps_line_numbers(tmp_path):
    path = write_lines(tmp_path / "a.jsonl", [json.dumps(GOOD), "", "  ", json.dumps(GOOD) + "\r"])
    index = JsonlLineIndex(path)
    assert len(index) == 2
    assert index.lines.tolist() == [1, 4]
    assert index[1] == GOOD["messages"]
    assert isinstance(index, ConversationSource)


def test_the_index_is_cached_beside_the_file_and_rebuilt_when_it_changes(tmp_path, monkeypatch):
    path = write_lines(tmp_path / "a.jsonl", [json.dumps(GOOD)] * 3)
    first = JsonlLineIndex(path)
    assert first.index_path == path + ".sftlines.npz"
    scans = []
    real_scan = lines_module._scan
    monkeypatch.setattr(lines_module, "_scan", lambda *a: scans.append(a) or real_scan(*a))
    assert len(JsonlLineIndex(path)) == 3 and not scans  # opened from the cache
    write_lines(tmp_path / "a.jsonl", [json.dumps(GOOD)] * 5)
    assert len(JsonlLineIndex(path)) == 5 and len(scans) == 1


def test_a_url_is_indexed_into_the_cache_folder(tmp_path, monkeypatch):
    import fsspec

    monkeypatch.setenv("MEGA_CACHE_DIR", str(tmp_path / "cache"))
    url = "memory://sft/remote.jsonl"
    with fsspec.open(url, "wb") as stream:
        stream.write(b"".join(json.dumps(GOOD).encode() + b"\n" for _ in range(4)))
    index = JsonlLineIndex(url)
    assert index.index_path.startswith(str(tmp_path / "cache"))
    assert len(index) == 4 and index[3] == GOOD["messages"]
    assert pickle.loads(pickle.dumps(index))[0] == GOOD["messages"]


BAD_LINES = [
    ("{not json", "not JSON"),
    ('{"text": "no messages"}', "no 'messages' key"),
    ('{"messages": [{"role": "robot", "content": "x"}]}', "role 'robot'"),
    (
        '{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}]}',
        "empty assistant turn",
    ),
    (
        '{"messages": [{"role": "system", "content": "x"}, {"role": "assistant", "content": "y"}]}',
        "after a 'system'",
    ),
]


@pytest.mark.parametrize(("line", "reason"), BAD_LINES)
def test_a_bad_line_is_an_error_naming_file_and_line(tmp_path, line, reason):
    path = write_lines(tmp_path / "bad.jsonl", [json.dumps(GOOD), line, json.dumps(GOOD)])
    with pytest.raises(BadInputError, match=rf"bad\.jsonl, line 2 .*{reason}"):
        JsonlLineIndex(path)


def test_bad_lines_are_counted_and_reported_when_skipped(tmp_path):
    path = write_lines(tmp_path / "bad.jsonl", [json.dumps(GOOD)] + [b for b, _ in BAD_LINES])
    with pytest.warns(UserWarning, match=r"skipped 5 bad lines \(line 2: not JSON"):
        index = JsonlLineIndex(path, skip_bad_lines=True)
    assert len(index) == 1 and index.bad_lines == 5
    with pytest.raises(BadInputError, match=r"line 2: not JSON .*5 bad lines in all"):
        JsonlLineIndex(path)  # the cached index remembers them


def test_conversations_split_at_each_system_turn():
    turns = [{"role": r, "content": r} for r in ("user", "assistant", "system", "user", "system")]
    assert [[t["role"] for t in c] for c in split_conversations(turns)] == [
        ["user", "assistant"],
        ["system", "user"],
        ["system"],
    ]


CONVERSATION = [
    {"role": "system", "content": " be brief "},
    {"role": "user", "content": "why /think"},
    {"role": "assistant", "content": "42\n"},
]


@pytest.mark.parametrize(
    ("prompt_format", "text", "answer"),
    [
        (
            "nemotron-h-aligned",
            "<SPECIAL_10>System\nbe brief\n"
            "<SPECIAL_11>User\nwhy /think\n<SPECIAL_11>Assistant\n42\n",
            "42\n",
        ),
        (
            "nemotron-nano-v2",
            "<SPECIAL_10>System\nbe brief\n"
            "<SPECIAL_11>User\nwhy\n<SPECIAL_11>Assistant\n42\n<SPECIAL_12>\n",
            "<SPECIAL_11>Assistant\n42\n<SPECIAL_12>\n",
        ),
        ("identity", " be brief why /think42\n", None),
    ],
)
def test_prompt_formats_render_and_mask_the_prompt(tokenizer_dir, prompt_format, text, answer):
    tokenizer = SFTTokenizer(str(tokenizer_dir), prompt_format)
    tokens, target = tokenizer.tokenize_conversation(CONVERSATION, True, False)
    assert tokenizer.detokenize(tokens) == text
    if answer is None:  # identity: everything takes loss
        numpy.testing.assert_array_equal(target, tokens)
        return
    # the assistant turn takes loss but for its format's prefix (3 tokens in nemotron-nano-v2)
    turn = tokenizer._encode(answer)
    prefix = tokenizer.format.assistant_prefix_len
    expected = numpy.full(len(tokens), IGNORE_INDEX)
    expected[len(tokens) - len(turn) + prefix :] = turn[prefix:]
    numpy.testing.assert_array_equal(tokens[len(tokens) - len(turn) :], turn)
    numpy.testing.assert_array_equal(target, expected)


def test_pads_and_an_unknown_prompt_format(tokenizer_dir):
    aligned = SFTTokenizer(str(tokenizer_dir))
    assert aligned.pad == aligned._encoder.token_to_id("<SPECIAL_233>")
    assert aligned.eod == aligned._encoder.token_to_id("</s>")
    assert SFTTokenizer(str(tokenizer_dir), "identity").pad == aligned._encoder.token_to_id("<unk>")
    with pytest.raises(LookupError, match="unknown SFT prompt format 'chatml'; available: default"):
        SFTTokenizer(str(tokenizer_dir), "chatml")


def test_the_pretokenized_corpus_gives_the_jsonl_s_conversations(tmp_path, tokenizer_dir):
    path = str(tmp_path / "chat.jsonl")
    write_sft_jsonl(path, 40, seed=3)
    tokenizer = SFTTokenizer(str(tokenizer_dir))
    lines = JsonlLineIndex(path)
    assert write_tokenized(lines, tokenizer, str(tmp_path / "chat")) > 40
    stored = TokenizedConversations(str(tmp_path / "chat"))
    assert len(stored) == len(lines) == 40
    for idx in range(40):
        expected = lines.tokenized_conversations(idx, tokenizer)
        found = stored.tokenized_conversations(idx)
        assert len(found) == len(expected)
        for (tokens, targets), (want_tokens, want_targets) in zip(found, expected, strict=True):
            numpy.testing.assert_array_equal(tokens, want_tokens)
            numpy.testing.assert_array_equal(targets, want_targets)


def test_a_loss_mask_of_the_wrong_size_is_refused(tmp_path, tokenizer_dir):
    path = str(tmp_path / "chat.jsonl")
    write_sft_jsonl(path, 3)
    write_tokenized(JsonlLineIndex(path), SFTTokenizer(str(tokenizer_dir)), str(tmp_path / "c"))
    mask = get_loss_mask_path(str(tmp_path / "c"))
    with open(mask, "ab") as stream:
        stream.write(b"\x01")
    with pytest.raises(ValueError, match=r"c\.lossmask: expected \d+ bytes .* found \d+"):
        TokenizedConversations(str(tmp_path / "c"))


@pytest.fixture
def small_pool(monkeypatch):
    from megafmt.readers import pool

    small = pool.ReaderPool(2)
    monkeypatch.setattr(pool, "POOL", small)
    return small


def open_descriptors():
    return len(os.listdir("/proc/self/fd"))


on_linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@on_linux
def test_a_blend_of_jsonl_files_holds_a_bounded_number_of_descriptors(tmp_path, small_pool):
    written = [write_sft_jsonl(tmp_path / f"c{i}.jsonl", 3, seed=i) for i in range(6)]
    indices = [JsonlLineIndex(str(tmp_path / f"c{i}.jsonl")) for i in range(6)]
    before = open_descriptors()
    for _ in range(2):
        for index, records in zip(indices, written, strict=True):
            assert [index[i] for i in range(3)] == records  # a released descriptor reopens
            assert sum(index._descriptor is not None for index in indices) <= 2
            assert open_descriptors() <= before + 2
    assert len(small_pool) == 2


def test_a_released_descriptor_stays_open_while_a_read_holds_it(tmp_path, small_pool):
    records = write_sft_jsonl(tmp_path / "c.jsonl", 2)
    index = JsonlLineIndex(str(tmp_path / "c.jsonl"))
    assert index[0] == records[0]
    held = index._descriptor
    index.release_reader()  # as the pool does, from another dataset's open
    assert os.pread(held.fd, 1, 0) == b"{"
    fd = held.fd
    del held  # the last reference: closed now
    with pytest.raises(OSError):
        os.fstat(fd)
    assert index[1] == records[1]


@on_linux
def test_a_blend_of_pretokenized_corpora_holds_a_bounded_number_of_masks(
    tmp_path, tokenizer_dir, small_pool
):
    tokenizer = SFTTokenizer(str(tokenizer_dir))
    prefixes = []
    for i in range(5):
        write_sft_jsonl(tmp_path / f"c{i}.jsonl", 3, seed=i)
        prefixes.append(str(tmp_path / f"c{i}"))
        write_tokenized(JsonlLineIndex(str(tmp_path / f"c{i}.jsonl")), tokenizer, prefixes[-1])
    before = open_descriptors()
    corpora = [TokenizedConversations(prefix) for prefix in prefixes]
    assert sum(corpus._mask is not None for corpus in corpora) == 2
    expected = [
        [TokenizedConversations(prefix).tokenized_conversations(i) for i in range(3)]
        for prefix in prefixes
    ]
    for _ in range(2):
        for corpus, wanted in zip(corpora, expected, strict=True):
            for i in range(3):
                for (tokens, targets), (want_tokens, want_targets) in zip(
                    corpus.tokenized_conversations(i), wanted[i], strict=True
                ):
                    numpy.testing.assert_array_equal(tokens, want_tokens)
                    numpy.testing.assert_array_equal(targets, want_targets)
            assert sum(corpus._mask is not None for corpus in corpora) <= 2
            assert open_descriptors() <= before + 2
    # a mask changed while its reader was released is refused when it reopens: grown, or
    # replaced by another of the same size
    corpora[0].release_reader()
    mask = get_loss_mask_path(prefixes[0])
    with open(mask, "ab") as stream:
        stream.write(b"\x01")
    with pytest.raises(ValueError, match=r"c0\.lossmask: reopened with \d+ bytes, expected"):
        corpora[0].tokenized_conversations(0)
    copy = pickle.loads(pickle.dumps(corpora[1]))  # as a loader worker receives it
    assert copy.tokenized_conversations(0)
    corpora[1].release_reader()
    copy.release_reader()
    mask = get_loss_mask_path(prefixes[1])
    replacement = tmp_path / "other.lossmask"
    replacement.write_bytes(bytes(os.path.getsize(mask)))  # every token unmasked
    os.replace(replacement, mask)
    for corpus in (corpora[1], copy):
        with pytest.raises(ValueError, match=r"c1\.lossmask: replaced or written since"):
            corpus.tokenized_conversations(0)


def test_a_file_that_cannot_be_opened_leaves_no_descriptor_behind(tmp_path):
    from megafmt.readers.pool import OpenDescriptor

    with pytest.raises(FileNotFoundError):  # and nothing for __del__ to report
        OpenDescriptor(str(tmp_path / "missing.jsonl"))


def test_mega_preprocess_sft(tmp_path, tokenizer_dir, capsys):
    path = str(tmp_path / "chat.jsonl")
    records = write_sft_jsonl(path, 10, seed=5)
    with open(path, "a") as stream:
        stream.write("{broken\n")
    out = str(tmp_path / "out")
    argv = ["preprocess", "--sft", "--input", path, "--output-prefix", out]
    argv += [
        "--tokenizer-model",
        str(tokenizer_dir),
        "--sft-tokenizer-prompt-format",
        "nemotron-nano-v2",
    ]
    assert main(argv) != 0
    assert "chat.jsonl, line 11 (byte" in capsys.readouterr().err
    assert main([*argv, "--skip-bad-lines"]) == 0
    assert "10 lines" in capsys.readouterr().out
    stored = TokenizedConversations(out + "_messages_document")
    tokenizer = SFTTokenizer(str(tokenizer_dir), "nemotron-nano-v2")
    conversations = stored.tokenized_conversations(4)
    assert len(conversations) == len(split_conversations(records[4]))
    assert "<SPECIAL_11>Assistant" in tokenizer.detokenize(conversations[0][0])


def test_random_messages_are_valid_lines():
    from megafmt.sft import messages_problem

    rng = random.Random(0)
    assert all(messages_problem(random_messages(rng)) is None for _ in range(200))


def test_mega_dump_shows_prompt_and_loss_runs_decoded(tmp_path, tokenizer_dir, capsys):
    path = str(tmp_path / "chat.jsonl")
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "why"},
        {"role": "assistant", "content": "42"},
    ]
    path_text = json.dumps({"messages": messages}) + "\n"
    (tmp_path / "chat.jsonl").write_text(path_text)
    model = ["--tokenizer-model", str(tokenizer_dir)]
    assert main(["dump", path, "--doc", "0", *model]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0].startswith("line 0 (line 1 of ") and "1 conversations" in shown[0]
    assert shown[2].startswith("    prompt [    0,") and "<SPECIAL_11>Assistant\\n'" in shown[2]
    assert shown[3].startswith("    loss   [") and shown[3].endswith("'42\\n'")
    prefix = str(tmp_path / "out")
    assert main(["preprocess", "--sft", "--input", path, "--output-prefix", prefix, *model]) == 0
    capsys.readouterr()
    assert main(["dump", prefix + "_messages_document", "--seq", "0", *model]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == shown[1:]
    assert main(["dump", prefix + "_messages_document", "--doc", "0", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    tokens, targets = record["conversations"][0]["tokens"], record["conversations"][0]["targets"]
    assert targets[-1] == tokens[-1] and targets[0] == IGNORE_INDEX
    # Megatron's spelling of --sft: --tokenizer-type SFTTokenizer, the same files
    again = str(tmp_path / "again")
    typed = ["--tokenizer-type", "SFTTokenizer", "--input", path, "--output-prefix", again]
    assert main(["preprocess", *typed, *model]) == 0
    for suffix in (".bin", ".idx"):
        name = f"_messages_document{suffix}"
        assert Path(again + name).read_bytes() == Path(prefix + name).read_bytes()


def test_a_parallel_scan_over_byte_ranges_equals_one_pass(tmp_path):
    from megafmt.sft.scan import cut_points, scan

    path = tmp_path / "many.jsonl"
    records = [json.dumps(GOOD) if i % 7 else "" for i in range(300)]
    records[150] = "{broken"
    records[250] = '{"messages": []}'
    write_lines(path, records)
    size = path.stat().st_size
    points = cut_points(str(path), size, range_bytes=500)
    assert len(points) > 10 and points[-1] == size
    data = path.read_bytes()
    assert all(data[p - 1 : p] == b"\n" for p in points[1:-1])  # every cut at a line start
    one, bad_one, shown_one = scan(str(path), size, True, workers=1, range_bytes=1 << 30)
    many, bad_many, shown_many = scan(str(path), size, True, workers=2, range_bytes=500)
    assert (
        (bad_one, shown_one)
        == (bad_many, shown_many)
        == (2, [[151, shown_one[0][1]], [251, shown_one[1][1]]])
    )
    for key in one:
        numpy.testing.assert_array_equal(one[key], many[key])
    assert len(one["lines"]) == 300 - 43 - 2 and one["lines"][0] == 2
    with pytest.raises(BadInputError, match=r"many\.jsonl, line 151 \(byte \d+\): not JSON"):
        scan(str(path), size, False, workers=2, range_bytes=500)


def test_an_index_checked_on_read_finds_the_same_lines_and_checks_each_read(tmp_path):
    lines = [json.dumps(GOOD), "", "\r", json.dumps(GOOD) + "\r", "{broken", json.dumps(GOOD)]
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join(lines))  # no newline after the last line
    fast = JsonlLineIndex(str(path), check="on_read")
    assert not fast.checked and fast.lines.tolist() == [1, 4, 5, 6]
    assert fast[1] == GOOD["messages"] and fast[3] == GOOD["messages"]
    with pytest.raises(BadInputError, match=r"a\.jsonl, line 5 \(byte \d+\): not JSON"):
        fast[2]
    with pytest.raises(ValueError, match="skip_bad_lines needs check='all'"):
        JsonlLineIndex(str(path), skip_bad_lines=True, check="on_read")
    with pytest.warns(UserWarning, match="skipped 1 bad lines"):
        full = JsonlLineIndex(str(path), skip_bad_lines=True)  # the cached index is checked now
    assert full.checked and full.lines.tolist() == [1, 4, 6]
    with pytest.raises(BadInputError, match="line 5"):  # the checked index knows it is bad
        JsonlLineIndex(str(path), check="on_read")
    numpy.testing.assert_array_equal(fast.starts[[0, 1, 3]], full.starts)
    numpy.testing.assert_array_equal(fast.ends[[0, 1, 3]], full.ends)
