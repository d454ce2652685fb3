"""megaload.megatron: Megatron-LM's loader functions read its arguments; what they refuse."""

from __future__ import annotations

import types

import pytest

from megaload import DataLoaderConfig, SamplerError
from megaload.megatron import build_pretraining_data_loader, data_loader_config


def megatron_args(**overrides: object) -> types.SimpleNamespace:
    settings = {
        "micro_batch_size": 2,
        "global_batch_size": 8,
        "dataloader_type": None,
        "eval_micro_batch_size": 3,
        "num_workers": 0,
        "data_sharding": False,
        "full_validation": True,
        "hybrid_context_parallel": False,
    }
    settings.update(overrides)
    return types.SimpleNamespace(**settings)


def test_the_config_carries_megatron_s_arguments() -> None:
    config = data_loader_config(megatron_args(), data_parallel_rank=1, data_parallel_size=2)
    assert config == DataLoaderConfig(
        micro_batch_size=2,
        global_batch_size=8,
        dataloader_type="single",  # Megatron-LM's parser turns None into 'single'
        eval_micro_batch_size=3,
        eval_global_batch_size=8,  # missing from the arguments: the training step's
        data_parallel_rank=1,
        data_parallel_size=2,
        num_workers=0,
        data_sharding=False,
        full_validation=True,
    )


def test_hybrid_context_parallel_reads_with_the_hybrid_cp_sampler() -> None:
    args = megatron_args(hybrid_context_parallel=True)
    config = data_loader_config(args, data_parallel_rank=0, data_parallel_size=2)
    assert config.dataloader_type == "hybrid_cp"
    with pytest.raises(SamplerError, match="single dataloader type only, found --dataloader-type"):
        data_loader_config(megatron_args(hybrid_context_parallel=True, dataloader_type="cyclic"))


def test_no_dataset_gives_no_loader_as_in_megatron() -> None:
    assert build_pretraining_data_loader(None, 0, args=megatron_args()) is None


def test_a_split_of_an_unknown_name_is_refused() -> None:
    config = DataLoaderConfig(micro_batch_size=1)
    with pytest.raises(SamplerError, match="declares split 'validation'"):
        config.for_split("validation")
    assert config.for_split("train") is config and config.for_split(None) is config
