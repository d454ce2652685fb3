"""The exact bytes of .idx files, built by hand from the spec and compared with what we write."""

import struct

import numpy
import pytest

from megafmt import FormatError, IndexedDatasetBuilder, get_bin_path, get_idx_path
from megafmt.format import HEADER_SIZE, Header, Layout

MAGIC = b"MMIDIDX\x00\x00"


def header(code: int, sequences: int, documents: int) -> bytes:
    return MAGIC + struct.pack("<Q", 1) + bytes([code]) + struct.pack("<QQ", sequences, documents)


def test_header_is_34_bytes_in_spec_order():
    assert HEADER_SIZE == 34
    assert Header(4, 2, 3).pack() == header(4, 2, 3)
    assert Header.unpack(header(8, 7, 9), "x.idx") == Header(8, 7, 9)


def test_written_index_matches_hand_built_bytes(make_corpus):
    prefix = make_corpus([[[1, 2, 3], [4, 5]], [[6]], [[], [7]]], dtype=numpy.uint16)
    lengths = [3, 2, 1, 0, 1]
    pointers = [0, 6, 10, 12, 12]  # uint16: two bytes per token
    documents = [0, 2, 3, 5]
    expected = (
        header(8, 5, 4)
        + struct.pack("<5i", *lengths)
        + struct.pack("<5q", *pointers)
        + struct.pack("<4q", *documents)
    )
    with open(get_idx_path(prefix), "rb") as stream:
        assert stream.read() == expected
    with open(get_bin_path(prefix), "rb") as stream:
        assert stream.read() == struct.pack("<7H", 1, 2, 3, 4, 5, 6, 7)


def test_multimodal_index_ends_with_one_mode_byte_per_sequence(tmp_path):
    prefix = str(tmp_path / "mm")
    builder = IndexedDatasetBuilder(get_bin_path(prefix), dtype=numpy.int32, multimodal=True)
    builder.add_item([1, 2], mode=3)
    builder.add_item([3], mode=-1)
    builder.end_document()
    builder.finalize(get_idx_path(prefix))
    expected = (
        header(4, 2, 2)
        + struct.pack("<2i", 2, 1)
        + struct.pack("<2q", 0, 8)
        + struct.pack("<2q", 0, 2)
        + struct.pack("<2b", 3, -1)
    )
    with open(get_idx_path(prefix), "rb") as stream:
        assert stream.read() == expected


def test_empty_corpus_is_a_header_and_one_document_index(make_corpus):
    prefix = make_corpus([], dtype=numpy.int32)
    with open(get_idx_path(prefix), "rb") as stream:
        assert stream.read() == header(4, 0, 1) + struct.pack("<q", 0)
    with open(get_bin_path(prefix), "rb") as stream:
        assert stream.read() == b""


@pytest.mark.parametrize(
    "data,message",
    [
        (b"", "truncated header: expected 34 bytes, the file is empty"),
        (header(4, 0, 1)[:20], "truncated header: expected 34 bytes, found only 20 bytes"),
        (b"MMIDIDY\x00\x00" + header(4, 0, 1)[9:], r"bad magic at offset 0: expected b'MMIDIDX"),
        (
            MAGIC + struct.pack("<Q", 2) + header(4, 0, 1)[17:],
            "version at offset 9: expected 1, found 2",
        ),
        (header(9, 0, 1), "dtype code at offset 17: unknown dtype code 9"),
    ],
)
def test_bad_headers_name_the_file_offset_and_values(data, message):
    with pytest.raises(FormatError, match=message) as caught:
        Header.unpack(data, "some/file.idx")
    assert str(caught.value).startswith("some/file.idx: ")


def test_layout_offsets_follow_the_spec():
    layout = Layout(sequence_count=5, document_count=4, has_modes=True)
    assert layout.lengths_offset == 34
    assert layout.pointers_offset == 34 + 20
    assert layout.document_indices_offset == 34 + 60
    assert layout.modes_offset == 34 + 60 + 32
    assert layout.nbytes == 34 + 60 + 32 + 5


def test_layout_refuses_sizes_that_do_not_match_the_counts():
    head = Header(4, 5, 4)
    plain, with_modes = 34 + 60 + 32, 34 + 60 + 32 + 5
    assert Layout.for_file(head, plain, "f", None).has_modes is False
    assert Layout.for_file(head, with_modes, "f", None).has_modes is True
    assert (
        Layout.for_file(head, with_modes, "f", False).has_modes is True
    )  # tolerated, like Megatron
    with pytest.raises(FormatError, match="multimodal=True but the file has no sequence_modes"):
        Layout.for_file(head, plain, "f", True)
    with pytest.raises(FormatError, match=f"needs {plain} bytes, but the file has 100"):
        Layout.for_file(head, 100, "f", None)
    with pytest.raises(
        FormatError, match=f"unexpected file size.*{with_modes} with sequence_modes"
    ):
        Layout.for_file(head, plain + 1, "f", None)
