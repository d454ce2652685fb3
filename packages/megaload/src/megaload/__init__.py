"""megaload: Megatron-LM's samplers and data loader, with exact resume."""

from importlib.metadata import version
from typing import TYPE_CHECKING

from megafmt.lazy_exports import lazy_exports

# the exports, each imported when first used (megafmt.lazy_exports): no torch at import
if TYPE_CHECKING:
    from megaload.accounting import (
        backfilled_consumed,
        consumed_after,
        consumed_in_phase,
        num_micro_batches,
        samples_per_step,
    )
    from megaload.batch_sampler import (
        SAMPLERS,
        BatchSampler,
        GlobalBatchSampler,
        SamplerFactory,
        build_batch_sampler,
    )
    from megaload.config import DataLoaderConfig
    from megaload.errors import (
        BackfillError,
        LoaderStateError,
        MegaloadError,
        NoDataError,
        PhaseDataError,
        ResumeError,
        SamplerError,
        SamplerPluginError,
        SamplerTypeError,
        SchedulingError,
        SimulationError,
        WorkerDiedError,
    )
    from megaload.hybrid_cp_sampler import HybridCPMegatronPretrainingSampler
    from megaload.hybrid_cp_schedule import BalancedCPScheduler
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
    "BackfillError",
    "BalancedCPScheduler",
    "BatchSampler",
    "DataLoaderConfig",
    "GlobalBatchSampler",
    "HybridCPMegatronPretrainingSampler",
    "LoaderStateError",
    "MegaloadError",
    "MegatronDataLoader",
    "MegatronFullValidationSampler",
    "MegatronPretrainingRandomSampler",
    "MegatronPretrainingSampler",
    "NoDataError",
    "PhaseDataError",
    "RerunDataIterator",
    "ResumeError",
    "SamplerError",
    "SamplerFactory",
    "SamplerPluginError",
    "SamplerTypeError",
    "SchedulingError",
    "SimulationError",
    "WorkerDiedError",
    "__version__",
    "backfilled_consumed",
    "build_batch_sampler",
    "build_pretraining_data_loader",
    "close_gpu_descriptors",
    "collate",
    "consumed_after",
    "consumed_in_phase",
    "cyclic_iter",
    "num_micro_batches",
    "samples_per_step",
]

__getattr__, __dir__ = lazy_exports(__name__, __file__, __all__)
