"""The tour's summary: a table on the terminal, the same as JSON, and a PNG of the realised
blend over the samples read and of the document lengths (when matplotlib is installed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy

from megafmt.cli.command import table
from megafmt.demo.run import DemoRun


def dataset_ids(run: DemoRun, rank: int | None = None) -> numpy.ndarray:
    """The blend member of every sample read, by data-parallel rank (all ranks when None); a
    dataset that is no blend (one corpus) reads every sample from member 0."""
    ranks = run.batches if rank is None else run.batches[rank : rank + 1]
    ids = [
        numpy.asarray(batch["dataset_id"])
        if "dataset_id" in batch
        else numpy.zeros(len(batch["tokens"]), dtype=numpy.int64)
        for batches in ranks
        for batch in batches
    ]
    return numpy.concatenate(ids) if ids else numpy.zeros(0, dtype=numpy.int64)


def plot(path: Path, run: DemoRun) -> bool:
    """Write the PNG; False (and a line saying why) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("   matplotlib is not installed: no plot")
        return False
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    ids = dataset_ids(run, rank=0)
    steps = numpy.arange(1, len(ids) + 1)
    weights = run.weights or [corpus.weight for corpus in run.corpora]
    for source, corpus in enumerate(run.corpora):
        if len(ids):
            left.plot(steps, numpy.cumsum(ids == source) / steps, label=corpus.name)
            if weights[source] is not None:
                left.axhline(weights[source], linestyle=":", color="grey")
        if corpus.lengths is not None:
            right.hist(corpus.lengths, bins=60, alpha=0.6, label=corpus.name, log=True)
    left.set(title="realised blend, data-parallel rank 0", xlabel="samples read", ylabel="share")
    right.set(title="document lengths", xlabel="tokens", ylabel="documents")
    left.legend()
    right.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return True


def summary(run: DemoRun, png: Path | None) -> dict[str, Any]:
    """The tour's figures and checks, as JSON-ready values."""
    return {
        "facts": run.facts,
        "checks": run.checks,
        "seconds": {name: round(value, 2) for name, value in run.seconds.items()},
        "plot": str(png) if png is not None else None,
    }


def _shown(value: Any) -> str:
    if isinstance(value, list | tuple):
        return " / ".join(map(_shown, value))
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def render(report: dict[str, Any]) -> str:
    """The summary table."""
    rows = [(name, _shown(value)) for name, value in report["facts"].items()]
    rows += [(name, _shown(value)) for name, value in report["checks"].items()]
    rows += [(f"seconds of {name}", f"{value:.1f}") for name, value in report["seconds"].items()]
    rows.append(("plot", report["plot"] or "-"))
    return table(rows)
