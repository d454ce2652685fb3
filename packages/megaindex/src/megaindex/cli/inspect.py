"""``mega index inspect``: what a cache folder holds (each dataset's description, tables and
blend shares), as text, JSON, a plot, or per phase of a schedule.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

import numpy

from megaindex.cache_report import inspect_cache
from megaindex.phase_report import describe_phases, phase_reports
from megaindex.phases import PhaseSchedule


def run_inspect(args: argparse.Namespace) -> int:
    reports = inspect_cache(args.cache_dir, args.first)
    if args.phases:
        phases = phase_reports(PhaseSchedule.parse(args.phases), reports)
        if args.json:
            print(json.dumps([asdict(phase) for phase in phases], indent=2))
        else:
            print("\n".join(describe_phases(phases)))
        return 0
    if args.plot:
        _plot(reports, args.plot)
    if args.json:
        print(
            json.dumps([asdict(r) | {"bytes_on_disk": r.bytes_on_disk} for r in reports], indent=2)
        )
        return 0
    if not reports:
        print(f"{args.cache_dir}: no cached datasets")
    for report in reports:
        print(report.base)
        print(_describe_report(report, args.first))
    return 0


def _plot(reports: list, path: str) -> None:
    """Cumulative share of each source over the samples of each blend, if matplotlib exists."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
    except ImportError as error:
        raise ValueError(f"--plot needs matplotlib ({error})") from None
    blends = [r for r in reports if r.sources]
    figure, axes = pyplot.subplots(
        len(blends) or 1, 1, figsize=(8, 3 * max(1, len(blends))), squeeze=False
    )
    for axis, report in zip(axes[:, 0], blends, strict=False):
        index = report.dataset_index()
        seen = numpy.arange(1, len(index) + 1)
        for number, source in enumerate(report.sources):
            axis.plot(
                seen,
                numpy.cumsum(index == number) / seen,
                label=f"{source.dataset_path} (weight {source.weight:.3f})",
            )
            axis.axhline(source.weight, linestyle=":", linewidth=0.8)
        axis.set_title(f"{report.description.get('split')} blend {report.base[:8]}")
        axis.set_xlabel("samples")
        axis.set_ylabel("share so far")
        axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path)


def _describe_report(report: Any, first: int) -> str:
    described = report.description
    lines = []
    if described.get("class") == "BlendedDataset":
        lines.append(
            f"  BlendedDataset {described.get('split')}: "
            f"{len(described.get('datasets', []))} datasets, size {described.get('size')}"
        )
    else:
        lines.append(
            f"  {described.get('class')} {described.get('index_split')} of "
            f"{described.get('dataset_path')}: seq {described.get('sequence_length')}, "
            f"seed {described.get('random_seed')}, split {described.get('split')}"
        )
    samples = report.samples
    lines.append(f"  samples: {samples:,}" if samples is not None else "  samples: unknown")
    if report.plan:
        lines.append(
            f"  epochs: {report.plan['num_epochs']}, separate final epoch: "
            f"{'yes' if report.plan['separate_final_epoch'] else 'no'}"
        )
    elif report.damage:
        lines.append(f"  damaged, rebuilt at its next load: {report.damage}")
    elif described.get("class") != "BlendedDataset":
        lines.append("  epochs: not recorded (built by megatron-core)")
    for table, info in report.tables.items():
        shape = info.get("shape", info.get("error"))
        lines.append(
            f"  {table:<20} {info.get('dtype', '?'):<7} {shape!s:<16} {info['bytes']:>14,} bytes"
        )
    lines.append(f"  total {report.bytes_on_disk:,} bytes")
    if report.sources:
        lines.append(
            f"  {'source':<40} {'weight':>8} {'first ' + str(first):>12} "
            f"{'all':>8} {'samples':>10} {'epochs':>8}"
        )
        for source in report.sources:
            epochs = "?" if source.epochs is None else f"{source.epochs:.3f}"
            lines.append(
                f"  {str(source.dataset_path)[-40:]:<40} {source.weight:>8.4f} "
                f"{source.share_first:>12.4f} {source.share_all:>8.4f} "
                f"{source.samples_drawn:>10,} {epochs:>8}"
            )
    return "\n".join(lines)
