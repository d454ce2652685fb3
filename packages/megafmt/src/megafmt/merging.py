"""Merging corpora into one, as megatron-core's ``add_index`` (and Megatron-LM's
``tools/merge_datasets.py``) do: documents of each input in order, tokens concatenated."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy

from megafmt.atomic import remove_quietly, remove_stale_partials
from megafmt.builder import IndexedDatasetBuilder
from megafmt.errors import FormatError, MissingFileError
from megafmt.folders import make_folder
from megafmt.format import BIN_SUFFIX, IDX_SUFFIX, get_bin_path, get_idx_path, get_loss_mask_path
from megafmt.index import Index
from megafmt.limits import naming_full_disk
from megafmt.manifest import remove_manifest
from megafmt.progress import Progress


@dataclass(frozen=True)
class MergeSummary:
    """What a merge wrote."""

    output_prefix: str
    inputs: int
    sequences: int
    documents: int
    tokens: int
    seconds: float


def expand_inputs(paths: Iterable[str]) -> list[str]:
    """Corpus prefixes from prefixes and directories (a directory gives its corpora, sorted).

    In a directory every ``.bin`` needs its ``.idx`` and the other way round; other files
    (``*.partial`` leftovers, notes) are ignored.
    """
    prefixes: list[str] = []
    for path in paths:
        if not os.path.isdir(path):
            prefixes.append(path)
            continue
        found: dict[str, set[str]] = {}
        for name in os.listdir(path):
            stem, suffix = os.path.splitext(name)
            if suffix in (BIN_SUFFIX, IDX_SUFFIX) and os.path.isfile(os.path.join(path, name)):
                found.setdefault(stem, set()).add(suffix)
        for stem in sorted(found):
            if len(found[stem]) != 2:
                (present,) = found[stem]
                missing = IDX_SUFFIX if present == BIN_SUFFIX else BIN_SUFFIX
                raise MissingFileError(
                    f"{os.path.join(path, stem + present)} has no {missing} beside it"
                )
            prefixes.append(os.path.join(path, stem))
        if not found:
            raise MissingFileError(f"{path}: no .bin/.idx corpus in this directory")
    return prefixes


def _merge_into(
    builder: IndexedDatasetBuilder,
    output_prefix: str,
    input_prefixes: list[str],
    meter: Progress | None,
) -> tuple[numpy.ndarray, int]:
    """Append every input to ``builder`` and finalize it at ``output_prefix`` (aborted on any
    error); the sequence lengths and the document count written."""
    try:
        for prefix in input_prefixes:
            try:
                builder.add_index(prefix)
            except FormatError as error:
                raise FormatError(f"merging {prefix}: {error}") from error
            if meter is not None:
                meter.update(os.path.getsize(get_bin_path(prefix)))
        lengths = builder.sequence_lengths
        documents = len(builder.document_indices) - 1
        builder.finalize(get_idx_path(output_prefix))
    except BaseException:
        builder.abort()
        raise
    return lengths, documents


def merge(
    output_prefix: str,
    input_prefixes: list[str],
    multimodal: bool | None = None,
    overwrite: bool = False,
    progress: bool = False,
) -> MergeSummary:
    """Write the concatenation of ``input_prefixes`` to ``output_prefix``.

    The dtype is the first input's, and every input must share it. ``multimodal`` None follows
    the first input. The output is byte-identical to megatron-core's builder fed the same
    inputs through ``add_index``, and appears only when complete. A missing output folder is
    made (its parents too), as ``mega preprocess`` makes its own.
    """
    if not input_prefixes:
        raise ValueError("merge needs at least one input corpus")
    output_paths = {
        os.path.abspath(get_idx_path(output_prefix)),
        os.path.abspath(get_bin_path(output_prefix)),
    }
    for prefix in input_prefixes:
        if os.path.abspath(get_idx_path(prefix)) in output_paths:
            raise ValueError(f"{output_prefix}: the output is also an input")
    existing = [path for path in sorted(output_paths) if os.path.exists(path)]
    if existing and not overwrite:
        raise FileExistsError(f"{existing[0]} exists; pass overwrite (--force) to replace it")

    first = Index(get_idx_path(input_prefixes[0]))
    # like mega preprocess, the output's folder is made when missing, and what killed merges
    # into the same output left is cleared
    make_folder(os.path.dirname(os.path.abspath(output_prefix)), "the output's folder")
    remove_stale_partials(*output_paths)  # their folder is listed once for both
    # the companions of a corpus replaced (--force) describe the old one: never the new
    remove_manifest(output_prefix)
    remove_quietly(get_loss_mask_path(output_prefix))
    if multimodal is None:
        multimodal = first.has_modes
    start = time.perf_counter()
    total_bytes = sum(
        os.path.getsize(get_bin_path(p)) for p in input_prefixes if os.path.isfile(get_bin_path(p))
    )
    meter = Progress(f"merge into {output_prefix}", total_bytes, "bytes") if progress else None
    with naming_full_disk(*sorted(output_paths)):
        builder = IndexedDatasetBuilder(get_bin_path(output_prefix), first.dtype, multimodal)
        lengths, documents = _merge_into(builder, output_prefix, input_prefixes, meter)
    summary = MergeSummary(
        output_prefix=output_prefix,
        inputs=len(input_prefixes),
        sequences=len(lengths),
        documents=documents,
        tokens=int(lengths.sum(dtype=numpy.int64)),
        seconds=time.perf_counter() - start,
    )
    if meter is not None:
        meter.close(
            f"merged {summary.inputs} corpora into {output_prefix}: {summary.documents} documents, "
            f"{summary.sequences} sequences, {summary.tokens} tokens in {summary.seconds:.1f} s"
        )
    return summary
