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

A launch that loaded no checkpoint (the run's first) serves Megatron's blend. Refused, with the
flag: ``--phase-transition-iterations`` (a phase's launch counts samples from the phase's
start), ``--dataloader-type cyclic`` (a random order consumes no prefix of each corpus), and a
training blend without weights (give one corpus as ``--data-path 1 PREFIX``).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
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


def train_blend(args: Any, which: str) -> tuple[list[str], list[float]]:
    """The training blend of Megatron-LM arguments ``args`` (``which`` names them in errors):
    its prefixes and weights (a single unweighted prefix weighs 1)."""
    blend, per_split = blends_of(args)
    if blend is None and per_split is not None:
        blend = per_split[0]
    if blend is None:
        raise ConfigError(f"{FLAG}: {which} give no training data (--data-path)")
    prefixes, weights = blend
    if weights is None and len(prefixes) == 1:
        weights = [1.0]
    if weights is None:
        raise ConfigError(
            f"{FLAG}: {which} blend {len(prefixes)} corpora without weights (sized by the "
            "corpora); give the weights in --data-path"
        )
    return list(prefixes), list(weights)


def checkpoint_mix(checkpoint_args: Any) -> MixState:
    """Where the run a checkpoint's arguments describe left each corpus: its blend from the
    state it resumed from (its ``mix_resumed_from``; none for a run that never resumed with
    the flag, as Megatron-LM's own), for its ``consumed_train_samples``."""
    saved = getattr(checkpoint_args, RESUMED_FROM, None)  # a Megatron-LM checkpoint lacks it
    start = MixState(**saved) if saved else MixState(consumed_samples=0)
    prefixes, weights = train_blend(checkpoint_args, "the checkpoint's arguments")
    return start.after(prefixes, weights, int(checkpoint_args.consumed_train_samples))


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
            state = checkpoint_mix(checkpoint_args)
            setattr(args, RESUMED_FROM, dataclasses.asdict(state))

    return check


def resumed_config(config: Any, args: Any) -> Any:
    """``config`` (pretrain_gpt's dataset config from Megatron-LM arguments ``args``), resuming
    the training blend from ``mix_resumed_from`` with :data:`FLAG`."""
    if not args.resume_with_new_mix:
        return config
    if args.phase_transition_iterations:
        raise ConfigError(
            f"{FLAG} with --phase-transition-iterations: each phase's launch counts its samples "
            "from the phase's start, which a checkpoint's counts do not follow; drop one of the "
            "two (megaindex's build_phase_datasets(continue_corpora=True) and `mega load "
            "simulate --phases --resume-with-new-mix` continue the corpora across phases)"
        )
    if (args.dataloader_type or "single") != "single":
        raise ConfigError(
            f"{FLAG} needs --dataloader-type single, got {args.dataloader_type}: only a "
            "sequential run consumes a prefix of each corpus"
        )
    train_blend(args, "the arguments")  # refuses an unweighted blend before it is built
    saved = getattr(args, RESUMED_FROM)
    if saved is None:  # no checkpoint loaded: the run's first launch, Megatron's blend
        return config
    return dataclasses.replace(config, resume_with_new_mix=MixState(**saved))


def with_resumed_mix(config_from_args: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """pretrain_gpt's ``core_gpt_dataset_config_from_args``, through :func:`resumed_config`."""

    def config(args: Any) -> Any:
        return resumed_config(config_from_args(args), args)

    return config
