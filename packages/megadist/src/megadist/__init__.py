"""megadist: Megatron-LM's get_batch across tensor-, pipeline- and context-parallel ranks.

Only TP rank 0 of a group reads the data loader; ``broadcast_batch`` gives its micro-batch to the
group, pruned to what the rank's pipeline stage needs, and a context-parallel partitioner
(``zigzag``, ``thd``) keeps each CP rank's share. ``get_batch`` does the whole path.
"""

from importlib.metadata import version

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
from megadist.keys import BATCH_KEYS, METADATA_KEYS, Batch
from megadist.layout import DEFAULT_TIMEOUT, ParallelLayout, build_parallel_groups
from megadist.partition import (
    CP_PARTITIONERS,
    thd_partitioned_indices,
    thd_split,
    zigzag_split,
)
from megadist.topology import BatchTopology, PipelinePosition, device_for_group

__version__ = version("megadist")

__all__ = [
    "BATCH_KEYS",
    "CP_PARTITIONERS",
    "DEFAULT_TIMEOUT",
    "METADATA_KEYS",
    "PROTOCOLS",
    "AgreementError",
    "Batch",
    "BatchError",
    "BatchTopology",
    "CollectiveError",
    "MegadistError",
    "ParallelLayout",
    "PartitionError",
    "PipelinePosition",
    "SourceError",
    "TopologyError",
    "__version__",
    "broadcast_batch",
    "build_parallel_groups",
    "device_for_group",
    "get_batch",
    "thd_partitioned_indices",
    "thd_split",
    "zigzag_split",
]
