"""megaload: Megatron-LM's samplers and data loader, with exact resume."""

from importlib.metadata import version

from megaload.accounting import consumed_after, num_micro_batches, samples_per_step
from megaload.batch_sampler import SAMPLERS, BatchSampler, SamplerFactory, build_batch_sampler
from megaload.config import DataLoaderConfig
from megaload.errors import (
    MegaloadError,
    NoDataError,
    ResumeError,
    SamplerError,
    SamplerPluginError,
    SimulationError,
)
from megaload.iterators import RerunDataIterator, cyclic_iter
from megaload.loader import (
    MegatronDataLoader,
    build_pretraining_data_loader,
    close_gpu_descriptors,
    collate,
)
from megaload.samplers import (
    MegatronFullValidationSampler,
    MegatronPretrainingRandomSampler,
    MegatronPretrainingSampler,
)

__version__ = version("megaload")

__all__ = [
    "SAMPLERS",
    "BatchSampler",
    "DataLoaderConfig",
    "MegaloadError",
    "MegatronDataLoader",
    "MegatronFullValidationSampler",
    "MegatronPretrainingRandomSampler",
    "MegatronPretrainingSampler",
    "NoDataError",
    "RerunDataIterator",
    "ResumeError",
    "SamplerError",
    "SamplerFactory",
    "SamplerPluginError",
    "SimulationError",
    "__version__",
    "build_batch_sampler",
    "build_pretraining_data_loader",
    "close_gpu_descriptors",
    "collate",
    "consumed_after",
    "cyclic_iter",
    "num_micro_batches",
    "samples_per_step",
]
