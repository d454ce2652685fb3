import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from megafmt.protocols import CollatedBatch
from megaload import (
    DataLoaderConfig,
    MegaloadError,
    MegatronDataLoader,
    NoDataError,
    ResumeError,
    SamplerError,
    SamplerPluginError,
    SimulationError,
    build_pretraining_data_loader,
    close_gpu_descriptors,
    collate,
    cyclic_iter,
    num_micro_batches,
    samples_per_step,
)
from megaload import loader as loader_module

DATASET_CODE = '''
import enum

import torch

Split = enum.Enum("Split", "train valid test")  # megatron-core's names its splits so


class Numbers(torch.utils.data.Dataset):
    """Sample i is the tokens [i, i] (and a split for the loader to find)."""

    def __init__(self, size, split="train"):
        self.size, self.index_split = size, Split[split]

    def __len__(self):
        return self.size

    def __getitem__(self, idx):
        return {"tokens": torch.tensor([idx, idx])}
'''
namespace: dict = {}
exec(DATASET_CODE, namespace)
Numbers = namespace["Numbers"]


def firsts(batches):
    return [batch["tokens"][:, 0].tolist() for batch in batches]


def test_batches_follow_the_sampler():
    config = DataLoaderConfig(
        micro_batch_size=2, data_parallel_rank=1, data_parallel_size=2, num_workers=0
    )
    loader = build_pretraining_data_loader(Numbers(10), 0, config)
    assert firsts(loader) == [[2, 3], [6, 7]]
    assert loader.consumed_samples == 8


def test_external_and_missing_datasets():
    config = DataLoaderConfig(micro_batch_size=2, dataloader_type="external")
    dataset = Numbers(4)
    assert build_pretraining_data_loader(dataset, 0, config) is dataset
    assert build_pretraining_data_loader(None, 0, config) is None


def test_a_short_last_batch_counts_only_the_samples_it_holds():
    # 10 samples, 2 ranks of 2, drop_last off: the third global batch holds samples 8 and 9
    config = DataLoaderConfig(
        micro_batch_size=2, data_parallel_size=2, drop_last=False, num_workers=0
    )
    loader = build_pretraining_data_loader(Numbers(10), 0, config)
    assert firsts(loader) == [[0, 1], [4, 5], [8, 9]]
    assert loader.consumed_samples == 10
    resumed = build_pretraining_data_loader(Numbers(10), 0, config)
    resumed.load_state_dict(loader.state_dict())  # a clean end of data, not an error
    assert firsts(resumed) == []


def test_validation_uses_eval_batch_size_and_full_validation():
    # the training step's global batch of 8 is no multiple of the validation batch of 3
    config = DataLoaderConfig(
        micro_batch_size=2, global_batch_size=8, eval_micro_batch_size=3, num_workers=0
    )
    assert firsts(build_pretraining_data_loader(Numbers(7, "valid"), 0, config)) == [
        [0, 1, 2],
        [3, 4, 5],
    ]
    full = DataLoaderConfig(
        micro_batch_size=2,
        full_validation=True,
        data_parallel_size=2,
        data_parallel_rank=1,
        num_workers=0,
    )
    loader = build_pretraining_data_loader(Numbers(5, "valid"), 0, full)
    assert loader.config.dataloader_type == "full_validation"
    assert firsts(loader) == [[1], [3]]


def test_eval_loaders_take_the_eval_global_batch_size():
    config = DataLoaderConfig(
        micro_batch_size=2,
        global_batch_size=8,
        eval_micro_batch_size=3,
        eval_global_batch_size=12,
        data_parallel_size=2,
    )
    assert config.for_split("valid").global_batch_size == 12
    assert config.for_split("test").micro_batch_size == 3
    assert config.for_split("train") is config
    # without it, the training step's where the micro-batch is the same, else none
    same = DataLoaderConfig(micro_batch_size=2, global_batch_size=8, eval_micro_batch_size=2)
    assert same.for_split("valid").global_batch_size == 8
    assert replace(config, eval_global_batch_size=None).for_split("test").global_batch_size is None
    with pytest.raises(SamplerError, match="eval_global_batch_size 10 is not a multiple of "):
        replace(config, eval_global_batch_size=10).for_split("valid")


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["single", "cyclic"])
def test_state_resumes_on_the_next_batch_in_process(kind, workers):
    config = DataLoaderConfig(
        micro_batch_size=2,
        dataloader_type=kind,
        num_workers=workers,
        data_parallel_size=2,
        data_parallel_rank=0,
    )
    # the sequential sampler ends with the data (10 batches on this rank); the cyclic one
    # goes on into the next epochs
    steps, cut = (10, 6) if kind == "single" else (14, 6)

    def take(loader, count):
        stream = cyclic_iter(loader) if kind == "cyclic" else iter(loader)
        return [next(stream)["tokens"][:, 0].tolist() for _ in range(count)]

    expected = take(build_pretraining_data_loader(Numbers(40), 0, config), steps)
    loader = build_pretraining_data_loader(Numbers(40), 0, config)
    head = take(loader, cut)
    state = loader.state_dict()
    assert state["consumed_samples"] == cut * 4
    again = build_pretraining_data_loader(Numbers(40), 0, config)
    again.load_state_dict(state)
    assert head + take(again, steps - cut) == expected
    if kind == "single":
        assert list(again) == []  # every sample was read: a clean end, not an assertion


@pytest.mark.parametrize("workers", [0, 2])
def test_kill_and_resume_in_a_new_process(tmp_path, workers):
    script = textwrap.dedent(DATASET_CODE) + textwrap.dedent(
        f"""
        import json, sys
        from megaload import DataLoaderConfig, build_pretraining_data_loader, cyclic_iter
        config = DataLoaderConfig(micro_batch_size=3, dataloader_type="cyclic",
                                  num_workers={workers}, data_parallel_size=1)
        loader = build_pretraining_data_loader(Numbers(50), 0, config)
        if sys.argv[1] == "resume":
            loader.load_state_dict(json.load(open(sys.argv[2])))
        stream = cyclic_iter(loader)
        out = []
        for step in range(int(sys.argv[3])):
            out.append(next(stream)["tokens"][:, 0].tolist())
        if sys.argv[1] == "first":
            json.dump(loader.state_dict(), open(sys.argv[2], "w"))
        print(json.dumps(out))
        """
    )
    state = str(tmp_path / "state.json")

    def run(*argv):
        result = subprocess.run(
            [sys.executable, "-c", script, *argv], capture_output=True, text=True, check=True
        )
        return json.loads(result.stdout.strip().splitlines()[-1])

    whole = run("whole", state, "30")
    first = run("first", state, "12")  # the process ends here, mid-epoch
    rest = run("resume", state, "18")
    assert first + rest == whole


def test_the_sequential_sampler_resumes_at_another_data_parallel_size():
    def global_batches(dp, consumed, steps):
        loaders = [
            build_pretraining_data_loader(
                Numbers(64),
                consumed,
                DataLoaderConfig(
                    micro_batch_size=2, data_parallel_size=dp, data_parallel_rank=r, num_workers=0
                ),
            )
            for r in range(dp)
        ]
        iterators = [iter(loader) for loader in loaders]
        out = []
        for _ in range(steps):
            out.append(sorted(i for it in iterators for i in next(it)["tokens"][:, 0].tolist()))
        return out, loaders[0].state_dict()

    before, state = global_batches(2, 0, 3)  # 3 steps of 4 samples
    assert state["consumed_samples"] == 12
    after, _ = global_batches(4, state["consumed_samples"], 2)
    assert before + after == [
        list(range(0, 4)),
        list(range(4, 8)),
        list(range(8, 12)),
        list(range(12, 20)),
        list(range(20, 28)),
    ]


def test_cyclic_with_sharding_refuses_another_data_parallel_size():
    saved = build_pretraining_data_loader(
        Numbers(64),
        0,
        DataLoaderConfig(
            micro_batch_size=2, dataloader_type="cyclic", data_parallel_size=2, num_workers=0
        ),
    ).state_dict()
    other = build_pretraining_data_loader(
        Numbers(64),
        0,
        DataLoaderConfig(
            micro_batch_size=2, dataloader_type="cyclic", data_parallel_size=4, num_workers=0
        ),
    )
    with pytest.raises(
        SamplerError,
        match="saved with data_parallel_size=2, this loader has data_parallel_size=4: pass "
        "reshard=True",
    ):
        other.load_state_dict(saved)
    with pytest.raises(SamplerError, match="saved over 64 samples, this dataset holds 10"):
        build_pretraining_data_loader(
            Numbers(10),
            0,
            DataLoaderConfig(
                micro_batch_size=2, dataloader_type="cyclic", data_parallel_size=2, num_workers=0
            ),
        ).load_state_dict(saved)


def test_the_end_of_the_data_is_a_clean_end():
    config = DataLoaderConfig(micro_batch_size=2, num_workers=0)
    loader = build_pretraining_data_loader(Numbers(8), 8, config)
    assert list(loader) == []


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(micro_batch_size=0), "micro_batch_size must be positive"),
        (
            dict(micro_batch_size=2, dataloader_type="batch"),
            "'batch' is not supported; expected 'external' or a sampler: cyclic, full_validation",
        ),
        (dict(micro_batch_size=2, data_parallel_size=2, data_parallel_rank=2), "outside"),
        (
            dict(micro_batch_size=2, global_batch_size=6, data_parallel_size=2),
            "global_batch_size 6 is not a multiple of micro_batch_size 2 x data_parallel_size 2",
        ),
    ],
)
def test_config_errors(fields, message):
    with pytest.raises(SamplerError, match=message):
        DataLoaderConfig(**fields)


def test_worker_start_closes_inherited_gpu_descriptors(monkeypatch):
    read, write = os.pipe()
    real = os.readlink
    monkeypatch.setattr(
        loader_module.os,
        "readlink",
        lambda path: "/dev/nvidia0" if path == f"/proc/self/fd/{read}" else real(path),
    )
    close_gpu_descriptors(0)
    with pytest.raises(OSError):
        os.fstat(read)
    os.fstat(write)
    os.close(write)


def test_accounting():
    assert num_micro_batches(256, 2, 16) == 8
    assert samples_per_step(2, 16, 8) == 256
    with pytest.raises(ValueError, match="not a multiple"):
        num_micro_batches(100, 3, 2)


class Collated(torch.utils.data.Dataset):
    """Batches come collated (``megafmt.protocols.CollatedBatch``), with a value torch's
    collation would turn into a tensor: the loader must take the collation as it is."""

    def __len__(self):
        return 8

    def __getitem__(self, idx):
        raise AssertionError("batches are read with __getitems__")

    def __getitems__(self, indices):
        return CollatedBatch({"tokens": torch.tensor(indices), "first": [indices[0]] * 2})


@pytest.mark.parametrize("workers", [0, 2])
def test_a_collated_batch_is_taken_as_it_is(workers):
    config = DataLoaderConfig(micro_batch_size=2, num_workers=workers)
    batches = list(build_pretraining_data_loader(Collated(), 0, config))
    assert [batch["tokens"].tolist() for batch in batches] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [batch["first"] for batch in batches] == [[0, 0], [2, 2], [4, 4], [6, 6]]
    batch = Collated().__getitems__([3, 4])
    assert collate(batch) is batch.collated


def test_every_megaload_error_is_a_megaload_error():
    for error in (SamplerError, ResumeError, SamplerPluginError, NoDataError, SimulationError):
        assert issubclass(error, MegaloadError)
    assert issubclass(SamplerError, ValueError) and issubclass(NoDataError, RuntimeError)
    with pytest.raises(MegaloadError, match="micro_batch_size must be positive"):
        DataLoaderConfig(micro_batch_size=0)


def test_loader_is_a_stateful_dataloader_lookalike():
    loader = MegatronDataLoader(Numbers(8), 0, DataLoaderConfig(micro_batch_size=2, num_workers=0))
    assert callable(loader.state_dict) and callable(loader.load_state_dict)
    assert isinstance(loader.state_dict()["version"], int)
    assert SimpleNamespace(**loader.state_dict()).sampler == "single"
