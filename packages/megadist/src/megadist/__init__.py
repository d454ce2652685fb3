"""megadist: Megatron-LM's get_batch across tensor-, pipeline- and context-parallel ranks.

Only TP rank 0 of a group reads the data loader; ``broadcast_batch`` gives its micro-batch to the
group, pruned to what the rank's pipeline stage needs, and a context-parallel partitioner
(``zigzag``, ``thd``) keeps each CP rank's share. ``get_batch`` does the whole path.
"""

from importlib.metadata import version
from typing import TYPE_CHECKING

from megafmt.lazy_exports import lazy_exports

# the exports, each imported when first used (megafmt.lazy_exports): no torch at import
if TYPE_CHECKING:
    from megadist.broadcast import PROTOCOLS, broadcast_batch
    from megadist.errors import (
        AgreementError,
        BatchError,
        CollectiveError,
        MegadistError,
        PartitionError,
        SourceError,
        TopologyError,
    )
    from megadist.get_batch import get_batch
    from megadist.hybrid_cp import (
        HYBRID_CP_SCHEDULERS,
        HybridCPScheduler,
        HybridCPSchedulerFactory,
        hybrid_split,
    )
    from megadist.hybrid_cp_loader import HybridCPDataLoaderWrapper, cp_sizes
    from megadist.keys import BATCH_KEYS, METADATA_KEYS, Batch
    from megadist.layout import DEFAULT_TIMEOUT, ParallelLayout, build_parallel_groups
    from megadist.partition import (
        CP_PARTITIONERS,
        thd_partitioned_indices,
        thd_split,
        zigzag_split,
    )
    from megadist.topology import BatchTopology, HybridCPGroups, PipelinePosition, device_for_group

__version__ = version("megadist")

__all__ = [
    "BATCH_KEYS",
    "CP_PARTITIONERS",
    "DEFAULT_TIMEOUT",
    "HYBRID_CP_SCHEDULERS",
    "METADATA_KEYS",
    "PROTOCOLS",
    "AgreementError",
    "Batch",
    "BatchError",
    "BatchTopology",
    "CollectiveError",
    "HybridCPDataLoaderWrapper",
    "HybridCPGroups",
    "HybridCPScheduler",
    "HybridCPSchedulerFactory",
    "MegadistError",
    "ParallelLayout",
    "PartitionError",
    "PipelinePosition",
    "SourceError",
    "TopologyError",
    "__version__",
    "broadcast_batch",
    "build_parallel_groups",
    "cp_sizes",
    "device_for_group",
    "get_batch",
    "hybrid_split",
    "thd_partitioned_indices",
    "thd_split",
    "zigzag_split",
]

__getattr__, __dir__ = lazy_exports(__name__, __file__, __all__)
