"""Each invariant `verify` checks, broken on purpose, is reported with file, place and values."""

import errno
import io
import os
import struct

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from megafmt import get_bin_path, get_idx_path, verify

# 3 sequences (2 + 1 + 3 int32 tokens) in 2 documents: lengths at 34, pointers at 46,
# document indices at 70, the file is 94 bytes
DOCUMENTS = [[[1, 2], [3]], [[4, 5, 6]]]


def patch(path, offset, fmt, *values):
    with open(path, "r+b") as stream:
        stream.seek(offset)
        stream.write(struct.pack(fmt, *values))


def first(prefix, **kwargs):
    violations = verify(prefix, **kwargs)
    assert len(violations) == 1
    return violations[0]


# the checks that the sizes-only mode (`mega verify --remote`) makes too, with the same messages
sizes_only = pytest.mark.parametrize("sizes_only", [False, True], ids=["full", "sizes_only"])


@sizes_only
def test_a_good_corpus_has_no_violations(make_corpus, sizes_only):
    assert verify(make_corpus(DOCUMENTS), sizes_only=sizes_only) == []
    multimodal = make_corpus(DOCUMENTS, modes=[[1, 2], [3]], name="mm")
    assert verify(multimodal, multimodal=True, sizes_only=sizes_only) == []
    assert verify(make_corpus([], name="empty"), sizes_only=sizes_only) == []


@sizes_only
def test_missing_files(make_corpus, tmp_path, sizes_only):
    prefix = make_corpus(DOCUMENTS)
    os.remove(get_bin_path(prefix))
    violation = first(prefix, sizes_only=sizes_only)
    assert violation.check == "exists" and str(violation).endswith(
        "corpus.bin: token file not found"
    )
    none = str(tmp_path / "none")
    checks = [v.check for v in verify(none, stop_at_first=False, sizes_only=sizes_only)]
    assert checks == ["exists"] * 2


@sizes_only
@pytest.mark.parametrize("suffix, what", [(".bin", "token file"), (".idx", "index file")])
def test_a_directory_in_a_file_s_place_is_named_not_missing(make_corpus, sizes_only, suffix, what):
    prefix = make_corpus(DOCUMENTS)
    os.remove(prefix + suffix)
    os.mkdir(prefix + suffix)
    violation = first(prefix, sizes_only=sizes_only)
    assert violation.check == "exists" and str(violation).endswith(
        f"corpus{suffix}: found a directory where the {what} belongs"
    )


@sizes_only
def test_bad_header(make_corpus, sizes_only):
    prefix = make_corpus(DOCUMENTS)
    patch(get_idx_path(prefix), 9, "<Q", 7)
    violation = first(prefix, sizes_only=sizes_only)
    assert violation.check == "header"
    assert "unsupported version at offset 9: expected 1, found 7" in violation.message


def test_an_index_without_its_first_document_entry_says_what_is_missing(make_corpus):
    prefix = make_corpus([], name="none")  # 0 sequences, 1 document entry (the 0)
    with open(get_idx_path(prefix), "r+b") as stream:
        stream.seek(26)
        stream.write(struct.pack("<Q", 0))  # the document count: no entry at all
        stream.truncate(34)
    violation = first(prefix)
    assert violation.check == "documents"
    assert "document_indices is empty; expected at least its first entry, 0" in violation.message


@sizes_only
@pytest.mark.parametrize("size,found", [(0, "the file is empty"), (20, "found only 20 bytes")])
def test_truncated_header(make_corpus, sizes_only, size, found):
    prefix = make_corpus(DOCUMENTS)
    os.truncate(get_idx_path(prefix), size)
    violation = first(prefix, sizes_only=sizes_only)
    assert violation.check == "header"
    assert violation.message == f"truncated header: expected 34 bytes, {found}"


@sizes_only
def test_idx_size_must_match_its_counts(make_corpus, sizes_only):
    prefix = make_corpus(DOCUMENTS)
    os.truncate(get_idx_path(prefix), 90)
    violation = first(prefix, sizes_only=sizes_only)
    assert violation.check == "header"
    assert violation.message == (
        "file too short: the header at offset 18 says 3 sequences and 3 document indices, "
        "which needs 94 bytes, but the file has 90"
    )


@sizes_only
def test_modes_present_exactly_when_multimodal(make_corpus, sizes_only):
    plain = make_corpus(DOCUMENTS)
    message = first(plain, multimodal=True, sizes_only=sizes_only).message
    assert "no sequence_modes section" in message
    multimodal = make_corpus(DOCUMENTS, modes=[[0, 0], [0]], name="mm")
    violation = first(multimodal, multimodal=False, sizes_only=sizes_only)
    assert violation.check == "modes"
    assert (
        "sequence_modes section (3 bytes at offset 94), but the corpus is declared not "
        "multimodal" in violation.message
    )
    assert verify(multimodal, sizes_only=sizes_only) == []


@pytest.mark.parametrize(
    "offset,value,message",
    [
        (70, 1, r"document_indices[0] (byte 70): expected 0, found 1"),
        (
            78,
            4,
            r"document_indices[2] (byte 86): document indices must not decrease, found 3 "
            "after 4",
        ),
        (86, 4, r"document_indices[2] (byte 86): expected a sequence index in 0..3, found 4"),
        (
            86,
            2,
            r"document_indices[2] (byte 86): the last entry must be the sequence count 3, "
            "found 2",
        ),
    ],
)
def test_document_indices(make_corpus, offset, value, message):
    prefix = make_corpus(DOCUMENTS)
    patch(get_idx_path(prefix), offset, "<q", value)
    violation = first(prefix)
    assert violation.check == "documents"
    assert violation.message == message
    assert violation.path == get_idx_path(prefix)


def test_negative_length(make_corpus):
    prefix = make_corpus(DOCUMENTS)
    patch(get_idx_path(prefix), 38, "<i", -1)
    violation = first(prefix)
    assert violation.check == "lengths"
    assert violation.message == "sequence_lengths[1] (byte 38): expected a length >= 0, found -1"


def test_pointers_must_be_prefix_sums(make_corpus):
    prefix = make_corpus(DOCUMENTS)
    patch(get_idx_path(prefix), 62, "<q", 16)  # sequence 2 starts at 12 = (2 + 1) * 4
    violation = first(prefix)
    assert violation.check == "pointers"
    assert violation.message == (
        "sequence_pointers[2] (byte 62): expected 12 (the sum of the lengths before it times 4), "
        "found 16"
    )


@sizes_only
@pytest.mark.parametrize("size", [20, 28])
def test_bin_size_must_match(make_corpus, size, sizes_only):
    prefix = make_corpus(DOCUMENTS)
    os.truncate(get_bin_path(prefix), size)
    violation = first(prefix, sizes_only=sizes_only)
    assert violation.check == "bin_size"
    assert violation.message.startswith(
        f"expected 24 bytes (6 tokens of 4 bytes, as {prefix}.idx implies), found {size}"
    )


def test_all_violations_can_be_listed(make_corpus, monkeypatch):
    prefix = make_corpus(DOCUMENTS)
    patch(get_idx_path(prefix), 70, "<q", 1)
    patch(get_idx_path(prefix), 62, "<q", 16)
    os.truncate(get_bin_path(prefix), 20)
    checks = [v.check for v in verify(prefix, stop_at_first=False)]
    assert checks == ["documents", "pointers", "bin_size"]


def test_sizes_only_leaves_the_arrays_unread(make_corpus):
    prefix = make_corpus(DOCUMENTS)
    patch(get_idx_path(prefix), 70, "<q", 1)  # document_indices[0]
    patch(get_idx_path(prefix), 38, "<i", -1)  # sequence_lengths[1]
    assert verify(prefix, sizes_only=True) == []
    checks = [v.check for v in verify(prefix, stop_at_first=False)]
    assert checks == ["documents", "lengths", "pointers"]


def test_large_arrays_are_checked_across_chunks(make_corpus, monkeypatch):
    from megafmt import verification

    monkeypatch.setattr(verification, "CHUNK", 2)
    prefix = make_corpus([[[1, 2], [3], [4, 5, 6], [7]], [[8, 9]]])
    assert verify(prefix) == []
    patch(get_idx_path(prefix), 34 + 20 + 8 * 4, "<q", 28)  # pointer of sequence 4: 7 tokens = 28
    assert verify(prefix) == []
    patch(get_idx_path(prefix), 34 + 20 + 8 * 3, "<q", 20)  # sequence 3 starts at 24, not 20
    assert "sequence_pointers[3]" in first(prefix).message


class FailingRead(io.RawIOBase):
    """A file whose reads fail with EIO from byte ``fail_at`` on, as a bad disk's do."""

    def __init__(self, path: str, fail_at: int) -> None:
        self.stream, self.fail_at = open(path, "rb"), fail_at  # noqa: SIM115 (closed in close)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.stream.tell() >= self.fail_at:
            raise OSError(errno.EIO, "Input/output error")
        view = memoryview(buffer)[: self.fail_at - self.stream.tell()]
        return self.stream.readinto(view)

    def close(self) -> None:
        self.stream.close()
        super().close()


class BadDiskFileSystem(LocalFileSystem):
    """``baddisk://PATH``: the local file system, where a ``.bin`` fails to read at byte 8."""

    protocol = "baddisk"

    def _open(self, path, mode="rb", **kwargs):
        if path.endswith(".bin"):
            return FailingRead(self._strip_protocol(path), 8)
        return super()._open(path, mode, **kwargs)


def test_a_bin_that_cannot_be_read_is_named_with_the_failing_offset(
    make_corpus, tmp_path, monkeypatch
):
    monkeypatch.setenv("MEGA_CACHE_DIR", str(tmp_path / "cache"))
    fsspec.register_implementation("baddisk", BadDiskFileSystem, clobber=True)
    prefix = make_corpus(DOCUMENTS)
    assert verify(prefix) == []
    url = f"baddisk://{prefix}"
    violation = first(url)
    assert violation.check == "bin_read" and violation.path == f"{url}.bin"
    assert (
        violation.message == "cannot be read at byte 8 of 24: OSError: [Errno 5] Input/output error"
    )
    assert verify(url, sizes_only=True) == []  # sizes alone: no read


@pytest.mark.parametrize("chunk", [1, 5, 24, 1 << 20])
def test_the_bin_is_read_to_its_end_in_chunks(make_corpus, monkeypatch, chunk):
    from megafmt import verification

    monkeypatch.setattr(verification, "BIN_CHUNK", chunk)
    prefix = make_corpus(DOCUMENTS)
    assert list(verification.bin_read_violations(get_bin_path(prefix), 24)) == []
    # a file shorter than the size it was found with (it shrank between the two)
    short = list(verification.bin_read_violations(get_bin_path(prefix), 30))
    assert [str(v) for v in short] == [
        f"{get_bin_path(prefix)}: reading ended at byte 24, expected 30 bytes (the file shrank "
        "while it was read)"
    ]
