"""Writing the output pair of each json key, documents dealt into partitions like Megatron's tool.

With ``--partitions N`` Megatron's tool deals input lines round-robin into N files, processes
each, and merges the N outputs in order; so document order in the result is: every Nth line
starting at line 0, then every Nth starting at line 1, and so on. Here the dealing happens in
memory: each partition has its own builder writing to a scratch folder beside the output, and
the partitions are merged with ``add_index`` at the end: the same bytes, without copying the
input. ``--keep-sequential-samples`` deals contiguous blocks, which merge back to input order,
so it needs no partition files at all.

Everything is written under temporary names: an interrupted run leaves no ``.bin``/``.idx`` pair
that looks complete, and the next run clears what a killed one left.
"""

from __future__ import annotations

import itertools
import os
import shutil

import numpy

from megafmt.atomic import partial_path, remove_stale_partials
from megafmt.builder import IndexedDatasetBuilder
from megafmt.folders import make_folder
from megafmt.format import get_bin_path, get_idx_path
from megafmt.manifest import remove_manifest
from megafmt.preprocess.encoded import EncodedChunk


def output_prefix_of(output_prefix: str, key: str, level: str) -> str:
    """Megatron's output name: ``<output_prefix>_<key>_<level>`` (level: document or sentence)."""
    return f"{output_prefix}_{key}_{level}"


class PartitionedOutput:
    """The ``.bin``/``.idx`` pair of every json key, filled chunk by chunk."""

    def __init__(
        self,
        output_prefix: str,
        keys: tuple[str, ...],
        level: str,
        dtype: numpy.dtype,
        partitions: int = 1,
    ) -> None:
        self.prefixes = {key: output_prefix_of(output_prefix, key, level) for key in keys}
        self.partitions = partitions
        self.dtype = dtype
        make_folder(os.path.dirname(os.path.abspath(output_prefix)), "the output folder")
        scratch_name = output_prefix + ".partitions"
        for prefix in self.prefixes.values():
            remove_stale_partials(get_bin_path(prefix))
            remove_stale_partials(get_idx_path(prefix))
        remove_stale_partials(scratch_name)
        self._scratch: str | None = None
        self._builders: dict[str, list[IndexedDatasetBuilder]] = {}
        #: each key's builder of its output, once its files are written (finalize)
        self._ready: list[IndexedDatasetBuilder] = []
        try:
            if partitions > 1:
                self._scratch = partial_path(scratch_name)
                os.makedirs(self._scratch)
            for key, prefix in self.prefixes.items():
                self._builders[key] = (
                    [
                        IndexedDatasetBuilder(get_bin_path(self._part(key, p)), dtype=dtype)
                        for p in range(partitions)
                    ]
                    if partitions > 1
                    else [IndexedDatasetBuilder(get_bin_path(prefix), dtype=dtype)]
                )
        except BaseException:
            self.abort()
            raise

    def _part(self, key: str, partition: int) -> str:
        return os.path.join(self._scratch, f"{partition}_{key}")

    def add(self, chunk: EncodedChunk) -> None:
        """Append the documents of ``chunk`` (chunks must come in input order)."""
        if self.partitions == 1:
            for key, encoded in chunk.keys.items():
                self._builders[key][0].add_documents(
                    encoded.tokens, encoded.sequence_lengths, encoded.sequences_per_document
                )
            return
        partition = (chunk.start + chunk.documents) % self.partitions
        for p in range(self.partitions):
            mine = partition == p
            if not mine.any():
                continue
            for key, encoded in chunk.keys.items():
                part = encoded.select(mine)
                self._builders[key][p].add_documents(
                    part.tokens, part.sequence_lengths, part.sequences_per_document
                )

    def finalize(self) -> dict[str, str]:
        """Write every pair into place (partitions merged in order); returns key -> prefix.
        Every key's files are written before any is moved into place, and every place is
        checked first: a failure (a full disk, a directory at an output's path) replaces no
        key's earlier output."""
        try:
            for key, prefix in self.prefixes.items():
                builders = self._builders[key]
                if self.partitions == 1:
                    builders[0].prepare(get_idx_path(prefix))
                    self._ready.append(builders[0])
                    continue
                merged = IndexedDatasetBuilder(get_bin_path(prefix), dtype=self.dtype)
                self._ready.append(merged)  # aborted with the others should anything fail
                for p, builder in enumerate(builders):
                    builder.finalize(get_idx_path(self._part(key, p)))
                    merged.add_index(self._part(key, p))
                merged.prepare(get_idx_path(prefix))
            for builder in self._ready:
                builder.check_targets()
            for prefix, builder in zip(self.prefixes.values(), self._ready, strict=True):
                remove_manifest(prefix)
                builder.commit()
        except BaseException:
            self.abort()
            raise
        self._remove_scratch()
        return dict(self.prefixes)

    def abort(self) -> None:
        """Delete everything written so far; existing outputs are left as they were (those a
        failed finalize moved into place already are the new ones)."""
        for builder in itertools.chain(*self._builders.values(), self._ready):
            builder.abort()
        self._remove_scratch()

    def _remove_scratch(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
