"""The resume rules each sampler carries, enforced when a loader loads a saved state."""

import pytest
import torch

from megaload import (
    DataLoaderConfig,
    MegatronPretrainingRandomSampler,
    ResumeError,
    SamplerError,
    build_pretraining_data_loader,
)


class Numbers:
    """Sample i is the number i."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, idx):
        return {"tokens": idx}


def cyclic(size, micro, ranks, rank=0, **fields):
    config = DataLoaderConfig(
        micro_batch_size=micro,
        dataloader_type="cyclic",
        data_parallel_size=ranks,
        data_parallel_rank=rank,
        data_sharding=False,
        num_workers=0,
        **fields,
    )
    return build_pretraining_data_loader(Numbers(size), 0, config)


def test_cyclic_without_sharding_resumes_at_another_size_where_the_epochs_agree():
    # 40 samples: at micro-batch 2 the epoch is one permutation of all 40, torch's randperm(40)
    # seeded with the epoch (0), whichever the data-parallel size; 2 ranks deal each global
    # batch of 4 between them, rank r taking its positions r and r + 2
    generator = torch.Generator()
    generator.manual_seed(0)
    order = torch.randperm(40, generator=generator).tolist()
    streams = [iter(cyclic(40, 2, 2, rank)) for rank in range(2)]
    for step in range(3):
        for rank, stream in enumerate(streams):
            expected = [order[4 * step + rank], order[4 * step + rank + 2]]
            assert next(stream)["tokens"].tolist() == expected
    one = cyclic(40, 2, 1)
    state = cyclic(40, 2, 2).state_dict()
    state["consumed_samples"] = 12  # where the two ranks stopped
    one.load_state_dict(state)
    resumed = [batch["tokens"].tolist() for batch in one]
    assert resumed[:3] == [order[12:14], order[14:16], order[16:18]]


@pytest.mark.parametrize(
    "saved,resumed,message",
    [
        (
            dict(size=40, micro=2, ranks=2),
            dict(size=40, micro=2, ranks=2, seed=5),
            "saved by the cyclic sampler with seed=None, this one has seed=5: the samples would",
        ),
        (
            dict(size=40, micro=2, ranks=2),
            dict(size=40, micro=2, ranks=2, balanced=True),
            "with balanced=False, this one has balanced=True",
        ),
        (
            # 42 samples: 2 x 2 ranks leave 2 out of each epoch, 1 rank of 2 none
            dict(size=42, micro=2, ranks=2),
            dict(size=42, micro=2, ranks=1),
            "cannot resume at micro_batch_size 2 x data_parallel_size 1 a run saved at 2 x 2: "
            "its epoch_samples was 40, here it is 42",
        ),
        (
            # the same 40-sample epochs, shuffled as 42 samples (micro-batch 2) or 40 (of 4)
            dict(size=42, micro=2, ranks=2),
            dict(size=42, micro=4, ranks=1),
            "its permutation_size was 42, here it is 40",
        ),
    ],
)
def test_cyclic_refuses_a_state_it_cannot_continue_naming_the_field(saved, resumed, message):
    state = cyclic(**saved).state_dict()
    with pytest.raises(ResumeError, match=message):
        cyclic(**resumed).load_state_dict(state)


def test_the_cyclic_rule_refuses_a_state_of_another_sampler():
    sampler = MegatronPretrainingRandomSampler(None, 40, 0, 2, 0, 2, True)
    with pytest.raises(ResumeError, match="lacks data_sharding, seed, balanced, micro_batch_"):
        sampler.check_resume({})


def test_version_1_states_resume_under_the_rules_they_recorded(caplog):
    # what a loader of the previous release saved, written out by hand
    version_1 = {
        "version": 1,
        "sampler": "cyclic",
        "consumed_samples": 8,
        "total_samples": 40,
        "micro_batch_size": 2,
        "data_parallel_size": 2,
        "data_sharding": True,
    }

    def sharded(ranks):
        config = DataLoaderConfig(
            micro_batch_size=2, dataloader_type="cyclic", data_parallel_size=ranks, num_workers=0
        )
        return build_pretraining_data_loader(Numbers(40), 0, config)

    loader = sharded(2)
    loader.load_state_dict(version_1)
    assert loader.consumed_samples == 8
    assert "does not record" in caplog.text and "seed" in caplog.text
    expected = sharded(2)
    expected.load_state_dict(expected.state_dict() | {"consumed_samples": 8})
    assert [b["tokens"].tolist() for b in loader] == [b["tokens"].tolist() for b in expected]
    with pytest.raises(ResumeError, match="data_parallel_size 4 a run saved at 2"):
        sharded(4).load_state_dict(version_1)


def test_loader_states_of_another_version_or_sampler_are_refused():
    config = DataLoaderConfig(micro_batch_size=2, num_workers=0)
    loader = build_pretraining_data_loader(Numbers(8), 0, config)
    with pytest.raises(ResumeError, match="loader state version 3 is not 2"):
        loader.load_state_dict({**loader.state_dict(), "version": 3})
    with pytest.raises(ResumeError, match="saved by the 'cyclic' sampler, this loader uses 'sin"):
        loader.load_state_dict(cyclic(8, 2, 1).state_dict())
    assert issubclass(ResumeError, SamplerError)  # callers that catch SamplerError keep working
