"""``--resume-with-new-mix`` in a switched Megatron-LM (:mod:`megaindex.megatron_mix`), on
namespaces with the names Megatron-LM's parser gives its arguments. The switched seed checkout
itself: tests/compat/test_megatron_mix_switch.py."""

import argparse
import dataclasses
import types

import pytest

from megaindex.errors import ConfigError
from megaindex.megatron_mix import (
    checkpoint_mix,
    keeping_checkpoint_mix,
    mix_resume_arguments,
    phase_starts,
    resumed_config,
)
from megaindex.mix_resume import MixState


def megatron_args(data_path, **settings):
    values = {"data_path": data_path, "data_args_path": None, "train_data_path": None,
              "valid_data_path": None, "test_data_path": None, "per_split_data_args_path": None,
              "resume_with_new_mix": True, "mix_resumed_from": None,
              "phase_transition_iterations": None, "dataloader_type": None,
              "consumed_train_samples": 0, "global_batch_size": 8}  # fmt: skip
    return types.SimpleNamespace(**{**values, **settings})


@dataclasses.dataclass(frozen=True)
class Config:
    resume_with_new_mix: MixState | None = None


def test_the_flag_is_added_to_megatron_s_data_arguments():
    def add_data_args(parser):
        parser.add_argument("--data-path", nargs="*")
        return parser

    parser = mix_resume_arguments(add_data_args)(argparse.ArgumentParser())
    assert vars(parser.parse_args(["--data-path", "a"])) == {
        "data_path": ["a"], "resume_with_new_mix": False, "mix_resumed_from": None}  # fmt: skip
    assert parser.parse_args(["--resume-with-new-mix"]).resume_with_new_mix is True


def test_a_checkpoint_of_megatron_lm_gives_its_blend_s_counts_and_chains_compose():
    old = megatron_args(["0.7", "web", "0.3", "code"], consumed_train_samples=100)
    state = checkpoint_mix(old)
    assert state == MixState.from_megatron(["web", "code"], [0.7, 0.3], 100)
    # the next launch resumed from that state under another blend, and saved at 180
    later = megatron_args(["1", "code", "1", "math"], consumed_train_samples=180,
                          mix_resumed_from=dataclasses.asdict(state))  # fmt: skip
    assert checkpoint_mix(later) == state.after(["code", "math"], [1, 1], 180)
    one = megatron_args(["web"], consumed_train_samples=30)  # one corpus, no weight
    assert checkpoint_mix(one) == MixState.from_megatron(["web"], [1], 30)
    with pytest.raises(ConfigError, match="the checkpoint's arguments blend 2 corpora without"):
        checkpoint_mix(megatron_args(["web", "code"], consumed_train_samples=30))


def test_phases_count_each_launch_from_its_phase_s_first_sample():
    """Transitions at iterations 5 and 9 of 8 samples: phases start at samples 0, 40, 72. A
    checkpoint at a transition gives the next phase each corpus's count and a fresh blend; one
    inside a phase, that phase's state at its count there."""
    args = megatron_args(["1", "code"], phase_transition_iterations=[5, 9])
    starts = phase_starts(args)
    assert starts == [0, 40, 72] and phase_starts(megatron_args(["1", "code"])) == [0]
    first = megatron_args(["0.7", "web", "0.3", "code"], consumed_train_samples=40)
    at_transition = checkpoint_mix(first, starts)
    counts = MixState.from_megatron(["web", "code"], [0.7, 0.3], 40).corpora
    assert at_transition == MixState(consumed_samples=0, corpora=counts)
    inside = megatron_args(["1", "code", "1", "math"], consumed_train_samples=56,
                           mix_resumed_from=dataclasses.asdict(at_transition))  # fmt: skip
    assert checkpoint_mix(inside, starts) == at_transition.after(["code", "math"], [1, 1], 16)
    inside.consumed_train_samples = 72  # the second phase's launch, at the next transition
    last = checkpoint_mix(inside, starts)
    assert last.consumed_samples == 0 and last.segment is None
    assert last.corpora == at_transition.after(["code", "math"], [1, 1], 32).corpora


def test_loading_a_checkpoint_records_where_its_run_left_each_corpus_only_with_the_flag():
    checked = []
    old = megatron_args(["0.5", "web", "0.5", "code"], consumed_train_samples=40)
    for flag in (True, False):
        args = megatron_args(["1", "code"], resume_with_new_mix=flag)
        keeping_checkpoint_mix(checked.append, lambda args=args: args)(old)
        expected = dataclasses.asdict(checkpoint_mix(old)) if flag else None
        assert args.mix_resumed_from == expected
    assert checked == [old, old]  # Megatron-LM's own check still runs


def test_a_checkpoint_of_a_resumed_mix_is_refused_without_the_flag():
    """Its run served a resumed blend: Megatron's blend at its count would be another stream."""
    state = checkpoint_mix(megatron_args(["0.5", "web", "0.5", "code"], consumed_train_samples=40))
    old = megatron_args(["1", "code"], consumed_train_samples=64,
                        mix_resumed_from=dataclasses.asdict(state))  # fmt: skip
    args = megatron_args(["1", "code"], resume_with_new_mix=False)
    with pytest.raises(ConfigError, match="consumed_train_samples 64.*add --resume-with-new-mix"):
        keeping_checkpoint_mix(lambda checkpoint: None, lambda: args)(old)
    args.resume_with_new_mix = True
    keeping_checkpoint_mix(lambda checkpoint: None, lambda: args)(old)
    assert args.mix_resumed_from == dataclasses.asdict(checkpoint_mix(old))


def test_phases_under_another_global_batch_size_are_refused():
    """The checkpoint's phases started at iteration x 8 samples; at 16 they would start later."""
    old = megatron_args(["1", "code"], consumed_train_samples=48, phase_transition_iterations=[5])
    args = megatron_args(["1", "code"], phase_transition_iterations=[5], global_batch_size=16)
    with pytest.raises(ConfigError, match="global batch size, 8, got 16"):
        keeping_checkpoint_mix(lambda checkpoint: None, lambda: args)(old)
    args.phase_transition_iterations = None  # no phases: another batch size continues
    keeping_checkpoint_mix(lambda checkpoint: None, lambda: args)(old)
    assert args.mix_resumed_from == dataclasses.asdict(checkpoint_mix(old))


def test_the_dataset_config_resumes_from_the_recorded_state():
    state = MixState.from_megatron(["web", "code"], [1, 1], 40)
    args = megatron_args(["1", "code"], mix_resumed_from=dataclasses.asdict(state))
    assert resumed_config(Config(), args) == Config(resume_with_new_mix=state)
    assert resumed_config(Config(), megatron_args(["1", "code"])) == Config()  # first launch
    off = megatron_args(["1", "code"], resume_with_new_mix=False, mix_resumed_from={})
    assert resumed_config(Config(), off) == Config()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"dataloader_type": "cyclic"}, "needs --dataloader-type single, got cyclic"),
        ({"data_path": ["web", "code"]}, "the arguments blend 2 corpora without weights"),
        ({"data_path": ["web"]}, "one corpus, web, .* give it as --data-path 1 web"),
        (
            {
                "data_path": None,
                "train_data_path": ["1", "web"],
                "valid_data_path": ["web"],
                "test_data_path": ["web"],
            },
            "one corpus, web, which is read as itself",
        ),
    ],
)
def test_what_cannot_continue_each_corpus_is_refused(settings, message):
    with pytest.raises(ConfigError, match=message):
        resumed_config(Config(), megatron_args(**{"data_path": ["1", "code"], **settings}))
