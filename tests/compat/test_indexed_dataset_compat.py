"""megafmt against megatron-core's indexed_dataset: the same bytes written, the same values read,
in both directions."""

import signal
import subprocess
import sys
import textwrap

import numpy
import pytest
import torch
from megatron.core.datasets import indexed_dataset as megatron

import megafmt
from megafmt.cli.main import main as mega

# (name, dtype, documents as lists of sequences, modes per sequence or None)
CASES = [
    ("uint16", numpy.uint16, [[[1, 2, 3], [4, 5]], [[6]], [[65535, 0]]], None),
    ("int32-empty-seqs", numpy.int32, [[[], [-7, 2**31 - 1]], [[]], [[1, 2, 3, 4]]], None),
    ("int64", numpy.int64, [[[2**40, -1]], [[3]]], None),
    ("uint8", numpy.uint8, [[[255, 0, 1]]], None),
    ("int8", numpy.int8, [[[-128, 127]], [[0]]], None),
    ("int16", numpy.int16, [[[-300, 300]]], None),
    ("float32", numpy.float32, [[[0.5, -2.25]], [[1e6]]], None),
    ("float64", numpy.float64, [[[0.1, 1e300]]], None),
    ("multimodal", numpy.int32, [[[1, 2], [3]], [[4, 5, 6]], [[]]], [[0, 1], [2], [-3]]),
    ("no-documents", numpy.int32, [], None),
]
IDS = [case[0] for case in CASES]


def random_documents(seed, count=200):
    rng = numpy.random.default_rng(seed)
    return [
        [rng.integers(0, 50000, rng.integers(0, 40)).tolist() for _ in range(rng.integers(1, 4))]
        for _ in range(count)
    ]


CASES.append(("random-uint16", numpy.uint16, random_documents(0), None))
IDS.append("random-uint16")


def build(module, prefix, dtype, documents, modes, by_document):
    """Write ``documents`` with ``module``'s builder (megatron-core's or megafmt's): numpy arrays
    of the corpus dtype, except the torch tensors megatron-core's ``add_item`` requires."""
    as_item = torch.from_numpy if module is megatron else (lambda array: array)
    builder = module.IndexedDatasetBuilder(
        module.get_bin_path(prefix), dtype=dtype, multimodal=modes is not None
    )
    for number, document in enumerate(documents):
        document_modes = modes[number] if modes is not None else None
        if by_document:
            tokens = [token for sequence in document for token in sequence]
            builder.add_document(
                numpy.array(tokens, dtype=dtype),
                [len(sequence) for sequence in document],
                modes=document_modes,
            )
        else:
            for position, sequence in enumerate(document):
                mode = document_modes[position] if document_modes is not None else 0
                builder.add_item(as_item(numpy.array(sequence, dtype=dtype)), mode)
            builder.end_document()
    builder.finalize(module.get_idx_path(prefix))


def build_megatron(prefix, dtype, documents, modes, by_document):
    build(megatron, prefix, dtype, documents, modes, by_document)


def build_ours(prefix, dtype, documents, modes, by_document):
    build(megafmt, prefix, dtype, documents, modes, by_document)


def file_bytes(prefix):
    with open(prefix + ".bin", "rb") as data, open(prefix + ".idx", "rb") as index:
        return data.read(), index.read()


def open_megatron(prefix, multimodal, documents):
    # megatron-core's mmap reader cannot map the empty .bin of a corpus without tokens
    # ("cannot mmap an empty file"); its file reader can. megafmt's mmap reader handles both.
    has_tokens = any(len(sequence) for document in documents for sequence in document)
    return megatron.IndexedDataset(prefix, multimodal=multimodal, mmap=has_tokens)


def assert_same_reads(ours, theirs, multimodal):
    """Every accessor of megafmt's dataset equals megatron-core's on the same files."""
    assert len(ours) == len(theirs)
    for name in ("sequence_lengths", "sequence_pointers", "document_indices"):
        # megatron-core has no sequence_pointers property; its index reader has all three
        mine, reference = getattr(ours, name), getattr(theirs.index, name)
        assert mine.dtype == reference.dtype, name
        numpy.testing.assert_array_equal(mine, reference, err_msg=name)
    numpy.testing.assert_array_equal(ours.get_document_indices(), theirs.get_document_indices())
    assert ours.index.dtype is theirs.index.dtype
    if multimodal:
        numpy.testing.assert_array_equal(ours.sequence_modes, theirs.index.sequence_modes)
    for i in range(len(ours)):
        mine, reference = ours[i], theirs[i]
        if multimodal:
            assert mine[1] == reference[1]
            mine, reference = mine[0], reference[0]
        assert mine.dtype == reference.dtype
        numpy.testing.assert_array_equal(mine, reference)
        length = int(theirs.sequence_lengths[i])
        for offset, count in ((0, None), (length // 2, None), (length // 3, length // 3)):
            mine, reference = ours.get(i, offset, count), theirs.get(i, offset, count)
            if multimodal:
                mine, reference = mine[0], reference[0]
            numpy.testing.assert_array_equal(mine, reference)
    for start, stop in ((0, len(ours)), (1, len(ours) - 1), (len(ours) // 2, len(ours))):
        if stop <= start:
            continue
        mine, reference = ours[start:stop], theirs[start:stop]
        if multimodal:
            numpy.testing.assert_array_equal(mine[1], reference[1])
            mine, reference = mine[0], reference[0]
        assert len(mine) == len(reference)
        for a, b in zip(mine, reference, strict=True):
            numpy.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("by_document", [False, True], ids=["add_item", "add_document"])
@pytest.mark.parametrize("name,dtype,documents,modes", CASES, ids=IDS)
def test_files_are_byte_identical(tmp_path, name, dtype, documents, modes, by_document):
    build_megatron(str(tmp_path / "megatron"), dtype, documents, modes, by_document)
    build_ours(str(tmp_path / "ours"), dtype, documents, modes, by_document)
    assert file_bytes(str(tmp_path / "ours")) == file_bytes(str(tmp_path / "megatron"))


@pytest.mark.parametrize("mmap", [True, False], ids=["mmap", "file"])
@pytest.mark.parametrize("name,dtype,documents,modes", CASES, ids=IDS)
def test_megatron_files_read_back_equal(tmp_path, name, dtype, documents, modes, mmap):
    prefix = str(tmp_path / "megatron")
    build_megatron(prefix, dtype, documents, modes, by_document=False)
    multimodal = modes is not None
    theirs = open_megatron(prefix, multimodal, documents)
    ours = megafmt.IndexedDataset(prefix, multimodal=multimodal, mmap=mmap)
    assert_same_reads(ours, theirs, multimodal)


@pytest.mark.parametrize("name,dtype,documents,modes", CASES, ids=IDS)
def test_megatron_reads_our_files(tmp_path, name, dtype, documents, modes):
    prefix = str(tmp_path / "ours")
    build_ours(prefix, dtype, documents, modes, by_document=True)
    multimodal = modes is not None
    theirs = open_megatron(prefix, multimodal, documents)
    assert_same_reads(megafmt.IndexedDataset(prefix, multimodal=multimodal), theirs, multimodal)


@pytest.mark.parametrize(
    "name,dtype,documents,modes",
    [case for case in CASES if case[0] in ("uint16", "int32-empty-seqs", "multimodal")],
    ids=["uint16", "int32-empty-seqs", "multimodal"],
)
def test_add_index_merges_are_byte_identical(tmp_path, name, dtype, documents, modes):
    parts = []
    for part, split in enumerate((slice(0, 2), slice(2, None), slice(0, None))):
        prefix = str(tmp_path / f"part{part}")
        build_megatron(
            prefix, dtype, documents[split], modes[split] if modes else None, by_document=False
        )
        parts.append(prefix)
    multimodal = modes is not None
    for builder_module, out in ((megatron, "merged_megatron"), (megafmt, "merged_ours")):
        builder = builder_module.IndexedDatasetBuilder(
            str(tmp_path / f"{out}.bin"), dtype=dtype, multimodal=multimodal
        )
        builder.add_item(torch.from_numpy(numpy.array([7, 7], dtype=dtype)))
        builder.end_document()
        for prefix in parts:
            builder.add_index(prefix)
        builder.finalize(str(tmp_path / f"{out}.idx"))
    expected = file_bytes(str(tmp_path / "merged_megatron"))
    assert file_bytes(str(tmp_path / "merged_ours")) == expected

    # `mega merge` equals megatron-core's builder fed the same inputs through add_index
    builder = megatron.IndexedDatasetBuilder(
        str(tmp_path / "plain_megatron.bin"), dtype=dtype, multimodal=multimodal
    )
    for prefix in parts:
        builder.add_index(prefix)
    builder.finalize(str(tmp_path / "plain_megatron.idx"))
    assert mega(["merge", str(tmp_path / "plain_mega"), *parts]) == 0
    assert file_bytes(str(tmp_path / "plain_mega")) == file_bytes(str(tmp_path / "plain_megatron"))


def test_builder_takes_torch_tensors_like_megatron(tmp_path):
    tensors = [torch.arange(5, dtype=torch.int64), torch.tensor([3, 1], dtype=torch.int32)]
    ours = megafmt.IndexedDatasetBuilder(str(tmp_path / "ours.bin"), dtype=numpy.uint16)
    theirs = megatron.IndexedDatasetBuilder(str(tmp_path / "megatron.bin"), dtype=numpy.uint16)
    for tensor in tensors:
        ours.add_item(tensor)
        theirs.add_item(tensor)
    ours.add_document(torch.tensor([9, 8, 7]), [1, 2])
    theirs.add_document(torch.tensor([9, 8, 7]), [1, 2])
    ours.finalize(str(tmp_path / "ours.idx"))
    theirs.finalize(str(tmp_path / "megatron.idx"))
    assert file_bytes(str(tmp_path / "ours")) == file_bytes(str(tmp_path / "megatron"))


def test_builder_refuses_what_megatron_silently_wraps(tmp_path):
    theirs = megatron.IndexedDatasetBuilder(str(tmp_path / "megatron.bin"), dtype=numpy.uint16)
    theirs.add_item(torch.tensor([70000]))
    theirs.end_document()
    theirs.finalize(str(tmp_path / "megatron.idx"))
    theirs_dataset = megatron.IndexedDataset(str(tmp_path / "megatron"))  # kept alive: see below
    assert theirs_dataset[0].tolist() == [70000 - 65536]
    ours = megafmt.IndexedDatasetBuilder(str(tmp_path / "ours.bin"), dtype=numpy.uint16)
    with pytest.raises(megafmt.TokenValueError, match="value 70000 at position 0 does not fit"):
        ours.add_item(torch.tensor([70000]))
    ours.abort()


def test_arrays_outlive_the_dataset_where_megatron_crashes(tmp_path):
    prefix = str(tmp_path / "c")
    build_ours(prefix, numpy.int32, [[[1, 2, 3]], [[4]]], None, by_document=True)
    script = textwrap.dedent(
        """
        import sys
        module = sys.argv[1]
        if module == "megafmt":
            from megafmt import IndexedDataset
        else:
            from megatron.core.datasets.indexed_dataset import IndexedDataset
        print(IndexedDataset(sys.argv[2]).sequence_lengths.sum())
        """
    )
    ours = subprocess.run([sys.executable, "-c", script, "megafmt", prefix], capture_output=True)
    assert ours.returncode == 0 and ours.stdout.strip() == b"4"
    # megatron-core 0.16.1 unmaps the .idx when the dataset is collected, under the live array
    theirs = subprocess.run([sys.executable, "-c", script, "megatron", prefix], capture_output=True)
    assert theirs.returncode == -signal.SIGSEGV


# each form a user hands a builder, made from a list of ints and the corpus dtype
INPUT_FORMS = {
    "dtype-array": lambda values, dtype: numpy.array(values, dtype=dtype),
    "int64-array": lambda values, dtype: numpy.array(values, dtype=numpy.int64),
    "list": lambda values, dtype: list(values),
    "torch-int64": lambda values, dtype: torch.tensor(values, dtype=torch.int64),
}


@pytest.mark.parametrize("method", ["add_document", "add_item"])
@pytest.mark.parametrize("form", INPUT_FORMS)
@pytest.mark.parametrize("dtype", [numpy.uint16, numpy.int32], ids=["uint16", "int32"])
def test_every_input_form_writes_megatron_bytes(tmp_path, dtype, form, method):
    """The same token ids in each form give megatron-core's bytes. Its add_document takes every
    form; its add_item only torch tensors, so it gets the ids as one there."""
    info = numpy.iinfo(dtype)
    documents = [[info.min, 1, info.max], [7], []]
    documents += [[t for s in sequences for t in s] for sequences in random_documents(1, count=50)]
    make = INPUT_FORMS[form]
    for module, name in ((megatron, "megatron"), (megafmt, "ours")):
        builder = module.IndexedDatasetBuilder(str(tmp_path / f"{name}.bin"), dtype=dtype)
        for values in documents:
            if method == "add_document":
                builder.add_document(make(values, dtype), [len(values)])
            else:
                if module is megatron:
                    builder.add_item(torch.tensor(values, dtype=torch.int64))
                else:
                    builder.add_item(make(values, dtype))
                builder.end_document()
        builder.finalize(str(tmp_path / f"{name}.idx"))
    assert file_bytes(str(tmp_path / "ours")) == file_bytes(str(tmp_path / "megatron"))


@pytest.mark.parametrize(
    "dtype,bad", [(numpy.uint16, 65536), (numpy.uint16, -1), (numpy.int32, 2**31)]
)
def test_torch_tensors_past_the_dtype_are_refused_naming_the_value(tmp_path, dtype, bad):
    builder = megafmt.IndexedDatasetBuilder(str(tmp_path / "c.bin"), dtype=dtype)
    with pytest.raises(megafmt.TokenValueError, match=rf"sequence 0: value {bad} at position 1 "):
        builder.add_document(torch.tensor([3, bad]), [2])
    builder.abort()


def test_tensors_numpy_cannot_take_as_they_are_are_copied_to_the_host(tmp_path):
    """A tensor that requires grad (megatron-core refuses it) is written as its values."""
    values = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    ours = megafmt.IndexedDatasetBuilder(str(tmp_path / "ours.bin"), dtype=numpy.uint16)
    theirs = megatron.IndexedDatasetBuilder(str(tmp_path / "megatron.bin"), dtype=numpy.uint16)
    ours.add_document(values, [3])
    theirs.add_document(values.detach(), [3])
    ours.finalize(str(tmp_path / "ours.idx"))
    theirs.finalize(str(tmp_path / "megatron.idx"))
    assert file_bytes(str(tmp_path / "ours")) == file_bytes(str(tmp_path / "megatron"))
