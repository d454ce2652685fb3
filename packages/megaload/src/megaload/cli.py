"""``mega load simulate``: run the real samplers and loader for a few steps over simulated
data-parallel ranks, check that the ranks' samples are disjoint and cover each global batch,
and report throughput. The dataset comes from a ``megaload.datasets`` provider plugin, chosen
with ``--provider`` (megaindex provides ``megaindex``), which adds its own arguments
(``--data-path`` and the rest). ``mega load samplers`` lists the ``megaload.samplers``
plugins ``--dataloader-type`` can name. ``--hybrid-cp`` prints what hybrid context parallelism
deals to each rank instead (``megaload.hybrid_cp_simulate``). ``--save-state``, ``--load-state``,
``--resume-with-new-mix`` and ``--sample-log``, and ``mega load explain STATE``, are
``megaload.mix_cli``'s."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import time
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from megafmt.cli.command import non_negative_int, positive_int
from megafmt.progress import Progress
from megafmt.registry import Registry
from megaload import mix_cli
from megaload.accounting import num_micro_batches
from megaload.batch_sampler import SAMPLERS
from megaload.config import DataLoaderConfig
from megaload.errors import SimulationError
from megaload.hybrid_cp_sampler import HYBRID_CP_SAMPLER
from megaload.hybrid_cp_simulate import (
    add_arguments,
    loader_shares,
    phased_shares,
    simulate_hybrid_cp,
)
from megaload.loader import build_pretraining_data_loader
from megaload.phases import PhasedDataLoader

PROVIDERS: Registry[Any] = Registry(
    "megaload.datasets",
    "megaload dataset provider",
    required=("configure", "build"),
    providers={"megaindex": "it is provided by megaindex: pip install ./packages/megaindex"},
)


class LoadCommand:
    def configure(self, parser: argparse.ArgumentParser) -> None:
        commands = parser.add_subparsers(dest="load_command", metavar="SUBCOMMAND", required=True)
        commands.add_parser("samplers", help="list the samplers --dataloader-type can name")
        explain = commands.add_parser(
            "explain", help="print where a saved loader state stands, corpus by corpus"
        )
        explain.add_argument("state", metavar="STATE", help="a state --save-state wrote")
        simulate = commands.add_parser("simulate", help="run the loader over simulated ranks")
        simulate.add_argument(
            "--provider",
            default="megaindex",
            help="the megaload.datasets plugin that builds the dataset (default: megaindex)",
        )
        simulate.add_argument("--micro-batch-size", type=positive_int, required=True)
        simulate.add_argument("--dp", type=positive_int, default=1, help="data-parallel size")
        simulate.add_argument("--steps", type=non_negative_int, default=10)
        simulate.add_argument(
            "--dataloader-type",
            choices=SAMPLERS.available(),
            default="single",
            help="a megaload.samplers plugin (mega load samplers lists them)",
        )
        simulate.add_argument("--no-data-sharding", action="store_true")
        simulate.add_argument("--num-workers", type=non_negative_int, default=0)
        simulate.add_argument(
            "--resume-at",
            type=non_negative_int,
            default=0,
            metavar="S",
            help="start at consumed sample S",
        )
        simulate.add_argument(
            "--dry-run-resume",
            type=non_negative_int,
            metavar="S",
            help="print what a resume at S reads first on each rank, and stop",
        )
        simulate.add_argument(
            "--hash-log",
            metavar="FILE",
            help="write one hash per global batch (compare runs with diff)",
        )
        add_arguments(simulate)
        mix_cli.add_arguments(simulate)
        for name in PROVIDERS.available():
            PROVIDERS.get(name)().configure(simulate)
        # the dataset providers usually take --global-batch-size for the sample budget already
        with contextlib.suppress(argparse.ArgumentError):
            simulate.add_argument("--global-batch-size", type=positive_int)

    def run(self, args: argparse.Namespace) -> int:
        if args.load_command == "samplers":
            for name, target in SAMPLERS.view().items():
                print(f"{name:<20} {target}")
            return 0
        if args.load_command == "explain":
            print(mix_cli.explain(args.state))
            return 0
        if args.global_batch_size is None:
            raise SimulationError("mega load simulate needs --global-batch-size")
        if args.hybrid_cp is not None:
            if args.dataloader_type != "single":
                raise SimulationError(
                    f"--hybrid-cp samples with its own sampler, as Megatron does for the "
                    f"'single' type only; found --dataloader-type {args.dataloader_type}"
                )
            args.dataloader_type = HYBRID_CP_SAMPLER
        elif args.cp != 1:
            raise SimulationError(f"--cp {args.cp} takes effect with --hybrid-cp only")
        provider = PROVIDERS.get(args.provider)()
        has_phases = isinstance(provider, PhasedProvider)
        phases = mix_cli.build_phases(provider, args) if has_phases else None
        micro_batches = num_micro_batches(args.global_batch_size, args.micro_batch_size, args.dp)
        configs = [
            DataLoaderConfig(
                micro_batch_size=args.micro_batch_size,
                global_batch_size=args.global_batch_size,
                dataloader_type=args.dataloader_type,
                data_parallel_rank=rank,
                data_parallel_size=args.dp,
                data_sharding=not args.no_data_sharding,
                num_workers=args.num_workers,
                pin_memory=False,
                resume_with_new_mix=args.resume_with_new_mix,
            )
            for rank in range(args.dp)
        ]
        state = mix_cli.read_state(args)
        if phases is not None:
            if state is not None or args.save_state or args.sample_log:
                raise SimulationError(
                    "--phases does not take --load-state, --save-state or --sample-log (a "
                    "phase change is a change of mix, which those flags' single-blend state "
                    "does not describe): resume a phased run with --resume-at S (its consumed "
                    "samples), and add --resume-with-new-mix for each phase to continue every "
                    "corpus where the phases before left it"
                )
            if args.dry_run_resume is not None:
                raise SimulationError("--dry-run-resume does not take --phases: use --resume-at")
            recorded = [(first, SampleIds(dataset)) for first, dataset in phases]
            phased = [PhasedDataLoader(recorded, args.resume_at, c) for c in configs]
            if args.hybrid_cp is not None:
                return simulate_hybrid_cp(args, [phased_shares(loader) for loader in phased])
            return _simulate(args, [_phase_stream(loader) for loader in phased], micro_batches)
        dataset = mix_cli.build_dataset(provider, args, state)
        start = args.dry_run_resume if args.dry_run_resume is not None else args.resume_at
        loaders = [build_pretraining_data_loader(dataset, start, c) for c in configs]
        if state is not None:
            for loader in loaders:
                loader.load_state_dict(state)
        if args.dry_run_resume is not None:
            for rank, loader in enumerate(loaders):
                first = next(iter(loader.batch_sampler), None)
                print(
                    f"rank {rank}: first micro-batch after {args.dry_run_resume} consumed "
                    f"samples: {first}"
                )
            return 0
        if args.hybrid_cp is not None:
            return simulate_hybrid_cp(args, [loader_shares(loader) for loader in loaders])
        streams = [
            ((ids, batch, None) for ids, batch in zip(loader.batch_sampler, loader, strict=False))
            for loader in loaders
        ]
        samples = mix_cli.SampleLog(args.sample_log, dataset) if args.sample_log else None
        try:
            code = _simulate(args, streams, micro_batches, samples)
        finally:
            if samples is not None:
                samples.close()
        if args.save_state:
            mix_cli.write_state(args.save_state, loaders[0].state_dict())
        return code


@runtime_checkable
class PhasedProvider(Protocol):
    """A dataset provider that also builds a mid-training schedule's datasets."""

    def build_phases(self, args: argparse.Namespace) -> list[tuple[int, Any]] | None:
        """``(first iteration, training dataset)`` of each phase the arguments give, or None
        when they give no schedule."""
        ...


class SampleIds:
    """A dataset whose samples also carry their index (``sample_id``): what the simulation of
    a phased run prints, as the phases' loaders pick the samples themselves."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, idx: int) -> dict[str, Any]:
        return {**self.dataset[idx], "sample_id": idx}


def _phase_stream(loader: PhasedDataLoader) -> Iterator[tuple[list[int], Any, int]]:
    """``(sample ids, batch, phase)`` of each micro-batch of a phased loader."""
    for batch in loader:
        yield batch["sample_id"].tolist(), batch, loader.phase


def _simulate(
    args: argparse.Namespace,
    streams: list[Iterator[Any]],
    micro_batches: int,
    samples: mix_cli.SampleLog | None = None,
) -> int:
    """Run ``streams`` (one per rank, of ``(sample ids, batch, phase or None)``) step by step,
    checking each global batch; with phases, print what each rank receives; with ``samples``,
    log where each sample of each step came from."""
    log = open(args.hash_log, "w") if args.hash_log else None  # noqa: SIM115
    tokens = 0
    start = time.perf_counter()
    with Progress("simulate", args.steps, "steps") as progress:
        for step in range(args.steps):
            digest = hashlib.sha256()
            indices: list[Any] = []
            for rank in range(len(streams)):
                for _ in range(micro_batches):
                    try:
                        sampled, batch, phase = next(streams[rank])
                    except StopIteration:
                        print(f"the data ends during step {step} (rank {rank})")
                        return _summary(args, step, tokens, start, log)
                    if phase is not None:
                        lengths = batch["loss_mask"].sum(-1).long().tolist()
                        print(f"step {step} rank {rank} phase {phase}: samples {sampled} "
                              f"loss tokens {lengths}")  # fmt: skip
                    indices += sampled
                    digest.update(batch["tokens"].numpy().tobytes())
                    tokens += batch["tokens"].numel()
            real = [i for i in indices if i is not None]
            if len(set(real)) != len(real):
                raise SimulationError(f"step {step}: ranks read overlapping samples")
            if (
                args.dataloader_type == "single"
                and real
                and sorted(real) != list(range(min(real), min(real) + len(real)))
            ):
                raise SimulationError(f"step {step}: the global batch is not one contiguous block")
            if log is not None:
                log.write(f"{digest.hexdigest()}\n")
            if samples is not None:
                samples.write(real)
            progress.update()
    return _summary(args, args.steps, tokens, start, log)


def _summary(args: argparse.Namespace, steps: int, tokens: int, start: float, log: Any) -> int:
    if log is not None:
        log.close()
    seconds = time.perf_counter() - start
    samples = steps * args.global_batch_size
    print(
        f"{steps} steps of {args.global_batch_size} samples over {args.dp} ranks: disjoint "
        f"and covering; {samples / seconds:,.0f} samples/s, {tokens / seconds:,.0f} tokens/s"
    )
    return 0
