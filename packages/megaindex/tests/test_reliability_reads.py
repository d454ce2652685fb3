"""Reliability: a GPTDataset whose corpus cannot be read names the corpus, the sample and its
documents, whichever reader maps or reads the ``.bin``."""

from __future__ import annotations

import os
import time

import pytest

from megafmt.readers.file_reader import FileBinReader
from megaindex import BlendedMegatronDatasetBuilder, GPTDataset, SampleReadError


def build(config):
    return BlendedMegatronDatasetBuilder(GPTDataset, [1000, 50, 10], lambda: True, config).build()[
        0
    ]


@pytest.mark.parametrize("mmap", [True, False], ids=["mmap", "file"])
def test_a_read_error_names_the_corpus_sample_and_documents(make_config, corpus, mmap):
    train = build(make_config(mmap_bin_files=mmap))
    train[0]
    os.truncate(corpus + ".bin", 16)  # rewritten in place under the running job
    time.sleep(0.05)
    expected = rf"^{corpus}: reading sample 1 of the train split \(documents \[.*\]\) failed: "
    with pytest.raises(SampleReadError, match=expected + r".*corpus.bin"):
        train[1]
    with pytest.raises(SampleReadError, match=expected):  # again at once: no crash (SIGBUS)
        train.__getitems__([1, 2])


def test_a_bug_inside_a_read_keeps_its_kind(make_config, corpus, monkeypatch):
    """A TypeError raised where the file reader reads (a bug, not an I/O failure) reaches the
    caller as that TypeError: neither a ReadError (an OSError) nor a SampleReadError."""
    train = build(make_config(mmap_bin_files=False))
    train[0]

    def buggy(self, buffer, offset):
        raise TypeError("unsupported operand type(s)")

    monkeypatch.setattr(FileBinReader, "_pread", buggy)
    for read in (lambda: train[1], lambda: train.__getitems__([1, 2])):
        with pytest.raises(TypeError, match="unsupported operand") as raised:
            read()
        assert not isinstance(raised.value, (OSError, SampleReadError))
