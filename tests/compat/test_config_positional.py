"""megaindex's configuration classes take megatron-core's positional arguments: its fields in
its order, the project's own fields keyword-only after them."""

from __future__ import annotations

import dataclasses

import pytest
from megatron.core.datasets.blended_megatron_dataset_config import (
    BlendedMegatronDatasetConfig as MegatronBlendedConfig,
)
from megatron.core.datasets.gpt_dataset import GPTDatasetConfig as MegatronGPTConfig

import megaindex
from megaindex.tokenizer import IdentifiedTokenizer

PAIRS = [
    (megaindex.BlendedMegatronDatasetConfig, MegatronBlendedConfig),
    (megaindex.GPTDatasetConfig, MegatronGPTConfig),
]

#: a value per megatron-core field that differs from its default and passes validation
VALUES = {
    "random_seed": 17,
    "sequence_length": 9,
    "blend": (["a", "b"], [0.25, 0.75]),
    "blend_per_split": None,
    "multiple_validation_sets": True,
    "full_validation": False,
    "split": "7,2,1",
    "num_dataset_builder_threads": 3,
    "path_to_cache": "/tmp/cache",
    "mmap_bin_files": False,
    "tokenizer": IdentifiedTokenizer(3, 70000, {"class": "t"}),
    "mid_level_dataset_surplus": 0.25,
    "allow_ambiguous_pad_tokens": True,
    "fast_cache_load": False,
    "defer_npy_index_mmap": True,
    "reset_position_ids": True,
    "reset_attention_mask": False,
    "eod_mask_loss": True,
    "create_attention_mask": False,
    "drop_last_partial_validation_sequence": False,
    "add_extra_token_to_sequence": False,
    "object_storage_cache_path": "/tmp/idx",
    "data_parallel_size": 4,
    "sequence_parallel_size": 2,
    "hybrid_context_parallel": True,
    "sequences_per_dataset": {"a": [1, 2], "b": [3, 4]},
    "context_parallel_size": 2,
}


def positional_fields(config_class: type) -> list[str]:
    """The fields ``config_class.__init__`` takes by position, in order."""
    return [f.name for f in dataclasses.fields(config_class) if f.init and not f.kw_only]


@pytest.mark.parametrize("ours,theirs", PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_positional_construction_with_megatron_cores_fields(ours, theirs):
    names = positional_fields(theirs)
    assert set(names) <= set(VALUES), sorted(set(names) - set(VALUES))
    args = [VALUES[name] for name in names]
    mine, reference = ours(*args), theirs(*args)
    for field in dataclasses.fields(theirs):
        assert getattr(mine, field.name) == getattr(reference, field.name), field.name


@pytest.mark.parametrize("ours,theirs", PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_megatron_cores_fields_come_first_and_ours_are_keyword_only(ours, theirs):
    assert positional_fields(ours) == positional_fields(theirs)
    own = [f.name for f in dataclasses.fields(ours) if f.init and f.kw_only]
    assert own and not set(own) & {f.name for f in dataclasses.fields(theirs)}
    args = [VALUES[name] for name in positional_fields(theirs)]
    with pytest.raises(TypeError, match="positional argument"):
        ours(*args, 5.0)  # one more than megatron-core takes: not barrier_timeout
