"""The names code imports from ``megatron.core.datasets`` (the private ones included), resolved
to this project's modules, against the seed commit's classes on the same files: constructor
signatures, what each reader reads, what the index writer writes."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
from pathlib import Path

import numpy
import pytest

import megafmt
from megafmt.testing import write_corpus

sys.path.insert(0, str(Path(__file__).parent / "seedside"))
from seed_names import describe_index  # (seedside/ is put on the path first)

pytestmark = pytest.mark.compat


@pytest.fixture(scope="module")
def seed(shared_seed):
    return shared_seed


#: where each megatron.core.datasets module's names live here (tools/megatron_switch.py points
#: the dataset imports at megaindex; indexed_dataset is megafmt, per its docstring)
MODULES = {
    "megatron.core.datasets.indexed_dataset": "megafmt",
    "megatron.core.datasets.object_storage_utils": "megafmt",
    "megatron.core.datasets.utils": "megaindex.utils",
    "megatron.core.datasets.megatron_dataset": "megaindex.megatron_dataset",
}
NAMES = {
    "megatron.core.datasets.indexed_dataset": [
        "_IndexReader", "_IndexWriter", "_BinReader", "_MMapBinReader", "_FileBinReader",
        "_S3BinReader", "_MultiStorageClientBinReader", "ObjectStorageConfig", "S3Config",
        "IndexedDataset", "IndexedDatasetBuilder", "DType", "get_bin_path", "get_idx_path",
    ],
    "megatron.core.datasets.object_storage_utils": ["ObjectStorageConfig", "S3Config"],
    "megatron.core.datasets.utils": ["compile_helpers", "Split", "normalize"],
    "megatron.core.datasets.megatron_dataset": ["LowLevelDataset", "MegatronDataset"],
}  # fmt: skip
CLASSES = [
    "_IndexReader", "_IndexWriter", "_MMapBinReader", "_FileBinReader", "_S3BinReader",
    "_MultiStorageClientBinReader",
]  # fmt: skip


def ours(megatron_module: str, name: str):
    return getattr(importlib.import_module(MODULES[megatron_module]), name)


def test_every_name_resolves_with_the_seed_s_constructor_parameters(seed) -> None:
    for module, names in NAMES.items():
        for name in names:
            ours(module, name)  # AttributeError names what is missing
    theirs = seed.call("seed_names:signatures", CLASSES)
    for name in CLASSES:
        parameters = list(inspect.signature(getattr(megafmt, name).__init__).parameters.values())
        mine = {p.name: p.default for p in parameters[1:]}
        for position, (parameter, default) in enumerate(theirs[name]):
            assert parameters[1 + position].name == parameter, (name, position)
            if default is not None:
                assert mine[parameter] == default, (name, parameter)
    from megaindex.megatron_dataset import LowLevelDataset

    theirs = seed.call("seed_names:shapes")
    assert theirs["fields"] == [
        (f.name, None if f.default is dataclasses.MISSING else f.default)
        for f in dataclasses.fields(megafmt.ObjectStorageConfig)
    ]
    assert theirs["s3_config_is_it"] and megafmt.S3Config is megafmt.ObjectStorageConfig
    assert theirs["abstract"] == sorted(megafmt._BinReader.__abstractmethods__)
    assert theirs["low_level"] == sorted(t.__name__ for t in LowLevelDataset.__args__)
    for reader in CLASSES[2:]:
        assert issubclass(getattr(megafmt, reader), megafmt._BinReader)


def random_corpus(prefix: str, rng: numpy.random.Generator, multimodal: bool) -> dict:
    dtype = rng.choice(["uint16", "int32", "int64", "uint8"])
    documents, modes = [], []
    builder = megafmt.IndexedDatasetBuilder(prefix + ".bin", dtype=dtype, multimodal=multimodal)
    for _ in range(int(rng.integers(0, 40))):
        lengths = rng.integers(0, 30, int(rng.integers(1, 4))).tolist()
        tokens = rng.integers(0, 200, sum(lengths))
        document_modes = rng.integers(-3, 4, len(lengths)).tolist() if multimodal else None
        builder.add_document(tokens, lengths, document_modes)
        documents.append(lengths)
        modes.append(document_modes)
    builder.finalize(prefix + ".idx")
    return {"dtype": dtype, "documents": documents, "modes": modes}


def read_index_here(idx_path: str, multimodal: bool, counts=None, code=None) -> dict:
    return describe_index(megafmt._IndexReader(idx_path, multimodal, counts, code))


def assert_same(theirs: dict, mine: dict, where: str) -> None:
    assert theirs.keys() == mine.keys(), where
    for key, value in theirs.items():
        if isinstance(value, numpy.ndarray):
            numpy.testing.assert_array_equal(mine[key], value, err_msg=f"{where}: {key}")
            assert mine[key].dtype == value.dtype, (where, key)
        else:
            assert mine[key] == value, (where, key)


def test_index_reader_and_writer_match_the_seed_s(seed, tmp_path: Path) -> None:
    rng = numpy.random.default_rng(12)
    for case in range(12):
        multimodal = bool(case % 3 == 0)
        prefix = str(tmp_path / f"corpus{case}")
        corpus = random_corpus(prefix, rng, multimodal)
        where = f"case {case} ({corpus['dtype']}, multimodal={multimodal})"
        theirs = seed.call("seed_names:read_index", prefix + ".idx", multimodal)
        assert_same(theirs, read_index_here(prefix + ".idx", multimodal), where)
        counts = (theirs["sequence_count"], theirs["document_count"])
        code = megafmt.DType.code_from_dtype(numpy.dtype(corpus["dtype"]).type)
        fast = seed.call("seed_names:read_index", prefix + ".idx", multimodal, counts, code)
        assert_same(fast, read_index_here(prefix + ".idx", multimodal, counts, code), where)
        # the writer, given what the reader read: the seed's bytes
        lengths = theirs["sequence_lengths"].tolist()
        documents = theirs["document_indices"].tolist()
        modes = None if not multimodal else theirs["sequence_modes"].tolist()
        seed.call(
            "seed_names:write_index",
            prefix + ".seed.idx",
            corpus["dtype"],
            lengths,
            modes,
            documents,
        )
        with megafmt._IndexWriter(prefix + ".ours.idx", numpy.dtype(corpus["dtype"]).type) as w:
            w.write(lengths, modes, documents)
        seed_bytes = Path(prefix + ".seed.idx").read_bytes()
        assert Path(prefix + ".ours.idx").read_bytes() == seed_bytes, where
        assert seed_bytes == Path(prefix + ".idx").read_bytes(), where


def random_reads(rng: numpy.random.Generator, nbytes: int, itemsize: int) -> list:
    items = nbytes // itemsize
    reads = []
    for _ in range(30):
        count = int(rng.integers(0, min(items, 64) + 1))
        offset = int(rng.integers(0, items - count + 1)) * itemsize
        reads.append((count, offset))
    return reads


@pytest.mark.parametrize("reader", ["_MMapBinReader", "_FileBinReader"])
def test_local_bin_readers_read_what_the_seed_s_read(seed, tmp_path: Path, reader: str) -> None:
    prefix = write_corpus(str(tmp_path / "corpus"), 50, seed=3)
    bin_path = prefix + ".bin"
    reads = random_reads(numpy.random.default_rng(5), Path(bin_path).stat().st_size, 2)
    theirs = seed.call("seed_names:read_bin", reader, bin_path, "uint16", reads)
    opened = getattr(megafmt, reader)(bin_path)
    for (count, offset), expected in zip(reads, theirs, strict=True):
        got = opened.read(numpy.uint16, count, offset)
        numpy.testing.assert_array_equal(got, expected, err_msg=f"{count} at {offset}")
        assert got.dtype == expected.dtype
