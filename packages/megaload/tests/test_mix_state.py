"""The loader's per-corpus accounts (state version 4's ``mix``) and the resume_with_new_mix
mode, over datasets that account for two corpora by a fixed rule (megaindex's blends are tested
in tests/compat/test_mix_resume_compat.py)."""

import pytest
import torch

from megafmt.protocols import CorpusAccounting
from megaload import DataLoaderConfig, build_pretraining_data_loader
from megaload.errors import LoaderStateError, ResumeError, SamplerError


class Alternating(torch.utils.data.Dataset):
    """Samples ``start`` to ``size``: even ones from corpus 'a', odd ones from 'b'; before
    ``start``, each corpus gave ``offsets``."""

    def __init__(self, size, start=0, offsets=(0, 0)):
        self.size, self.start, self.offsets = size, start, offsets

    def __len__(self):
        return self.size

    def __getitem__(self, idx):
        if idx < self.start:
            raise IndexError(f"sample {idx} was served before")
        return {"tokens": torch.tensor([idx])}

    def mix_state(self, consumed_samples):
        if consumed_samples < self.start:
            raise IndexError(f"{consumed_samples} is before {self.start}")
        done = consumed_samples - self.start
        counts = (self.offsets[0] + (done + 1) // 2, self.offsets[1] + done // 2)
        corpora = {name: {"consumed": n} for name, n in zip("ab", counts, strict=True)}
        return {"corpora": corpora, "segment": None}


def config(**fields):
    return DataLoaderConfig(micro_batch_size=2, num_workers=0, pin_memory=False, **fields)


def test_the_state_records_each_corpus_consumption():
    assert isinstance(Alternating(8), CorpusAccounting)
    loader = build_pretraining_data_loader(Alternating(40), 0, config())
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    state = loader.state_dict()
    assert state["version"] == 4
    assert state["mix"]["corpora"] == {"a": {"consumed": 3}, "b": {"consumed": 3}}


def test_a_state_resumes_over_other_data_only_in_the_mode():
    state = build_pretraining_data_loader(Alternating(40), 10, config()).state_dict()
    resumed = Alternating(60, start=10, offsets=(5, 5))
    with pytest.raises(ResumeError, match="saved over 40 samples, this dataset holds 60"):
        build_pretraining_data_loader(resumed, 0, config()).load_state_dict(state)
    loader = build_pretraining_data_loader(
        resumed, 0, config(resume_with_new_mix=True, data_parallel_size=2, data_parallel_rank=1)
    )
    loader.load_state_dict(state)  # another layout too
    assert next(iter(loader))["tokens"][:, 0].tolist() == [12, 13]
    assert loader.state_dict()["mix"]["corpora"]["a"] == {"consumed": 7}


def test_the_mode_refuses_a_dataset_that_does_not_continue_each_corpus():
    state = build_pretraining_data_loader(Alternating(40), 10, config()).state_dict()
    mode = config(resume_with_new_mix=True)
    wrong = Alternating(60, start=10, offsets=(6, 4))
    with pytest.raises(ResumeError, match="corpus a gave 5 samples before the state was saved, "):
        build_pretraining_data_loader(wrong, 0, mode).load_state_dict(state)
    later = Alternating(60, start=12, offsets=(6, 6))
    with pytest.raises(ResumeError, match="does not continue the state's 10 consumed samples"):
        build_pretraining_data_loader(later, 0, mode).load_state_dict(state)
    cyclic = {**state, "sampler": "cyclic"}
    with pytest.raises(ResumeError, match="saved by the 'cyclic' sampler; resume_with_new_mix"):
        build_pretraining_data_loader(Alternating(60, 10, (5, 5)), 0, mode).load_state_dict(cyclic)
    plain = build_pretraining_data_loader(list(range(40)), 10, config()).state_dict()
    assert plain["mix"] is None
    with pytest.raises(ResumeError, match="records no per-corpus consumption"):
        build_pretraining_data_loader(Alternating(60, 10, (5, 5)), 0, mode).load_state_dict(plain)


def test_the_mode_needs_the_sequential_sampler():
    expected = "resume_with_new_mix needs dataloader_type 'single'.* read the run with"
    with pytest.raises(SamplerError, match=expected):
        config(resume_with_new_mix=True, dataloader_type="cyclic")


class AlternatingValid(Alternating):
    """:class:`Alternating` as a validation split."""

    index_split = "valid"


def test_the_mode_refuses_a_valid_split_over_other_data_naming_the_split():
    """Only the training blend is resumed from a state: a valid (or test) loader's state is
    restored over its own data, which the mode checks as it does any split's."""
    state = build_pretraining_data_loader(AlternatingValid(40), 10, config()).state_dict()
    mode = config(resume_with_new_mix=True)
    same = build_pretraining_data_loader(AlternatingValid(40), 0, mode)
    same.load_state_dict(state)
    assert next(iter(same))["tokens"][:, 0].tolist() == [10, 11]
    other = AlternatingValid(60, start=10, offsets=(6, 4))
    with pytest.raises(
        ResumeError,
        match="reads the valid split, and resume_with_new_mix continues the training split only",
    ):
        build_pretraining_data_loader(other, 0, mode).load_state_dict(state)


class Ordered(Alternating):
    """Alternating, with each corpus's order recorded (a seed)."""

    def __init__(self, size, start=0, offsets=(0, 0), seed=1):
        super().__init__(size, start, offsets)
        self.seed = seed

    def mix_state(self, consumed_samples):
        mix = super().mix_state(consumed_samples)
        for record in mix["corpora"].values():
            record["order"] = {"dataset_path": "x", "random_seed": self.seed}
        return mix


def test_the_mode_refuses_a_dataset_serving_a_corpus_in_another_order():
    state = build_pretraining_data_loader(Ordered(40), 10, config()).state_dict()
    mode = config(resume_with_new_mix=True)
    same = build_pretraining_data_loader(Ordered(60, 10, (5, 5)), 0, mode)
    same.load_state_dict(state)
    other = build_pretraining_data_loader(Ordered(60, 10, (5, 5), seed=2), 0, mode)
    with pytest.raises(ResumeError, match="corpus a: its random_seed was 1 when the state was"):
        other.load_state_dict(state)


@pytest.mark.parametrize(
    ("mix", "match"),
    [
        (
            {"corpora": {"a": {"consumed": "5"}, "b": {"consumed": 5}}},
            r"\['a'\]\['consumed'\] is '5'",
        ),
        (
            {"corpora": {"a": {"consumed": 5.0}, "b": {"consumed": 5}}},
            r"\['a'\]\['consumed'\] is 5.0",
        ),
        ({"corpora": {"a": 5, "b": {"consumed": 5}}}, r"\['corpora'\]\['a'\] is a int"),
        ({"segment": None}, r"loader state\['mix'\] lacks corpora"),
    ],
)
def test_the_mode_refuses_a_damaged_mix_naming_the_key(mix, match):
    state = build_pretraining_data_loader(Alternating(40), 10, config()).state_dict()
    loader = build_pretraining_data_loader(
        Alternating(60, start=10, offsets=(5, 5)), 0, config(resume_with_new_mix=True)
    )
    with pytest.raises(LoaderStateError, match=match):
        loader.load_state_dict({**state, "mix": mix})
