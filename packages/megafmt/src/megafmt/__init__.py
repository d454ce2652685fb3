"""megafmt: the Megatron ``.bin``/``.idx`` corpus format SDK.

Drop-in for megatron-core's ``megatron.core.datasets.indexed_dataset`` (``DType``,
``IndexedDataset``, ``IndexedDatasetBuilder``, ``get_bin_path``, ``get_idx_path``,
``ObjectStorageConfig``, ``S3Config``, and its underscore names ``_IndexReader``,
``_IndexWriter``, ``_BinReader``, ``_MMapBinReader``, ``_FileBinReader``, ``_S3BinReader``,
``_MultiStorageClientBinReader``: :mod:`megafmt.megatron_names`), plus
verification, statistics, merging, pluggable ``.bin`` readers and the ``mega`` command line.
numpy and fsspec only: no torch. The data path's Protocols are in :mod:`megafmt.protocols`;
the small modules megafmt lends its sibling packages (:mod:`megafmt.registry`,
:mod:`megafmt.atomic`, :mod:`megafmt.fingerprint`, ...) are public, outside ``__all__``.
"""

from importlib.metadata import version

from megafmt.builder import IndexedDatasetBuilder
from megafmt.dataset import IndexedDataset
from megafmt.dtypes import DType
from megafmt.errors import (
    FormatError,
    MegafmtError,
    MissingFileError,
    ObjectChangedError,
    PluginError,
    ReadError,
    TokenValueError,
)
from megafmt.format import get_bin_path, get_idx_path
from megafmt.index import Index, IndexWriter
from megafmt.manifest import manifest_path, read_manifest, write_manifest
from megafmt.megatron_names import (
    _BinReader,
    _FileBinReader,
    _IndexReader,
    _IndexWriter,
    _MMapBinReader,
    _MultiStorageClientBinReader,
    _S3BinReader,
)
from megafmt.merging import MergeSummary, expand_inputs, merge
from megafmt.object_storage import ObjectStorageConfig, S3Config
from megafmt.readers import READERS, BinReader, open_bin_reader
from megafmt.stats import CorpusStats, corpus_stats
from megafmt.verification import Violation, verify

__version__ = version("megafmt")

__all__ = [
    "READERS",
    "BinReader",
    "CorpusStats",
    "DType",
    "FormatError",
    "Index",
    "IndexWriter",
    "IndexedDataset",
    "IndexedDatasetBuilder",
    "MegafmtError",
    "MergeSummary",
    "MissingFileError",
    "ObjectChangedError",
    "ObjectStorageConfig",
    "PluginError",
    "ReadError",
    "S3Config",
    "TokenValueError",
    "Violation",
    "_BinReader",
    "_FileBinReader",
    "_IndexReader",
    "_IndexWriter",
    "_MMapBinReader",
    "_MultiStorageClientBinReader",
    "_S3BinReader",
    "__version__",
    "corpus_stats",
    "expand_inputs",
    "get_bin_path",
    "get_idx_path",
    "manifest_path",
    "merge",
    "open_bin_reader",
    "read_manifest",
    "verify",
    "write_manifest",
]
