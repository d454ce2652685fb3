"""megaindex: Megatron-compatible index tables and datasets over megafmt corpora.

Drop-in for megatron-core's ``megatron.core.datasets`` GPT path: change the imports and the
same configuration gives the same samples in the same order, sharing index caches both ways.
"""

from importlib.metadata import version
from typing import TYPE_CHECKING

from megafmt.lazy_exports import lazy_exports

# the exports, each imported when first used (megafmt.lazy_exports): no torch at import
if TYPE_CHECKING:
    from megaindex.backends import BackendError, backend
    from megaindex.blend import get_blend_and_blend_per_split, get_blend_from_list
    from megaindex.blended_dataset import BlendedDataset
    from megaindex.budget import StepBatchSizeSchedule, get_train_valid_test_num_samples
    from megaindex.builder import BlendedMegatronDatasetBuilder
    from megaindex.config import (
        BlendedMegatronDatasetConfig,
        GPTDatasetConfig,
        convert_split_vector_to_split_matrix,
        parse_and_normalize_split,
    )
    from megaindex.distributed import BarrierTimeoutError, ConfigMismatchError
    from megaindex.errors import (
        CacheDescriptionError,
        CacheError,
        ConfigError,
        EmptySplitError,
        IndexBuildError,
        MegaindexError,
        MissingCacheError,
        MissingSequenceCountError,
        SampleReadError,
        SequenceCountError,
        StaleCacheError,
        TokenDtypeError,
        TokenRangeError,
    )
    from megaindex.fim_dataset import GPTFIMDataset, GPTFIMDatasetConfig
    from megaindex.gpt_dataset import GPTDataset
    from megaindex.helpers import (
        build_blending_indices,
        build_exhaustive_blending_indices,
        build_sample_idx,
    )
    from megaindex.megatron_dataset import MegatronDataset
    from megaindex.mock import MockGPTDataset, MockGPTLowLevelDataset
    from megaindex.sft_dataset import SFTDataset, SFTDatasetConfig
    from megaindex.utils import Split

__version__ = version("megaindex")

__all__ = [
    "BackendError",
    "BarrierTimeoutError",
    "BlendedDataset",
    "BlendedMegatronDatasetBuilder",
    "BlendedMegatronDatasetConfig",
    "CacheDescriptionError",
    "CacheError",
    "ConfigError",
    "ConfigMismatchError",
    "EmptySplitError",
    "GPTDataset",
    "GPTDatasetConfig",
    "GPTFIMDataset",
    "GPTFIMDatasetConfig",
    "IndexBuildError",
    "MegaindexError",
    "MegatronDataset",
    "MissingCacheError",
    "MissingSequenceCountError",
    "MockGPTDataset",
    "MockGPTLowLevelDataset",
    "SFTDataset",
    "SFTDatasetConfig",
    "SampleReadError",
    "SequenceCountError",
    "Split",
    "StaleCacheError",
    "StepBatchSizeSchedule",
    "TokenDtypeError",
    "TokenRangeError",
    "__version__",
    "backend",
    "build_blending_indices",
    "build_exhaustive_blending_indices",
    "build_sample_idx",
    "convert_split_vector_to_split_matrix",
    "get_blend_and_blend_per_split",
    "get_blend_from_list",
    "get_train_valid_test_num_samples",
    "parse_and_normalize_split",
]

__getattr__, __dir__ = lazy_exports(__name__, __file__, __all__)
