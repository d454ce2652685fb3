"""The one way a benchmark under tools/bench/ states a figure: ours beside a reference's.

A benchmark script builds its parser with ``parser(__doc__)`` (which adds ``--reference`` and
``--rows``), makes a ``Report`` from the parsed arguments, and hands every measured pair to
``Report.compare``: it prints one aligned line and, when ``--rows FILE`` was given, appends the
row to FILE as one JSON line for ``run_all.py`` to gather into the markdown table. Figures that
have no reference counterpart (a share, a count, an internal ratio) go through ``Report.note``,
printed only.

Which reference a run measures against is chosen before the script imports ``megatron``:
``enter_reference(choices)`` reads ``--reference`` from the command line and, for ``seed``,
makes this process import Megatron-LM at the seed commit instead of megatron-core
(testing/seedref.py's environment), so the same script body times either one.

    import benchreport
    REFERENCE = benchreport.enter_reference(("megatron-core", "seed"))
    from megatron.core.datasets import indexed_dataset  # the chosen reference's
    ...
    args = benchreport.parser(__doc__).parse_args()
    report = benchreport.Report("bench_x", REFERENCE, args.rows)
    report.compare("build time", ours=1.2, theirs=3.4, unit="s", conditions="1M docs, int32")
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SEED_COMMIT = "e03878b5f"

#: What each ``--reference`` name stands for in printed lines and in the table.
REFERENCES = {
    "megatron-core": "megatron-core {version}",
    "seed": f"Megatron-LM {SEED_COMMIT} (seed)",
    "seed-datasets": f"Megatron-LM {SEED_COMMIT} (seed): datasets.load_dataset",
    "megatron-protocol": "Megatron-LM's get_batch protocol, replayed by megadist",
}


@dataclass(frozen=True)
class Row:
    """One figure: ours and the reference's value of it, in ``unit``."""

    benchmark: str
    figure: str
    ours: float
    theirs: float
    unit: str
    reference: str
    higher_is_better: bool
    conditions: str

    @property
    def ratio(self) -> float | None:
        """How many times better ours is (above 1: ours is better, below 1: worse); None when
        it is undefined: the figure it would divide by is 0 (a time or a size too small to
        measure, a rate of nothing)."""
        top, bottom = (
            (self.ours, self.theirs) if self.higher_is_better else (self.theirs, self.ours)
        )
        return None if bottom == 0 else top / bottom

    @property
    def ratio_text(self) -> str:
        """The ratio as printed and tabulated: ``2.50x``, or ``n/a`` when it is undefined."""
        ratio = self.ratio
        return "n/a" if ratio is None else f"{ratio:.2f}x"


def reference_label(name: str) -> str:
    """The printed name of reference ``name`` (megatron-core with its installed version)."""
    if name not in REFERENCES:
        raise ValueError(
            f"unknown benchmark reference {name!r}; expected one of {list(REFERENCES)}"
        )
    version = importlib.metadata.version("megatron-core") if name == "megatron-core" else ""
    return REFERENCES[name].format(version=version)


_entered: list[str] = []  # the reference this process entered, once


def enter_reference(choices: tuple[str, ...]) -> str:
    """The ``--reference`` given on the command line (default: the first of ``choices``); for
    ``seed`` this process is switched to import the seed commit's ``megatron``. Call it before
    anything imports ``megatron``; a second call (a benchmark importing another) returns the
    reference entered first."""
    if _entered:
        return _entered[0]
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--reference", choices=choices, default=choices[0])
    name = pre.parse_known_args()[0].reference
    if name == "seed":
        sys.path.insert(0, str(ROOT / "testing"))
        from seedref import enter_seed_environment

        with warnings.catch_warnings():  # its imports warn of absent GPU libraries
            warnings.simplefilter("ignore")
            enter_seed_environment()
    _entered.append(name)
    return name


def evict_page_cache(folder: Path) -> None:
    """Drop every file under ``folder`` from the page cache (written back first), so the next
    read comes from the disk: the cold-cache case, without root's drop_caches."""
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file():
            descriptor = os.open(path, os.O_RDONLY)
            try:
                os.fsync(descriptor)
                os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(descriptor)


def child_json(script: str | Path, *arguments: object) -> dict:
    """Run ``script --child ARGUMENTS`` in a fresh process and return the JSON object its last
    printed line holds: a benchmark's cold start, where nothing this process imported or cached
    counts (its stderr is kept apart; a failed child raises CalledProcessError)."""
    command = [sys.executable, str(script), "--child", *(str(a) for a in arguments)]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def parser(
    doc: str, choices: tuple[str, ...] = ("megatron-core", "seed")
) -> argparse.ArgumentParser:
    """An argument parser for a benchmark whose docstring is ``doc``, with the options every
    benchmark shares: ``--reference`` (one of ``choices``) and ``--rows``."""
    result = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    result.add_argument(
        "--reference", choices=choices, default=choices[0], help="what ours is measured against"
    )
    result.add_argument(
        "--rows", type=Path, default=None, help="append each figure as a JSON line to this file"
    )
    return result


class Report:
    """Prints each figure of one benchmark run and, with ``rows``, records it for the table."""

    def __init__(self, benchmark: str, reference: str, rows: Path | None = None) -> None:
        self.benchmark = benchmark
        self.reference = reference_label(reference)
        self.rows = rows

    def compare(
        self,
        figure: str,
        *,
        ours: float,
        theirs: float,
        unit: str,
        higher_is_better: bool = False,
        conditions: str = "",
    ) -> Row:
        """State one figure; ``higher_is_better`` for rates (samples/s), not for times."""
        row = Row(
            self.benchmark,
            figure,
            float(ours),
            float(theirs),
            unit,
            self.reference,
            higher_is_better,
            conditions,
        )
        print(
            f"{figure:<48} ours {row.ours:11.3f} {unit:<9} reference {row.theirs:11.3f} "
            f"{unit:<9} ratio {row.ratio_text:>7}",
            flush=True,
        )
        if self.rows is not None:
            with open(self.rows, "a", encoding="utf-8") as stream:
                stream.write(json.dumps(asdict(row)) + "\n")
        return row

    def heading(self, text: str) -> None:
        """Print what the figures that follow measure (and, first, against what)."""
        print(f"{text}   [reference: {self.reference}]", flush=True)

    def note(self, text: str) -> None:
        """Print a figure that has no reference counterpart; it does not enter the table."""
        print(f"  {text}", flush=True)


def read_rows(path: Path) -> list[Row]:
    """The rows ``Report.compare`` appended to ``path``."""
    with open(path, encoding="utf-8") as stream:
        return [Row(**json.loads(line)) for line in stream if line.strip()]
