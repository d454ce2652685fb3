"""What a cache directory holds, for ``mega index inspect``."""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy

from megaindex.gpt_dataset import TABLES

DESCRIPTION_SUFFIX = "-description.txt"


@dataclass
class CacheReport:
    """One cached dataset: its key, what it describes and its tables."""

    base: str
    description: dict[str, Any]
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    plan: dict[str, Any] | None = None
    sidecar: bool = False

    @property
    def bytes_on_disk(self) -> int:
        return sum(table.get("bytes", 0) for table in self.tables.values())

    @property
    def samples(self) -> int | None:
        shuffle = self.tables.get("shuffle_index")
        return shuffle["shape"][0] if shuffle and shuffle.get("shape") else None


def _npy_header(path: str) -> dict[str, Any]:
    with open(path, "rb") as stream:
        version = numpy.lib.format.read_magic(stream)
        reader = (
            numpy.lib.format.read_array_header_1_0
            if version == (1, 0)
            else numpy.lib.format.read_array_header_2_0
        )
        shape, _, dtype = reader(stream)
    return {"dtype": dtype.name, "shape": list(shape)}


def inspect_cache(directory: str) -> list[CacheReport]:
    """A report per cached dataset in ``directory`` (sorted by key)."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{directory}: no such cache directory")
    reports = []
    for description_path in sorted(glob.glob(os.path.join(directory, "*" + DESCRIPTION_SUFFIX))):
        base = os.path.basename(description_path)[: -len(DESCRIPTION_SUFFIX)]
        with open(description_path, encoding="utf-8") as stream:
            report = CacheReport(base, json.load(stream))
        for table in TABLES:
            path = os.path.join(directory, f"{base}-{table}.npy")
            if os.path.isfile(path):
                try:
                    report.tables[table] = {**_npy_header(path), "bytes": os.path.getsize(path)}
                except (OSError, ValueError) as error:
                    report.tables[table] = {"error": str(error), "bytes": os.path.getsize(path)}
        sidecar_path = os.path.join(directory, f"{base}-megaindex.json")
        if os.path.isfile(sidecar_path):
            with open(sidecar_path, encoding="utf-8") as stream:
                report.plan = json.load(stream).get("plan")
            report.sidecar = True
        reports.append(report)
    return reports
