"""Samplers as plugins: one factory signature, shipped and third-party samplers alike, checked
against the BatchSampler protocol, each with its own resume rules."""

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from megaload import (
    SAMPLERS,
    BatchSampler,
    DataLoaderConfig,
    MegatronFullValidationSampler,
    MegatronPretrainingRandomSampler,
    MegatronPretrainingSampler,
    ResumeError,
    SamplerPluginError,
    build_pretraining_data_loader,
)

ROWS_CODE = '''
import torch

from megafmt.protocols import CollatedBatch


class Rows(torch.utils.data.Dataset):
    """Sample i is the tokens [i, i]; a batch comes collated, as megaindex's datasets give it."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, idx):
        return {"tokens": torch.tensor([idx, idx])}

    def __getitems__(self, indices):
        return CollatedBatch({"tokens": torch.tensor([[i, i] for i in indices])})
'''

SAMPLER_CODE = '''
from megaload import ResumeError


class EveryOther:
    """A third-party sampler: the even samples in order, each rank a micro-batch of each global
    batch of them. Its own resume rule: only at the data-parallel size it was saved at."""

    def __init__(self, dataset, consumed_samples, config):
        self.evens = list(range(0, len(dataset), 2))
        self.consumed_samples = consumed_samples
        self.size = config.micro_batch_size
        self.rank, self.ranks = config.data_parallel_rank, config.data_parallel_size

    def __iter__(self):
        width = self.size * self.ranks
        for start in range(self.consumed_samples, len(self.evens) - width + 1, width):
            yield self.evens[start + self.rank * self.size : start + (self.rank + 1) * self.size]

    def __len__(self):
        return len(self.evens)

    def next_consumed(self, consumed_samples):
        return consumed_samples + self.size * self.ranks

    def resume_state(self):
        return {"data_parallel_size": self.ranks}

    def check_resume(self, saved):
        if saved["data_parallel_size"] != self.ranks:
            raise ResumeError(
                f"every_other: data_parallel_size {saved['data_parallel_size']} was saved, "
                f"{self.ranks} is asked"
            )


def not_a_sampler(dataset, consumed_samples, config):
    return [[0, 2]]
'''
namespace: dict = {}
exec(ROWS_CODE + SAMPLER_CODE, namespace)
Rows, EveryOther, not_a_sampler = (namespace[n] for n in ("Rows", "EveryOther", "not_a_sampler"))


def firsts(batches):
    return [batch["tokens"][:, 0].tolist() for batch in batches]


@pytest.fixture
def registered():
    """Register samplers for one test: ``registered(name, factory)``."""
    names = []

    def register(name, factory):
        SAMPLERS.register(name, factory)
        names.append(name)

    yield register
    for name in names:
        SAMPLERS.unregister(name)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_registered_sampler_builds_iterates_saves_and_resumes(registered, workers):
    registered("every_other", EveryOther)
    config = DataLoaderConfig(
        micro_batch_size=2, dataloader_type="every_other", num_workers=workers
    )
    loader = build_pretraining_data_loader(Rows(16), 0, config)
    stream = iter(loader)
    assert firsts(next(stream) for _ in range(2)) == [[0, 2], [4, 6]]
    state = json.loads(json.dumps(loader.state_dict()))  # as a checkpoint keeps it
    assert state["sampler"] == "every_other" and state["consumed_samples"] == 4
    assert state["sampler_state"] == {"data_parallel_size": 1}
    again = build_pretraining_data_loader(Rows(16), 0, config)
    again.load_state_dict(state)
    assert firsts(again) == [[8, 10], [12, 14]]
    wider = build_pretraining_data_loader(Rows(16), 0, replace(config, data_parallel_size=2))
    with pytest.raises(ResumeError, match="saved with data_parallel_size=1, this loader has da"):
        wider.load_state_dict(state)
    # a re-shard asks the sampler, which does not implement Reshardable
    with pytest.raises(ResumeError, match="'every_other' sampler cannot re-shard a run .* does "):
        wider.load_state_dict(state, reshard=True)
    # where the layout agrees, the sampler's own rules still decide
    with pytest.raises(ResumeError, match="every_other: data_parallel_size 2 was saved, 1 is"):
        again.load_state_dict({**state, "sampler_state": {"data_parallel_size": 2}})


def test_a_plugin_that_builds_no_batch_sampler_is_named(registered):
    registered("bare", not_a_sampler)
    config = DataLoaderConfig(micro_batch_size=2, dataloader_type="bare", num_workers=0)
    with pytest.raises(
        SamplerPluginError,
        match=r"megaload sampler 'bare' \(<function not_a_sampler .*\) built a list, not a "
        r"megaload BatchSampler: expected __iter__, __len__, a settable consumed_samples",
    ):
        build_pretraining_data_loader(Rows(4), 0, config)


def test_a_sampler_declared_as_an_entry_point(tmp_path):
    """A distribution on the path that declares ``megaload.samplers`` entry points, as an
    installed package does: its sampler is built by name and listed; its broken one is named."""
    (tmp_path / "every_other_sampler.py").write_text(SAMPLER_CODE)
    info = tmp_path / "every_other_sampler-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: every-other-sampler\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text(
        "[megaload.samplers]\n"
        "every_other = every_other_sampler:EveryOther\n"
        "broken = every_other_sampler:not_a_sampler\n"
    )
    script = ROWS_CODE + (
        "import json\n"
        "from megafmt.cli.main import main\n"
        "from megaload import DataLoaderConfig, SamplerPluginError\n"
        "from megaload import build_pretraining_data_loader as build\n"
        "config = DataLoaderConfig(micro_batch_size=2, dataloader_type='every_other',\n"
        "                          num_workers=0)\n"
        "print(json.dumps([b['tokens'][:, 0].tolist() for b in build(Rows(12), 4, config)]))\n"
        "try:\n"
        "    build(Rows(12), 0, DataLoaderConfig(micro_batch_size=2, dataloader_type='broken'))\n"
        "except SamplerPluginError as error:\n"
        "    print(error)\n"
        "main(['load', 'samplers'])\n"
    )
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        check=True,
    )
    built, error, *listed = result.stdout.splitlines()
    assert json.loads(built) == [[8, 10]]  # the evens 0..10, the first 4 consumed
    assert error.startswith(
        "megaload sampler 'broken' (every_other_sampler:not_a_sampler) built a list"
    )
    assert [line.split() for line in listed] == [
        ["broken", "every_other_sampler:not_a_sampler"],
        ["cyclic", "megaload.samplers:MegatronPretrainingRandomSampler.from_config"],
        ["every_other", "every_other_sampler:EveryOther"],
        ["full_validation", "megaload.samplers:MegatronFullValidationSampler.from_config"],
        ["hybrid_cp", "megaload.hybrid_cp_sampler:HybridCPMegatronPretrainingSampler.from_config"],
        ["single", "megaload.samplers:MegatronPretrainingSampler.from_config"],
    ]


def test_the_shipped_samplers_register_through_the_same_factories():
    assert SAMPLERS.get("single") == MegatronPretrainingSampler.from_config
    assert SAMPLERS.get("cyclic") == MegatronPretrainingRandomSampler.from_config
    assert SAMPLERS.get("full_validation") == MegatronFullValidationSampler.from_config
    # and each builds what Megatron-LM's constructor builds
    config = DataLoaderConfig(
        micro_batch_size=2, data_parallel_rank=1, data_parallel_size=2, drop_last=False
    )
    for name, direct in [
        ("single", MegatronPretrainingSampler(10, 4, 2, 1, 2, False)),
        ("cyclic", MegatronPretrainingRandomSampler(None, 10, 4, 2, 1, 2, True)),
        ("full_validation", MegatronFullValidationSampler(10, 1, 2, consumed_samples=4)),
    ]:
        built = SAMPLERS.get(name)(Rows(10), 4, config)
        assert isinstance(built, BatchSampler) and isinstance(direct, BatchSampler)
        assert list(built) == list(direct), name
