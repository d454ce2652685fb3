"""``--resume-with-new-mix`` in a Megatron-LM checkout switched to this project
(``tools/megatron_switch.py``): a run resumed from a Megatron-LM checkpoint under another blend
continues each corpus at its next unseen sample (:mod:`megaindex.mix_resume`).

A Megatron-LM checkpoint records no per-corpus counts: only ``consumed_train_samples`` and the
arguments the run was launched with, its blend among them. The switch wraps three of the
checkout's functions with the ones here:

- ``arguments._add_data_args`` (:func:`mix_resume_arguments`): the flag, and the argument
  ``mix_resumed_from`` (no flag) that carries the state a launch resumed from into its own
  checkpoints, as Megatron-LM saves every argument;
- ``checkpointing.check_checkpoint_args`` (:func:`keeping_checkpoint_mix`), which reads the
  checkpoint's arguments as it loads one: with the flag, the state where that run left each
  corpus (:func:`checkpoint_mix`) is put in ``mix_resumed_from``;
- pretrain_gpt's ``core_gpt_dataset_config_from_args`` (:func:`with_resumed_mix`): the dataset
  config gets that state as its ``resume_with_new_mix``, so the training blend is
  :class:`~megaindex.mix_resume.MixResumedBlend`.

A launch that loaded no checkpoint (the run's first) serves Megatron's blend. With
``--phase-transition-iterations`` (one launch per phase), a phase's launch continues each corpus
where the phases before left it, as ``build_phase_datasets(..., continue_corpora=True)`` does.
Refused, with the flag: ``--dataloader-type cyclic`` (a random order consumes no prefix of each
corpus), a training blend of several corpora without weights, and a new training split of one
corpus that the builder reads as itself (not as a blend that continues).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from megaindex.dataset_flags import blends_of
from megaindex.errors import ConfigError
from megaindex.mix_resume import MixState

#: the flag, and the argument (no flag) that holds the state a launch resumed from
FLAG = "--resume-with-new-mix"
RESUMED_FROM = "mix_resumed_from"


def mix_resume_arguments(
    add_data_args: Callable[[argparse.ArgumentParser], argparse.ArgumentParser],
) -> Callable[[argparse.ArgumentParser], argparse.ArgumentParser]:
    """Megatron-LM's ``_add_data_args``, adding :data:`FLAG` and the ``mix_resumed_from``
    default (None: the run's blend started from nothing)."""

    def add(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        parser = add_data_args(parser)
        parser.add_argument(
            FLAG,
            action="store_true",
            help="resumed from a checkpoint under another blend (weights, corpora) or "
            "data-parallel or global batch size: continue each corpus at its next unseen "
            "sample, blending by the new weights from there (off: Megatron-LM's blend)",
        )
        parser.set_defaults(**{RESUMED_FROM: None})
        return parser

    return add


def train_blend(args: Any, which: str, *, resumed: bool = False) -> tuple[list[str], list[float]]:
    """The training blend of Megatron-LM arguments ``args`` (``which`` names them in errors):
    its prefixes and weights. One corpus that the builder reads as itself (no weight, or a
    split's own) weighs 1: its samples in order; unless ``resumed`` (the blend to build from a
    state), where it is refused, as it would not be built as a blend that continues."""
    blend, per_split = blends_of(args)
    train = blend if blend is not None else per_split[0] if per_split is not None else None
    if train is None:
        raise ConfigError(f"{FLAG}: {which} give no training data (--data-path)")
    prefixes, weights = train
    if len(prefixes) == 1 and (weights is None or blend is None):
        if resumed:
            raise ConfigError(
                f"{FLAG}: the training data is one corpus, {prefixes[0]}, which is read as "
                f"itself, not as a blend that continues from the checkpoint; give it as "
                f"--data-path 1 {prefixes[0]}"
            )
        weights = [1.0]
    if weights is None:
        raise ConfigError(
            f"{FLAG}: {which} blend {len(prefixes)} corpora without weights (sized by the "
            "corpora); give the weights in --data-path"
        )
    return list(prefixes), list(weights)


def phase_starts(args: Any) -> list[int]:
    """The first sample of each phase of Megatron-LM arguments ``args`` (``[0]`` without
    ``--phase-transition-iterations``), as training.py counts them."""
    transitions = args.phase_transition_iterations or []
    return [0, *(iteration * args.global_batch_size for iteration in transitions)]


def checkpoint_mix(checkpoint_args: Any, starts: Sequence[int] = (0,)) -> MixState:
    """Where the run a checkpoint's arguments describe left each corpus: its blend from the
    state it resumed from (its ``mix_resumed_from``; none for a run that never resumed with
    the flag, as Megatron-LM's own), for its ``consumed_train_samples``.

    With phases (their first samples ``starts``), a launch's blend and state count from its
    phase's first sample, as its dataset does; a checkpoint at a transition (saved by the
    launch of the phase before) gives the next phase's state: each corpus's count, the blend
    starting afresh at the phase's sample 0."""
    consumed = int(checkpoint_args.consumed_train_samples)
    ran_from = max((start for start in starts if start < consumed), default=0)
    saved = getattr(checkpoint_args, RESUMED_FROM, None)  # a Megatron-LM checkpoint lacks it
    first = MixState(**saved) if saved else MixState(consumed_samples=0)
    prefixes, weights = train_blend(checkpoint_args, "the checkpoint's arguments")
    state = first.after(prefixes, weights, consumed - ran_from)
    if consumed in starts and consumed > ran_from:
        return MixState(consumed_samples=0, corpora=state.corpora)
    return state


def keeping_checkpoint_mix(
    check_checkpoint_args: Callable[[Any], None], get_args: Callable[[], Any]
) -> Callable[[Any], None]:
    """Megatron-LM's ``check_checkpoint_args``, which then, with :data:`FLAG`, puts where the
    checkpoint's run left each corpus into the run's ``mix_resumed_from`` (``get_args`` is
    Megatron-LM's)."""

    def check(checkpoint_args: Any) -> None:
        check_checkpoint_args(checkpoint_args)
        args = get_args()
        if args.resume_with_new_mix:
            _same_phase_batches(checkpoint_args, args)
            state = checkpoint_mix(checkpoint_args, phase_starts(args))
            setattr(args, RESUMED_FROM, dataclasses.asdict(state))
        elif getattr(checkpoint_args, RESUMED_FROM, None):
            raise ConfigError(
                f"the checkpoint's run (consumed_train_samples "
                f"{checkpoint_args.consumed_train_samples}) served its blend resumed with "
                f"{FLAG}; this launch, without it, would serve Megatron's blend from that count "
                f"instead, repeating some samples and skipping others: add {FLAG}"
            )

    return check


def _same_phase_batches(checkpoint_args: Any, args: Any) -> None:
    """Refuse phases whose starts the checkpoint's run counted in another global batch size:
    its phases began at iteration x its batch size, which this launch would count otherwise."""
    if not args.phase_transition_iterations:
        return
    theirs = getattr(checkpoint_args, "global_batch_size", args.global_batch_size)
    if theirs != args.global_batch_size:
        raise ConfigError(
            f"{FLAG} with --phase-transition-iterations needs the checkpoint's global batch "
            f"size, {theirs}, got {args.global_batch_size}: the phases start at an iteration "
            "times the batch size, so another size moves the starts of the phases already run"
        )


def resumed_config(config: Any, args: Any) -> Any:
    """``config`` (pretrain_gpt's dataset config from Megatron-LM arguments ``args``), resuming
    the training blend from ``mix_resumed_from`` with :data:`FLAG`."""
    if not args.resume_with_new_mix:
        return config
    if (args.dataloader_type or "single") != "single":
        raise ConfigError(
            f"{FLAG} needs --dataloader-type single, got {args.dataloader_type}: only a "
            "sequential run consumes a prefix of each corpus"
        )
    train_blend(args, "the arguments", resumed=True)  # refuses what would not continue
    saved = getattr(args, RESUMED_FROM)
    if saved is None:  # no checkpoint loaded: the run's first launch, Megatron's blend
        return config
    return dataclasses.replace(config, resume_with_new_mix=MixState(**saved))


def with_resumed_mix(config_from_args: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """pretrain_gpt's ``core_gpt_dataset_config_from_args``, through :func:`resumed_config`."""

    def config(args: Any) -> Any:
        return resumed_config(config_from_args(args), args)

    return config
