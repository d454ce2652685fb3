"""The resume rules each sampler carries, enforced when a loader loads a saved state: what the
state records, the loaders that are refused (naming the field), and exact re-shards."""

import logging
import re

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
    """Sample i is the number i; the digest names the dataset (``DescribedDataset``)."""

    def __init__(self, size, digest="d41d8cd98f00b204e9800998ecf8427e"):
        self.size = size
        self.unique_description_hash = digest

    def __len__(self):
        return self.size

    def __getitem__(self, idx):
        return {"tokens": idx}


def cyclic(size, micro, ranks, rank=0, **fields):
    fields = {"data_sharding": False, **fields}
    return loader_of("cyclic", size, micro, ranks, rank, **fields)


def loader_of(kind, size, micro, ranks, rank=0, dataset=None, **fields):
    config = DataLoaderConfig(
        micro_batch_size=micro,
        dataloader_type=kind,
        data_parallel_size=ranks,
        data_parallel_rank=rank,
        num_workers=0,
        **fields,
    )
    return build_pretraining_data_loader(dataset or Numbers(size), 0, config)


def take(loader, steps):
    """The sample numbers of the next ``steps`` batches of ``loader``."""
    iterator = iter(loader)
    return [i for _ in range(steps) for i in next(iterator)["tokens"].tolist()]


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
    with pytest.raises(ResumeError, match="data_parallel_size=2, this loader has data_parallel_"):
        one.load_state_dict(state)
    one.load_state_dict(state, reshard=True)
    resumed = [batch["tokens"].tolist() for batch in one]
    assert resumed[:3] == [order[12:14], order[14:16], order[16:18]]
    # the rest of the epoch: every sample the two ranks did not read, once
    assert sorted(order[:12] + [i for batch in resumed[:14] for i in batch]) == list(range(40))


@pytest.mark.parametrize(
    "saved,resumed,message",
    [
        (
            # 42 samples: 2 x 2 ranks leave 2 out of each epoch, 1 rank of 2 none
            dict(size=42, micro=2, ranks=2),
            dict(size=42, micro=2, ranks=1),
            re.escape(
                "cannot re-shard exactly a run that stopped 4 samples into epoch 0 at "
                "micro_batch_size 2 x data_parallel_size 2 (epoch_samples 40, permutation_size "
                "42, data_sharding False) into micro_batch_size 2 x data_parallel_size 1 "
                "(epoch_samples 42, permutation_size 42): re-shard at the end of an epoch "
                "(consumed_samples 40)"
            ),
        ),
        (
            # the same 40-sample epochs, shuffled as 42 samples (micro-batch 2) or 40 (of 4)
            dict(size=42, micro=2, ranks=2),
            dict(size=42, micro=4, ranks=1),
            "permutation_size 42, data_sharding False\\) into micro_batch_size 4 x "
            "data_parallel_size 1 \\(epoch_samples 40, permutation_size 40\\)",
        ),
        (
            # each rank shuffles its own bucket, which depends on the size
            dict(size=40, micro=2, ranks=2, data_sharding=True),
            dict(size=40, micro=2, ranks=4, data_sharding=True),
            "stopped 4 samples into epoch 0 .* data_sharding True",
        ),
    ],
)
def test_cyclic_refuses_to_reshard_mid_epoch_where_it_is_not_exact(saved, resumed, message):
    state = cyclic(**saved).state_dict() | {"consumed_samples": 4}
    with pytest.raises(ResumeError, match=message):
        cyclic(**resumed).load_state_dict(state, reshard=True)


@pytest.mark.parametrize("kind", ["single", "cyclic"])
@pytest.mark.parametrize(
    "field,value",
    [
        ("seed", 5),
        ("micro_batch_size", 4),
        ("global_batch_size", 16),
        ("data_parallel_size", 4),
        ("data_parallel_rank", 1),
        ("data_sharding", False),
        ("drop_last", False),
        ("pad_last_batch", True),
        ("balanced", True),
    ],
)
def test_a_loader_that_differs_in_what_defines_the_order_is_refused(kind, field, value):
    saved = {"micro": 2, "ranks": 2, "global_batch_size": 8}
    state = loader_of(kind, 40, **saved).state_dict()
    fields = {"micro_batch_size": 2, "data_parallel_size": 2, "global_batch_size": 8}
    fields |= {"data_sharding": True, "drop_last": True, "pad_last_batch": False}
    fields |= {"balanced": False, "seed": None, "data_parallel_rank": 0}
    mine = fields | {field: value}
    loader = loader_of(
        kind,
        40,
        mine.pop("micro_batch_size"),
        mine.pop("data_parallel_size"),
        mine.pop("data_parallel_rank"),
        **mine,
    )
    message = f"the state was saved with {field}={fields[field]!r}, this loader has {field}="
    with pytest.raises(ResumeError, match=message):
        loader.load_state_dict(state)


def test_the_state_records_everything_that_defines_the_order():
    loader = loader_of("cyclic", 40, 2, 2, 1, global_batch_size=8, seed=3)
    state = loader.state_dict()
    assert state["version"] == 4
    assert state["mix"] is None  # a dataset that keeps no per-corpus accounts
    assert state["dataset_digest"] == "d41d8cd98f00b204e9800998ecf8427e"
    assert state["layout"] == {
        "micro_batch_size": 2,
        "global_batch_size": 8,
        "data_parallel_size": 2,
        "data_parallel_rank": 1,
    }
    assert state["options"] == {
        "data_sharding": True,
        "drop_last": True,
        "pad_last_batch": False,
        "balanced": False,
        "seed": 3,
    }


def test_another_dataset_of_the_same_length_is_refused_by_its_digest():
    state = loader_of("single", 40, 2, 1).state_dict()
    other = loader_of("single", 40, 2, 1, dataset=Numbers(40, digest="0" * 32))
    with pytest.raises(ResumeError, match="digest d41d8cd98f00b204e9800998ecf8427e, this datas"):
        other.load_state_dict(state)
    with pytest.raises(ResumeError, match="digest"):
        other.load_state_dict(state, reshard=True)  # a re-shard keeps the data


def test_a_reshard_of_the_sequential_sampler_reads_every_sample_once():
    # 3 steps of 2 ranks x 2 samples, then micro-batch 3 on 4 ranks from where they stopped
    before = [take(loader_of("single", 48, 2, 2, rank), 3) for rank in range(2)]
    state = loader_of("single", 48, 2, 2).state_dict() | {"consumed_samples": 12}
    after = []
    for rank in range(4):
        loader = loader_of("single", 48, 3, 4, rank)
        loader.load_state_dict(state, reshard=True)
        after.append(take(loader, 3))
    assert sorted(i for share in before + after for i in share) == list(range(48))
    assert after[0] == [12, 13, 14, 24, 25, 26, 36, 37, 38]


def test_a_reshard_of_the_sharded_cyclic_sampler_at_the_end_of_an_epoch_is_exact():
    # one epoch of 40 samples read by 2 ranks with data sharding, then the next by 4 ranks
    first_epoch = [take(loader_of("cyclic", 40, 2, 2, rank), 10) for rank in range(2)]
    assert sorted(i for share in first_epoch for i in share) == list(range(40))
    state = loader_of("cyclic", 40, 2, 2).state_dict() | {"consumed_samples": 40}
    resharded, fresh = [], []
    for rank in range(4):
        loader = loader_of("cyclic", 40, 2, 4, rank)
        loader.load_state_dict(state, reshard=True)
        assert loader.consumed_samples == 40  # epoch 1 starts at 1 x 40 in this layout too
        resharded.append(take(loader, 5))
        # what a run at 4 ranks reads in its epoch 1, seeded by the epoch (1)
        generator = torch.Generator()
        generator.manual_seed(1)
        order = torch.randperm(10, generator=generator).tolist()
        fresh.append([10 * rank + i for i in order])
    assert resharded == fresh
    assert sorted(i for share in resharded for i in share) == list(range(40))


def test_a_reshard_converts_the_count_to_the_new_layout_at_an_epoch_end():
    # 42 samples: epochs of 40 at 2 x 2, of 42 at 2 x 1; after 2 epochs the count is 80 there,
    # 84 here
    state = cyclic(42, 2, 2).state_dict() | {"consumed_samples": 80}
    loader = cyclic(42, 2, 1)
    loader.load_state_dict(state, reshard=True)
    assert loader.consumed_samples == 84
    assert loader.state_dict()["consumed_samples"] == 84


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
    with pytest.raises(ResumeError, match="saved with data_parallel_size=2, this loader has da"):
        sharded(4).load_state_dict(version_1)
    with pytest.raises(ResumeError, match="stopped 8 samples into epoch 0 at micro_batch_size 2"):
        sharded(4).load_state_dict(version_1, reshard=True)


def test_version_2_states_resume_checking_what_they_recorded(caplog):
    # what a loader of the previous release saved (no layout, options or digest), by hand
    sampler_state = {
        "data_sharding": True,
        "seed": None,
        "balanced": False,
        "micro_batch_size": 2,
        "data_parallel_size": 2,
        "epoch_samples": 40,
        "permutation_size": 20,
    }
    version_2 = {
        "version": 2,
        "sampler": "cyclic",
        "consumed_samples": 8,
        "total_samples": 40,
        "sampler_state": sampler_state,
    }
    loader = loader_of("cyclic", 40, 2, 2)
    with caplog.at_level(logging.WARNING):
        loader.load_state_dict(version_2)
    assert "(version 2) does not record data_parallel_rank, drop_last, global_batch_size, " in (
        caplog.text
    )
    assert loader.consumed_samples == 8
    with pytest.raises(ResumeError, match="saved with seed=None, this loader has seed=7"):
        loader_of("cyclic", 40, 2, 2, seed=7).load_state_dict(version_2)
    with pytest.raises(ResumeError, match="saved with micro_batch_size=2, this loader has micro"):
        loader_of("cyclic", 40, 4, 2).load_state_dict(version_2)


def test_loader_states_of_another_version_or_sampler_are_refused():
    config = DataLoaderConfig(micro_batch_size=2, num_workers=0)
    loader = build_pretraining_data_loader(Numbers(8), 0, config)
    with pytest.raises(
        ResumeError, match=r"loader state\['version'\] is 5; expected one of 1, 2, 3, 4"
    ):
        loader.load_state_dict({**loader.state_dict(), "version": 5})
    with pytest.raises(ResumeError, match="saved by the 'cyclic' sampler, this loader uses 'sin"):
        loader.load_state_dict(cyclic(8, 2, 1).state_dict())
    assert issubclass(ResumeError, SamplerError)  # callers that catch SamplerError keep working


@pytest.mark.parametrize("consumed", [9, 10**6])
def test_a_state_refused_for_its_count_leaves_the_loader_as_it_was(consumed):
    loader = loader_of("single", 8, 2, 1)
    assert take(loader, 1) == [0, 1]
    saved = loader.state_dict()
    with pytest.raises(SamplerError, match=f"consumed_samples {consumed} is outside"):
        loader.load_state_dict({**saved, "consumed_samples": consumed})
    assert loader.consumed_samples == 2 and loader.state_dict() == saved
    assert take(loader, 3) == [2, 3, 4, 5, 6, 7]  # it goes on where it stood
