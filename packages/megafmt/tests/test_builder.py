import glob
import os
import signal
import subprocess
import sys
import textwrap

import numpy
import pytest

from megafmt import (
    FormatError,
    IndexedDataset,
    IndexedDatasetBuilder,
    TokenValueError,
    conversion,
    get_bin_path,
    get_idx_path,
)


def read_bytes(prefix):
    with open(get_bin_path(prefix), "rb") as b, open(get_idx_path(prefix), "rb") as i:
        return b.read(), i.read()


def test_add_item_and_add_document_write_the_same_bytes(tmp_path):
    documents = [[[1, 2, 3], [4, 5]], [[6]], [[], [7, 8]]]
    by_item = str(tmp_path / "item")
    builder = IndexedDatasetBuilder(get_bin_path(by_item), dtype=numpy.uint16)
    for document in documents:
        for sequence in document:
            builder.add_item(sequence)
        builder.end_document()
    builder.finalize(get_idx_path(by_item))

    by_document = str(tmp_path / "document")
    builder = IndexedDatasetBuilder(get_bin_path(by_document), dtype=numpy.uint16)
    for document in documents:
        tokens = [token for sequence in document for token in sequence]
        builder.add_document(tokens, [len(s) for s in document])
    builder.finalize(get_idx_path(by_document))
    assert read_bytes(by_item) == read_bytes(by_document)


@pytest.mark.parametrize(
    "item",
    [
        [1, 2, 3],
        (1, 2, 3),
        numpy.array([1, 2, 3], dtype=numpy.int64),
        numpy.array([1, 2, 3], dtype=numpy.uint8),
        numpy.array([1.0, 2.0, 3.0]),
        numpy.array([1, 0, 2, 0, 3, 0], dtype=numpy.uint16)[::2],
    ],
    ids=["list", "tuple", "int64", "uint8", "whole floats", "strided"],
)
def test_items_of_any_array_like_are_converted(tmp_path, item):
    prefix = str(tmp_path / "c")
    builder = IndexedDatasetBuilder(get_bin_path(prefix), dtype=numpy.uint16)
    builder.add_item(item)
    builder.end_document()
    builder.finalize(get_idx_path(prefix))
    numpy.testing.assert_array_equal(IndexedDataset(prefix)[0], [1, 2, 3])


def test_non_contiguous_and_multi_dimensional_items_are_flattened(tmp_path):
    prefix = str(tmp_path / "c")
    builder = IndexedDatasetBuilder(get_bin_path(prefix), dtype=numpy.int32)
    builder.add_item(numpy.arange(10, dtype=numpy.int32)[::3])
    builder.add_item(numpy.arange(6, dtype=numpy.int32).reshape(2, 3).T)
    builder.end_document()
    builder.finalize(get_idx_path(prefix))
    dataset = IndexedDataset(prefix)
    numpy.testing.assert_array_equal(dataset[0], [0, 3, 6, 9])
    numpy.testing.assert_array_equal(dataset[1], [0, 3, 1, 4, 2, 5])


@pytest.mark.parametrize(
    "dtype,item,message",
    [
        (
            numpy.uint16,
            [1, 70000],
            r"value 70000 at position 1 does not fit uint16 \(range 0..65535\)",
        ),
        (numpy.uint16, numpy.array([5, -1]), r"value -1 at position 1 does not fit uint16"),
        (numpy.int32, [2**31], r"value 2147483648 at position 0 does not fit int32"),
        (numpy.uint8, numpy.array([1, 256], dtype=numpy.uint16), "value 256 at position 1"),
        (numpy.int32, [1.5], r"value 1.5 at position 0 is not an integer"),
        (numpy.int32, [float("nan")], r"value nan at position 0 is not an integer"),
        (numpy.int32, ["a"], r"value 'a' at position 0 is not a number"),
        (numpy.uint16, ["12", "70000"], r"value 70000 at position 1 does not fit uint16"),
        (numpy.int32, ["7", "1.5"], r"value '1.5' at position 1 is not a number"),
        (numpy.int32, [1 + 1j], "expected numbers for int32, got complex128"),
        (numpy.int32, numpy.array([1, True], dtype=object), "value True at position 1 is not a"),
        (numpy.int64, [2**70], r"value 1180591620717411303424 at position 0 does not fit int64"),
        (numpy.int32, [1, None], r"value None at position 1 is not a number"),
    ],
)
def test_values_that_do_not_fit_are_refused_not_wrapped(tmp_path, dtype, item, message):
    builder = IndexedDatasetBuilder(str(tmp_path / "c.bin"), dtype=dtype)
    with pytest.raises(TokenValueError, match=message) as caught:
        builder.add_item(item)
    assert "c.bin, sequence 0" in str(caught.value)
    builder.add_item([1])  # the builder is still usable and nothing was written for the bad item
    builder.end_document()
    builder.finalize(str(tmp_path / "c.idx"))
    assert IndexedDataset(str(tmp_path / "c")).sequence_lengths.tolist() == [1]


def test_document_lengths_must_add_up(tmp_path):
    builder = IndexedDatasetBuilder(str(tmp_path / "c.bin"))
    with pytest.raises(TokenValueError, match="lengths add up to 4 tokens, but the document has 3"):
        builder.add_document([1, 2, 3], [2, 2])
    with pytest.raises(
        TokenValueError, match=r"sequence lengths must be integers in 0..2147483647"
    ):
        builder.add_document([1, 2, 3], [4, -1])
    builder.abort()


def test_modes_are_checked_and_default_to_zero(tmp_path):
    prefix = str(tmp_path / "mm")
    builder = IndexedDatasetBuilder(get_bin_path(prefix), multimodal=True)
    builder.add_document([1, 2, 3], [1, 2])
    builder.add_document([4], [1], modes=[5])
    with pytest.raises(TokenValueError, match="2 modes for 1 sequences"):
        builder.add_document([4], [1], modes=[1, 2])
    with pytest.raises(TokenValueError, match=r"modes must be integers in -128..127"):
        builder.add_item([1], mode=128)
    builder.finalize(get_idx_path(prefix))
    dataset = IndexedDataset(prefix, multimodal=True)
    assert dataset.sequence_modes.tolist() == [0, 0, 5]


def test_builder_properties_report_progress_so_far(tmp_path):
    builder = IndexedDatasetBuilder(str(tmp_path / "c.bin"), multimodal=True)
    builder.add_document([1, 2, 3], [1, 2], modes=[1, 2])
    builder.add_item([4], mode=3)
    assert builder.sequence_lengths.tolist() == [1, 2, 1]
    assert builder.document_indices.tolist() == [0, 2]
    assert builder.sequence_modes.tolist() == [1, 2, 3]
    builder.abort()


def test_unsupported_dtype_is_refused_before_writing(tmp_path):
    with pytest.raises(FormatError, match="complex128 has no .idx code"):
        IndexedDatasetBuilder(str(tmp_path / "c.bin"), dtype=numpy.complex128)
    assert os.listdir(tmp_path) == []


def test_nothing_appears_at_the_destination_before_finalize(tmp_path):
    prefix = str(tmp_path / "c")
    builder = IndexedDatasetBuilder(get_bin_path(prefix))
    builder.add_document([1, 2], [2])
    assert not IndexedDataset.exists(prefix)
    assert [name.endswith(".partial") for name in os.listdir(tmp_path)] == [True]
    builder.finalize(get_idx_path(prefix))
    assert sorted(os.listdir(tmp_path)) == ["c.bin", "c.idx"]
    with pytest.raises(ValueError, match="already finalized"):
        builder.add_item([1])
    with pytest.raises(ValueError, match="already finalized"):
        builder.add_document(numpy.array([1], dtype=numpy.int32), [1])


def test_abort_leaves_nothing(tmp_path):
    builder = IndexedDatasetBuilder(str(tmp_path / "c.bin"))
    builder.add_document([1, 2], [2])
    builder.abort()
    assert os.listdir(tmp_path) == []


def test_finalize_replaces_an_older_corpus(make_corpus, tmp_path):
    prefix = make_corpus([[[1, 2, 3]]])
    builder = IndexedDatasetBuilder(get_bin_path(prefix))
    builder.add_document([9], [1])
    builder.finalize(get_idx_path(prefix))
    assert IndexedDataset(prefix)[0].tolist() == [9]
    assert sorted(os.listdir(tmp_path)) == ["corpus.bin", "corpus.idx"]


def test_a_killed_build_leaves_no_complete_looking_pair(tmp_path):
    prefix = str(tmp_path / "c")
    script = textwrap.dedent(
        f"""
        import os, signal, numpy
        from megafmt import IndexedDatasetBuilder
        builder = IndexedDatasetBuilder({get_bin_path(prefix)!r})
        for _ in range(1000):
            builder.add_document(numpy.arange(1000), [1000])
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    result = subprocess.run([sys.executable, "-c", script])
    assert result.returncode == -signal.SIGKILL
    assert not os.path.exists(get_bin_path(prefix))
    assert not os.path.exists(get_idx_path(prefix))
    assert len(glob.glob(str(tmp_path / "c.bin.*.partial"))) == 1


def test_add_index_equals_building_everything_at_once(make_corpus, tmp_path):
    first = make_corpus([[[1, 2], [3]], [[4]]], name="a")
    second = make_corpus([[[5, 6, 7]], [[], [8]]], name="b")
    everything = make_corpus([[[1, 2], [3]], [[4]], [[5, 6, 7]], [[], [8]]], name="all")

    merged = str(tmp_path / "merged")
    builder = IndexedDatasetBuilder(get_bin_path(merged))
    builder.add_index(first)
    builder.add_index(second)
    builder.finalize(get_idx_path(merged))
    assert read_bytes(merged) == read_bytes(everything)


def test_add_index_keeps_modes(make_corpus, tmp_path):
    first = make_corpus([[[1], [2]]], modes=[[1, 2]], name="a")
    second = make_corpus([[[3]]], modes=[[3]], name="b")
    merged = str(tmp_path / "merged")
    builder = IndexedDatasetBuilder(get_bin_path(merged), multimodal=True)
    builder.add_index(first)
    builder.add_index(second)
    builder.finalize(get_idx_path(merged))
    assert IndexedDataset(merged, multimodal=True).sequence_modes.tolist() == [1, 2, 3]


def test_add_index_refuses_mismatched_inputs(make_corpus, tmp_path):
    uint16 = make_corpus([[[1]]], dtype=numpy.uint16, name="u16")
    plain = make_corpus([[[1]]], name="plain")
    builder = IndexedDatasetBuilder(str(tmp_path / "out.bin"))
    with pytest.raises(
        FormatError,
        match=r"u16.idx: dtype uint16 \(code 8\) differs from the "
        "builder's int32",
    ):
        builder.add_index(uint16)
    with open(get_bin_path(plain), "ab") as stream:
        stream.write(b"\0\0")
    with pytest.raises(FormatError, match=r"plain.bin: expected 4 bytes .*implies\), found 6"):
        builder.add_index(plain)
    builder.abort()
    multimodal = IndexedDatasetBuilder(str(tmp_path / "mm.bin"), multimodal=True)
    with pytest.raises(FormatError, match="multimodal=True but the file has no sequence_modes"):
        multimodal.add_index(uint16)
    multimodal.abort()


@pytest.mark.parametrize(
    "tokens,lengths",
    [
        (numpy.array([1, 2, 3], dtype=numpy.int32), [3]),  # the fast path
        (numpy.array([1, 2, 3], dtype=numpy.int64), [3]),
        ([1, 2, 3], [3]),
        (numpy.array([1, 2, 3], dtype=numpy.int32), (3,)),
        (numpy.array([1, 2, 3], dtype=numpy.int32), numpy.array([3])),
        (numpy.array([[1, 2, 3]], dtype=numpy.int32), [3]),
        (numpy.array([1, 0, 2, 0, 3], dtype=numpy.int32)[::2], [3]),
        (numpy.array([[1, 9], [2, 9], [3, 9]], dtype=numpy.int32)[:, 0], [3]),
    ],
)
def test_every_input_form_writes_the_same_document(tmp_path, tokens, lengths):
    prefix = str(tmp_path / "c")
    builder = IndexedDatasetBuilder(get_bin_path(prefix))
    builder.add_document(tokens, lengths)
    builder.add_document(numpy.array([4, 5], dtype=numpy.int32), [2])
    builder.finalize(get_idx_path(prefix))
    dataset = IndexedDataset(prefix)
    assert [dataset[0].tolist(), dataset[1].tolist()] == [[1, 2, 3], [4, 5]]
    assert dataset.document_indices.tolist() == [0, 1, 2]


@pytest.mark.parametrize("lengths", [[2], [4], [3.5], [-3], ["3.0"], [2**31]])
def test_the_fast_path_still_checks_lengths(tmp_path, lengths):
    builder = IndexedDatasetBuilder(str(tmp_path / "c.bin"))
    with pytest.raises(TokenValueError):
        builder.add_document(numpy.array([1, 2, 3], dtype=numpy.int32), lengths)
    builder.abort()


@pytest.mark.parametrize("lengths", [[3.0], [numpy.float32(3)], ["3"], numpy.array([1.0, 2.0])])
def test_lengths_numpy_converts_exactly_are_taken(tmp_path, lengths):
    """As megatron-core takes them (it writes numpy's int32 of each)."""
    prefix = str(tmp_path / "c")
    builder = IndexedDatasetBuilder(get_bin_path(prefix))
    builder.add_document(numpy.array([1, 2, 3], dtype=numpy.int32), lengths)
    builder.finalize(get_idx_path(prefix))
    assert IndexedDataset(prefix).sequence_lengths.sum() == 3


class HostTensor:
    """Stands in for a torch CPU tensor: it hands numpy its values only through ``__array__``."""

    def __init__(self, values):
        self._values = numpy.array(values, dtype=numpy.int64)

    def __array__(self, dtype=None, copy=None):
        return self._values


class DeviceTensor:
    """Stands in for a torch tensor numpy cannot take (on a GPU, or requiring grad), which
    ``detach().cpu()`` brings to host memory."""

    def __init__(self, values):
        self._host = HostTensor(values)

    def __array__(self, dtype=None, copy=None):
        raise RuntimeError("Can't call numpy() on Tensor that requires grad")

    def detach(self):
        return self

    def cpu(self):
        return self._host


# each form a user hands the builder, made from a list of ints and the corpus dtype
FORMS = {
    "dtype-array": lambda values, dtype: numpy.array(values, dtype=dtype),
    "int64-array": lambda values, dtype: numpy.array(values, dtype=numpy.int64),
    "list": lambda values, dtype: list(values),
    "tensor": lambda values, dtype: HostTensor(values),
    "device-tensor": lambda values, dtype: DeviceTensor(values),
}
BOUNDS = {numpy.uint16: (0, 65535), numpy.int32: (-(2**31), 2**31 - 1)}


@pytest.fixture(params=[False, True], ids=["same-value-cast", "range-check-then-cast"])
def numpy_without_same_value(request, monkeypatch):
    """Both ways of casting exactly: NumPy 2.4's ``same_value`` casting where this numpy has it,
    and the range check older numpy needs."""
    if request.param:
        monkeypatch.setattr(conversion, "SAME_VALUE_CASTING", False)
    elif not conversion.SAME_VALUE_CASTING:
        pytest.skip("this numpy has no same_value casting")


@pytest.mark.parametrize("method", ["add_document", "add_item"])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", BOUNDS, ids=lambda dtype: dtype.__name__)
def test_every_form_takes_the_whole_range_of_the_dtype(
    tmp_path, dtype, form, method, numpy_without_same_value
):
    low, high = BOUNDS[dtype]
    documents = [[low, 1, high], [7], [], list(range(300))]
    prefix = str(tmp_path / "c")
    builder = IndexedDatasetBuilder(get_bin_path(prefix), dtype=dtype)
    for values in documents:
        if method == "add_document":
            builder.add_document(FORMS[form](values, dtype), [len(values)])
        else:
            builder.add_item(FORMS[form](values, dtype))
            builder.end_document()
    builder.finalize(get_idx_path(prefix))
    data, _ = read_bytes(prefix)
    assert data == b"".join(numpy.array(values, dtype=dtype).tobytes() for values in documents)
    dataset = IndexedDataset(prefix)
    assert dataset.sequence_lengths.tolist() == [3, 1, 0, 300]
    assert dataset.document_indices.tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("method", ["add_document", "add_item"])
@pytest.mark.parametrize("form", [form for form in FORMS if form != "dtype-array"])
@pytest.mark.parametrize(
    "dtype,bad",
    [
        (numpy.uint16, 65536),
        (numpy.uint16, -1),
        (numpy.int32, 2**31),
        (numpy.int32, -(2**31) - 1),
    ],
    ids=["uint16-above", "uint16-below", "int32-above", "int32-below"],
)
def test_every_form_refuses_a_value_past_the_dtype_naming_it(
    tmp_path, dtype, bad, form, method, numpy_without_same_value
):
    builder = IndexedDatasetBuilder(str(tmp_path / "c.bin"), dtype=dtype)
    builder.add_document(numpy.array([5], dtype=dtype), [1])
    with pytest.raises(TokenValueError) as caught:
        if method == "add_document":
            builder.add_document(FORMS[form]([1, 2, bad, 3], dtype), [4])
        else:
            builder.add_item(FORMS[form]([1, 2, bad, 3], dtype))
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'c.bin'}, sequence 1: value {bad} at position 2 ")
    assert f"does not fit {numpy.dtype(dtype).name}" in message
    builder.finalize(str(tmp_path / "c.idx"))  # the refused document left no trace
    assert IndexedDataset(str(tmp_path / "c")).sequence_lengths.tolist() == [1]


@pytest.mark.parametrize(
    "make", [lambda values: numpy.array(values, dtype=numpy.float64), list], ids=["array", "list"]
)
def test_whole_floats_are_taken_and_fractions_refused(tmp_path, make, numpy_without_same_value):
    builder = IndexedDatasetBuilder(str(tmp_path / "c.bin"), dtype=numpy.uint16)
    builder.add_item(make([1, 2, 3.0]))
    with pytest.raises(TokenValueError, match=r"sequence 1: value 1.5 at position 2 is not an int"):
        builder.add_item(make([1, 2, 1.5]))
    builder.end_document()
    builder.finalize(str(tmp_path / "c.idx"))
    assert IndexedDataset(str(tmp_path / "c"))[0].tolist() == [1, 2, 3]


def test_digit_strings_are_token_ids_for_integer_dtypes(tmp_path):
    builder = IndexedDatasetBuilder(str(tmp_path / "c.bin"), dtype=numpy.uint16)
    builder.add_document(["12", "65535", "0"], [3])
    builder.add_document(numpy.array(["7", 8, 2], dtype=object), [3])
    builder.finalize(str(tmp_path / "c.idx"))
    dataset = IndexedDataset(str(tmp_path / "c"))
    assert [dataset[0].tolist(), dataset[1].tolist()] == [[12, 65535, 0], [7, 8, 2]]


def test_lists_of_many_distinct_lengths_are_packed_right(tmp_path, monkeypatch):
    monkeypatch.setattr(conversion, "MAX_PACKERS", 3)  # the packer cache starts over often
    documents = [list(range(length)) for length in (5, 1, 5, 2, 3, 4, 1, 6)]
    prefix = str(tmp_path / "c")
    builder = IndexedDatasetBuilder(get_bin_path(prefix), dtype=numpy.int32)
    for values in documents:
        builder.add_document(values, [len(values)])
    builder.finalize(get_idx_path(prefix))
    dataset = IndexedDataset(prefix)
    assert [dataset[i].tolist() for i in range(len(documents))] == documents


def test_add_index_refuses_a_damaged_index_naming_the_entry(make_corpus, tmp_path):
    corpus = make_corpus([[[1, 2]], [[3]], [[4, 5, 6]]], name="damaged")
    with open(get_idx_path(corpus), "r+b") as stream:  # document_indices [0, 1, 2, 3]
        stream.seek(-16, os.SEEK_END)
        stream.write(numpy.array([3, 1], dtype=numpy.int64).tobytes())  # [0, 1, 3, 1]
    builder = IndexedDatasetBuilder(str(tmp_path / "merged.bin"))
    with pytest.raises(
        FormatError, match=r"damaged.idx: document_indices\[3\] .*must not decrease"
    ):
        builder.add_index(corpus)
    builder.abort()


def test_finalize_into_a_directory_s_place_leaves_nothing_beside_it(tmp_path):
    from megafmt.errors import OutputBlockedError

    os.mkdir(tmp_path / "out.bin")
    builder = IndexedDatasetBuilder(str(tmp_path / "out.bin"))
    builder.add_document([1, 2, 3], [3])
    with pytest.raises(OutputBlockedError, match=r"out.bin: found a directory where the token"):
        builder.finalize(str(tmp_path / "out.idx"))
    assert isinstance(OutputBlockedError("x"), OSError)  # caught where an OSError is
    assert sorted(os.listdir(tmp_path)) == ["out.bin"]  # no partial file left


def test_add_index_names_a_directory_in_the_bin_s_place(make_corpus, tmp_path):
    from megafmt.errors import MissingFileError

    corpus = make_corpus([[[1, 2]]], name="folder")
    os.remove(get_bin_path(corpus))
    os.mkdir(get_bin_path(corpus))
    builder = IndexedDatasetBuilder(str(tmp_path / "merged.bin"))
    with pytest.raises(MissingFileError, match=r"folder.bin: found a directory where the token"):
        builder.add_index(corpus)
    builder.abort()
