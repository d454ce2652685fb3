"""What a cache directory holds, for ``mega index inspect``: each cached dataset's key, what it
describes, its tables, and for a blend the proportions it realises and each source's epochs."""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy

from megaindex.cache import (
    CacheEntry,
    DamagedCacheError,
    load_table,
    read_npy_header,
    read_sidecar,
)
from megaindex.errors import CacheDescriptionError
from megaindex.megatron_dataset import describe

DESCRIPTION_SUFFIX = "-description.txt"


@dataclass
class SourceReport:
    """One dataset of a blend: its weight, its realised share and the epochs it is read for."""

    dataset_path: str | None
    weight: float
    share_first: float
    share_all: float
    samples_drawn: int
    epochs: float | None


@dataclass
class CacheReport:
    """One cached dataset: its key, what it describes and its tables."""

    directory: str
    base: str
    description: dict[str, Any]
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    plan: dict[str, Any] | None = None
    sources: list[SourceReport] = field(default_factory=list)
    damage: str | None = None
    """What is wrong with the entry's sidecar (a load rebuilds the entry), or None."""

    @property
    def entry(self) -> CacheEntry:
        return CacheEntry(self.directory, self.base, tuple(self.tables))

    def dataset_index(self) -> numpy.ndarray:
        """A blend's ``dataset_index`` table (mapped, not read)."""
        return load_table(self.entry.table_path("dataset_index"), None)

    def sequence_length(self, described: dict[str, Any], where: str = "") -> int:
        """The ``sequence_length`` field of ``described`` (this entry's description, or the
        part of it ``where`` names), which every description megatron-core writes holds; a
        :class:`CacheDescriptionError` naming the file when it is missing or not a count."""
        value = described.get("sequence_length")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        found = "it has none" if value is None else f"found {value!r}"
        raise CacheDescriptionError(
            f"{self.entry.description_path}: expected a positive integer field "
            f"'sequence_length'{where} (every dataset description megatron-core writes has "
            f"one), {found}; fields present: {', '.join(described) or 'none'}"
        )

    @property
    def bytes_on_disk(self) -> int:
        return sum(table.get("bytes", 0) for table in self.tables.values())

    @property
    def samples(self) -> int | None:
        for name in ("shuffle_index", "dataset_index"):
            table = self.tables.get(name)
            if table and table.get("shape"):
                return table["shape"][0]
        return None


def _npy_header(path: str) -> dict[str, Any]:
    with open(path, "rb") as stream:
        shape, _, dtype = read_npy_header(stream)
    return {"dtype": dtype.name, "shape": list(shape)}


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as stream:
            return json.load(stream)
    except (OSError, ValueError):
        return None


def _sources(report: CacheReport, first: int) -> list[SourceReport]:
    """Realised shares (over the first ``first`` samples and all) and epochs of each source."""
    described = report.description
    index = report.dataset_index()
    datasets = described["datasets"]
    counts_first = numpy.bincount(index[:first], minlength=len(datasets))
    counts_all = numpy.bincount(index, minlength=len(datasets))
    weights = numpy.asarray(described["weights"], dtype=numpy.float64)
    weights = weights / weights.sum()
    sources = []
    for number, identifiers in enumerate(datasets):
        # the source's own cache entry sits beside the blend's, under the md5 of its identity
        key = describe(identifiers)[1]
        entry = CacheEntry.for_dataset(
            report.directory, key, identifiers["class"], identifiers["index_split"], ()
        )
        sidecar = _sidecar(entry.sidecar_path)[0]
        plan = sidecar.get("plan")
        extra = int((sidecar.get("config") or {}).get("add_extra_token_to_sequence", True))
        epochs = None
        if plan:
            length = report.sequence_length(identifiers, f" in datasets[{number}]")
            tokens = int(counts_all[number]) * length + extra
            epochs = tokens / plan["tokens_per_epoch"]
        sources.append(
            SourceReport(
                dataset_path=identifiers.get("dataset_path"),
                weight=float(weights[number]),
                share_first=float(counts_first[number] / max(1, min(first, len(index)))),
                share_all=float(counts_all[number] / max(1, len(index))),
                samples_drawn=int(counts_all[number]),
                epochs=epochs,
            )
        )
    return sources


def _sidecar(path: str) -> tuple[dict[str, Any], str | None]:
    """The sidecar at ``path`` (empty where there is none) and what is wrong with it."""
    try:
        return read_sidecar(path) or {}, None
    except DamagedCacheError as damage:
        return {}, str(damage)


def inspect_cache(directory: str, first: int = 10000) -> list[CacheReport]:
    """A report per cached dataset in ``directory`` (sorted by key)."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{directory}: no such cache directory")
    reports = []
    for description_path in sorted(glob.glob(os.path.join(directory, "*" + DESCRIPTION_SUFFIX))):
        base = os.path.basename(description_path)[: -len(DESCRIPTION_SUFFIX)]
        report = CacheReport(directory, base, _read_json(description_path) or {})
        for path in sorted(glob.glob(os.path.join(directory, f"{base}-*.npy"))):
            table = os.path.basename(path)[len(base) + 1 : -len(".npy")]
            try:
                report.tables[table] = {**_npy_header(path), "bytes": os.path.getsize(path)}
            except (OSError, ValueError) as error:
                report.tables[table] = {"error": str(error), "bytes": os.path.getsize(path)}
        sidecar, report.damage = _sidecar(report.entry.sidecar_path)
        report.plan = sidecar.get("plan")
        if report.description.get("class") == "BlendedDataset" and "dataset_index" in report.tables:
            report.sources = _sources(report, first)
        reports.append(report)
    return reports
