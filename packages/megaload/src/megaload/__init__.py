"""megaload: Megatron-LM's samplers and data loader, with exact resume."""

from importlib.metadata import version

from megaload.accounting import consumed_after, num_micro_batches, samples_per_step
from megaload.config import DataLoaderConfig
from megaload.iterators import RerunDataIterator, cyclic_iter
from megaload.loader import (
    MegatronDataLoader,
    build_pretraining_data_loader,
    close_gpu_descriptors,
    collate,
)
from megaload.samplers import (
    SAMPLERS,
    MegatronFullValidationSampler,
    MegatronPretrainingRandomSampler,
    MegatronPretrainingSampler,
    SamplerError,
)

__version__ = version("megaload")

__all__ = [
    "SAMPLERS",
    "DataLoaderConfig",
    "MegatronDataLoader",
    "MegatronFullValidationSampler",
    "MegatronPretrainingRandomSampler",
    "MegatronPretrainingSampler",
    "RerunDataIterator",
    "SamplerError",
    "__version__",
    "build_pretraining_data_loader",
    "close_gpu_descriptors",
    "collate",
    "consumed_after",
    "cyclic_iter",
    "num_micro_batches",
    "samples_per_step",
]
