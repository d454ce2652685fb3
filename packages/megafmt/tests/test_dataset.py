import gc
import multiprocessing
import os
import pickle
import struct

import numpy
import pytest

from megafmt import (
    FormatError,
    IndexedDataset,
    MissingFileError,
    PluginError,
    get_bin_path,
    get_idx_path,
)

#: multi-sequence documents and an empty sequence
DOCUMENTS = [[[1, 2, 3], [4, 5]], [[6]], [[], [7, 8, 9, 10]], [[11, 12]]]
SEQUENCES = [sequence for document in DOCUMENTS for sequence in document]


@pytest.fixture(params=["mmap", "file"])
def dataset(request, make_corpus):
    return IndexedDataset(make_corpus(DOCUMENTS), mmap=request.param == "mmap")


def test_reader_follows_the_mmap_flag(make_corpus):
    prefix = make_corpus(DOCUMENTS)
    assert IndexedDataset(prefix).reader_name == "mmap"
    assert IndexedDataset(prefix, mmap=False).reader_name == "file"
    assert IndexedDataset(prefix, reader="file").reader_name == "file"


def test_every_accessor(dataset):
    assert len(dataset) == len(SEQUENCES)
    assert dataset.sequence_lengths.tolist() == [len(s) for s in SEQUENCES]
    assert dataset.sequence_pointers.tolist() == [0, 12, 20, 24, 24, 40]
    assert dataset.document_indices.tolist() == [0, 2, 3, 5, 6]
    assert dataset.get_document_indices().tolist() == [0, 2, 3, 5, 6]
    assert dataset.sequence_modes is None
    assert dataset.index.dtype is numpy.int32
    for i, sequence in enumerate(SEQUENCES):
        assert dataset[i].tolist() == sequence
        assert dataset[numpy.int64(i)].tolist() == sequence
        assert dataset.get(i).tolist() == sequence
    assert dataset[-1].tolist() == SEQUENCES[-1]


def test_get_reads_a_token_range_of_one_sequence(dataset):
    assert dataset.get(4, offset=1).tolist() == [8, 9, 10]
    assert dataset.get(4, offset=1, length=2).tolist() == [8, 9]
    assert dataset.get(4, offset=4).tolist() == []
    assert dataset.get(3).tolist() == []
    with pytest.raises(IndexError, match=r"tokens \[3, 5\) are outside sequence 4 .* has 4 tokens"):
        dataset.get(4, offset=3, length=2)
    with pytest.raises(IndexError, match=r"tokens \[-1, 1\)"):
        dataset.get(4, offset=-1, length=2)


@pytest.mark.parametrize(
    "window", [slice(0, 6), slice(1, 4), slice(2, 3), slice(None), slice(-2, None), slice(3, 3)]
)
def test_contiguous_slices(dataset, window):
    assert [s.tolist() for s in dataset[window]] == SEQUENCES[window]


def test_bad_indices(dataset):
    with pytest.raises(ValueError, match="must be contiguous"):
        dataset[::2]
    with pytest.raises(TypeError, match="integers or contiguous slices, got str"):
        dataset["1"]
    with pytest.raises(
        IndexError, match=r"sequence index 6 out of range for 6 sequences in .*\.idx"
    ):
        dataset[6]
    with pytest.raises(IndexError):
        dataset[-7]


def test_set_document_indices_replaces_them_in_memory(dataset):
    dataset.set_document_indices(numpy.array([0, 6]))
    assert dataset.document_indices.tolist() == [0, 6]


def test_multimodal_returns_modes(make_corpus):
    prefix = make_corpus([[[1], [2, 3]], [[4]]], modes=[[1, 2], [3]])
    dataset = IndexedDataset(prefix, multimodal=True)
    tokens, mode = dataset[1]
    assert tokens.tolist() == [2, 3] and mode == 2
    tokens, mode = dataset.get(1, offset=1)
    assert tokens.tolist() == [3] and mode == 2
    sequences, modes = dataset[0:3]
    assert [s.tolist() for s in sequences] == [[1], [2, 3], [4]]
    assert modes.tolist() == [1, 2, 3]
    assert dataset.sequence_modes.tolist() == [1, 2, 3]
    assert IndexedDataset(prefix)[1].tolist() == [2, 3]  # modes are ignored when not asked for


def test_mmap_reads_are_zero_copy_views(make_corpus):
    dataset = IndexedDataset(make_corpus(DOCUMENTS))
    whole, part = dataset[4], dataset.get(4, offset=1, length=2)
    assert not whole.flags.owndata and not whole.flags.writeable
    assert numpy.shares_memory(whole, part)
    assert numpy.shares_memory(dataset.sequence_lengths, dataset.document_indices) is False
    mapping = mapping_of(dataset.sequence_lengths)  # all index arrays view one mapping
    assert mapping is not None
    assert mapping_of(dataset.sequence_pointers) is mapping is mapping_of(dataset.document_indices)


def mapping_of(array):
    """What an array's chain of views ends at: the memory it maps."""
    while isinstance(array.base, numpy.ndarray):
        array = array.base
    return array.base


def open_descriptors():
    return len(os.listdir("/proc/self/fd"))


def test_open_corpora_hold_no_file_descriptors(make_corpus):
    prefix = make_corpus(DOCUMENTS)
    before = open_descriptors()
    datasets = [IndexedDataset(prefix) for _ in range(300)]
    assert open_descriptors() == before
    assert [d[4].tolist() for d in datasets[::100]] == [[7, 8, 9, 10]] * 3


def test_arrays_stay_valid_after_the_dataset_is_gone(make_corpus):
    prefix = make_corpus(DOCUMENTS)
    lengths = IndexedDataset(prefix).sequence_lengths  # segfaults with megatron-core 0.16.1
    tokens = IndexedDataset(prefix)[4]
    gc.collect()
    assert int(lengths.sum()) == 12
    assert tokens.tolist() == [7, 8, 9, 10]


@pytest.mark.parametrize("mmap", [True, False])
def test_pickled_dataset_reopens_its_files(make_corpus, mmap):
    dataset = IndexedDataset(make_corpus(DOCUMENTS), mmap=mmap)
    clone = pickle.loads(pickle.dumps(dataset))
    assert clone.reader_name == dataset.reader_name
    assert [clone[i].tolist() for i in range(len(clone))] == SEQUENCES


def test_a_relative_prefix_pickles_absolute_and_reopens_the_same_corpus(
    make_corpus, tmp_path, monkeypatch
):
    # two folders holding a corpus of the same name: the clone is unpickled in the other one,
    # as a spawn or forkserver worker started in another working directory would
    for name, documents in (("a", DOCUMENTS), ("b", [[[99]]])):
        (tmp_path / name).mkdir()
        make_corpus(documents, name=f"{name}/corpus")
    monkeypatch.chdir(tmp_path / "a")
    dataset = IndexedDataset("corpus")
    assert dataset.path_prefix == str(tmp_path / "a" / "corpus")
    pickled = pickle.dumps(dataset)
    monkeypatch.chdir(tmp_path / "b")
    clone = pickle.loads(pickled)
    assert clone.path_prefix == str(tmp_path / "a" / "corpus")
    assert [clone[i].tolist() for i in range(len(clone))] == SEQUENCES


def _sum_in_worker(dataset):
    return [int(dataset[i].sum()) for i in range(len(dataset))]


def test_dataset_is_read_in_a_spawned_worker(make_corpus):
    dataset = IndexedDataset(make_corpus(DOCUMENTS))
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.apply(_sum_in_worker, (dataset,)) == [sum(s) for s in SEQUENCES]


def test_exists(make_corpus, tmp_path):
    prefix = make_corpus(DOCUMENTS)
    assert IndexedDataset.exists(prefix)
    os.remove(get_bin_path(prefix))
    assert not IndexedDataset.exists(prefix)
    assert not IndexedDataset.exists(str(tmp_path / "nothing"))


def test_exists_for_a_url():
    import fsspec

    filesystem = fsspec.filesystem("memory")
    filesystem.pipe("/megafmt-exists/c.idx", b"x")
    assert not IndexedDataset.exists("memory://megafmt-exists/c")
    filesystem.pipe("/megafmt-exists/c.bin", b"x")
    assert IndexedDataset.exists("memory://megafmt-exists/c")


def test_fast_cache_load_uses_the_given_counts(make_corpus):
    prefix = make_corpus(DOCUMENTS)
    dataset = IndexedDataset(
        prefix, fast_cache_load=True, sequences_per_dataset=(6, 5), dtype_code=4
    )
    assert dataset[4].tolist() == [7, 8, 9, 10]
    # 34 header bytes + 6 * (4 + 8) + 4 * 8 = 138, while the file holds 5 document indices: 146
    with pytest.raises(
        FormatError,
        match=r"sequences_per_dataset says 6 sequences and 4 document "
        r"indices, which needs 138 bytes \(144 with sequence_modes\), but the file "
        "has 146",
    ):
        IndexedDataset(prefix, fast_cache_load=True, sequences_per_dataset=(6, 4), dtype_code=4)


def test_unknown_reader_lists_the_installed_ones(make_corpus):
    with pytest.raises(
        PluginError,
        match=r"unknown megafmt reader 'mmapp'; available: .*file.*mmap"
        r".*did you mean 'mmap'",
    ):
        IndexedDataset(make_corpus(DOCUMENTS), reader="mmapp")


# ---- broken files: each is a clear error naming the file, the field, expected and found -------


def patch(path, offset, data):
    with open(path, "r+b") as stream:
        stream.seek(offset)
        stream.write(data)


def test_missing_files(make_corpus, tmp_path):
    prefix = make_corpus(DOCUMENTS)
    os.remove(get_idx_path(prefix))
    with pytest.raises(MissingFileError, match=r"corpus.idx: index file not found"):
        IndexedDataset(prefix)
    with pytest.raises(MissingFileError, match=r"nothing.bin: token file not found"):
        IndexedDataset(str(tmp_path / "nothing"))


def test_wrong_magic(make_corpus):
    prefix = make_corpus(DOCUMENTS)
    patch(get_idx_path(prefix), 0, b"XXXX")
    with pytest.raises(
        FormatError,
        match=r"corpus.idx: bad magic at offset 0: expected b'MMIDIDX"
        r"\\x00\\x00', found b'XXXXIDX",
    ):
        IndexedDataset(prefix)


def test_unknown_dtype_code(make_corpus):
    prefix = make_corpus(DOCUMENTS)
    patch(get_idx_path(prefix), 17, bytes([11]))
    with pytest.raises(
        FormatError, match="corpus.idx: dtype code at offset 17: unknown dtype code 11"
    ):
        IndexedDataset(prefix)


@pytest.mark.parametrize(
    "size,message",
    [
        (0, "the file is empty"),
        (20, "found only 20 bytes"),
        (100, "needs 146 bytes, but the file has 100"),
    ],
)
def test_truncated_index(make_corpus, size, message):
    prefix = make_corpus(DOCUMENTS)
    os.truncate(get_idx_path(prefix), size)
    with pytest.raises(FormatError, match=message):
        IndexedDataset(prefix)


def test_counts_larger_than_the_file(make_corpus):
    prefix = make_corpus(DOCUMENTS)
    patch(get_idx_path(prefix), 18, struct.pack("<Q", 2**40))
    with pytest.raises(
        FormatError,
        match=r"says 1099511627776 sequences and 5 document indices, "
        r"which needs 13194139533386 bytes, but the file has 146",
    ):
        IndexedDataset(prefix)


def test_bin_shorter_than_the_index_implies(make_corpus):
    prefix = make_corpus(DOCUMENTS)
    os.truncate(get_bin_path(prefix), 40)
    with pytest.raises(
        FormatError,
        match=r"corpus.bin: expected 48 bytes \(12 tokens of 4 bytes, as .*corpus.idx "
        r"implies\), found 40 \(the corpus fails its consistency check at open",
    ):
        IndexedDataset(prefix)


@pytest.mark.parametrize("mmap", [True, False], ids=["mmap", "file"])
def test_a_negative_pointer_is_refused_at_open_not_read_from_the_end(make_corpus, mmap):
    prefix = make_corpus(DOCUMENTS)
    patch(get_idx_path(prefix), 34 + 4 * 6 + 8, struct.pack("<q", -8))  # sequence 1 at -8
    with pytest.raises(
        FormatError,
        match=r"corpus.idx: sequence_pointers\[1\] \(byte 66\): expected 12 .*, found -8",
    ):
        IndexedDataset(prefix, mmap=mmap)


def test_last_document_index_must_be_the_sequence_count(make_corpus):
    prefix = make_corpus(DOCUMENTS)
    patch(get_idx_path(prefix), 34 + 12 * 6 + 8 * 4, struct.pack("<q", 5))
    with pytest.raises(
        FormatError,
        match=r"corpus.idx: document_indices\[4\] \(byte 138\): the last entry must be the "
        "sequence count 6, found 5",
    ):
        IndexedDataset(prefix)


def test_multimodal_requested_on_a_plain_file(make_corpus):
    with pytest.raises(FormatError, match="multimodal=True but the file has no sequence_modes"):
        IndexedDataset(make_corpus(DOCUMENTS), multimodal=True)


def test_read_spans_concatenates_checked_ranges(dataset):
    out = numpy.full(12, -1, dtype=numpy.int64)
    written = dataset.read_spans([0, 4, 5], [1, 0, 1], [None, 2, 1], out)
    assert written == 5
    assert out[:5].tolist() == [2, 3, 7, 8, 12]
    with pytest.raises(IndexError, match=r"tokens \[1, 4\) are outside sequence 5"):
        dataset.read_spans([5], [1], [3], out)
    with pytest.raises(IndexError, match="sequence index 6 out of range"):
        dataset.read_spans([6], [0], [None], out)
    with pytest.raises(
        ValueError,
        match=r"needs room for at least 4 tokens \(at sequence 4\), "
        "`out` holds 2",
    ):
        dataset.read_spans([4], [0], [None], out[:2])
