"""What ``mega load simulate`` and ``mega load explain`` do with a loader state: save it after
the steps (``--save-state``), resume from it (``--load-state``, and with
``--resume-with-new-mix`` under another blend or layout), log where every sample came from
(``--sample-log``: one JSON line per sample), and print each corpus's consumption.

The dataset provider builds the blend resumed from a state when it can
(:class:`MixResumingProvider`; megaindex's provider does): megaload never imports megaindex.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any, Protocol, TextIO, runtime_checkable

from megafmt.protocols import SampleOrigins, split_name
from megaload.errors import SimulationError


@runtime_checkable
class MixResumingProvider(Protocol):
    """A dataset provider that builds the blend resumed from a loader state under new
    arguments (megaindex: the builder with ``resume_with_new_mix``)."""

    def build_resumed(self, args: argparse.Namespace, state: Mapping[str, Any]) -> list[Any]:
        """The datasets of each split, the training blend continuing ``state``'s corpora."""
        ...

    def build_continuing_phases(self, args: argparse.Namespace) -> list[tuple[int, Any]] | None:
        """``(first iteration, training dataset)`` of each phase the arguments give, each
        phase continuing the corpora where the one before left them; None without phases."""
        ...


#: the flags of ``mega load simulate`` this module reads, and their argparse settings
FLAGS: dict[str, dict[str, Any]] = {
    "--save-state": {"metavar": "FILE", "help": "write the loader state after the steps (JSON)"},
    "--load-state": {
        "metavar": "FILE",
        "help": "resume from a state --save-state wrote (instead of --resume-at)",
    },
    "--resume-with-new-mix": {
        "action": "store_true",
        "help": "with --load-state: continue each corpus at its next unseen sample under this "
        "blend, weights and layout (off: the state must match the data, as in Megatron); "
        "with --phases: each phase continues the corpora where the one before left them",
    },
    "--sample-log": {
        "metavar": "FILE",
        "help": "write one JSON line per sample: split, corpus prefix, its sample index, documents",
    },
}


def add_arguments(simulate: argparse.ArgumentParser) -> None:
    """``--save-state``, ``--load-state``, ``--resume-with-new-mix`` and ``--sample-log``."""
    for flag, settings in FLAGS.items():
        simulate.add_argument(flag, **settings)


def read_state(args: argparse.Namespace) -> dict[str, Any] | None:
    """The state ``--load-state`` names, or None; refuses ``--resume-at`` with it."""
    if args.load_state is None:
        return None
    if args.resume_at:
        raise SimulationError("--load-state gives the resume point: drop --resume-at")
    return _load_state(args.load_state, f"--load-state {args.load_state}")


def _load_state(path: str, named: str) -> dict[str, Any]:
    """The JSON state at ``path``; an unreadable one is a SimulationError that begins with
    ``named``."""
    try:
        with open(path) as file:
            return json.load(file)
    except (OSError, ValueError) as error:
        raise SimulationError(f"{named}: {error}") from error


def build_phases(provider: Any, args: argparse.Namespace) -> list[tuple[int, Any]] | None:
    """The phases of a mid-training schedule, or None; with ``--resume-with-new-mix`` each
    phase continues the corpora where the one before left them."""
    if not args.resume_with_new_mix:
        return provider.build_phases(args)
    return _resuming(provider, args).build_continuing_phases(args)


def _resuming(provider: Any, args: argparse.Namespace) -> MixResumingProvider:
    if not isinstance(provider, MixResumingProvider):
        raise SimulationError(
            f"the dataset provider {args.provider!r} cannot resume a run with a new mix (it does "
            "not implement megaload.mix_cli.MixResumingProvider)"
        )
    return provider


def build_dataset(provider: Any, args: argparse.Namespace, state: Mapping[str, Any] | None) -> Any:
    """The training dataset: resumed from ``state`` with ``--resume-with-new-mix``."""
    if not args.resume_with_new_mix:
        return provider.build(args)[0]
    if state is None:
        raise SimulationError("--resume-with-new-mix needs --load-state FILE (or --phases)")
    return _resuming(provider, args).build_resumed(args, state)[0]


def write_state(path: str, state: Mapping[str, Any]) -> None:
    """Write a loader state as JSON (``--save-state``)."""
    with open(path, "w") as file:
        json.dump(state, file, indent=1)
        file.write("\n")


class SampleLog:
    """``--sample-log``: one JSON line per sample of each global batch, in sample order."""

    def __init__(self, path: str, dataset: Any) -> None:
        if not isinstance(dataset, SampleOrigins):
            raise SimulationError(
                f"--sample-log needs a dataset that says where its samples come from "
                f"(megafmt.protocols.SampleOrigins); {type(dataset).__name__} does not"
            )
        self.dataset = dataset
        self.split = split_name(dataset)
        self.file: TextIO = open(path, "w")  # noqa: SIM115 (closed by close())

    def write(self, indices: list[int]) -> None:
        for idx in sorted(indices):
            line = {"split": self.split, "index": idx, **self.dataset.sample_origin(idx)}
            self.file.write(json.dumps(line) + "\n")

    def close(self) -> None:
        self.file.close()


def explain(path: str) -> str:
    """``mega load explain STATE``: where a saved loader state stands, corpus by corpus."""
    state = _load_state(path, path)
    lines = [
        f"{path}: {state.get('consumed_samples')} samples consumed (state version "
        f"{state.get('version')}, sampler {state.get('sampler')!r})"
    ]
    mix = state.get("mix")
    if not mix:
        return "\n".join([*lines, "no per-corpus consumption recorded (not a blend of corpora)"])
    segment = mix.get("segment") or {"corpora": [], "weights": [], "start": None}
    weights = dict(zip(segment["corpora"], segment["weights"], strict=True))
    lines.append(f"blend since sample {segment['start']}: {len(weights)} corpora")
    lines.append(f"  {'consumed':>10}  {'weight':>8}  corpus")
    for name, record in mix["corpora"].items():
        weight = f"{weights[name]:.4f}" if name in weights else "removed"
        lines.append(f"  {record['consumed']:>10}  {weight:>8}  {name}")
    return "\n".join(lines)
