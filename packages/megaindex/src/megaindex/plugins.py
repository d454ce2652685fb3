"""The ``megaindex.datasets`` plugins: mid-level dataset classes by name.

Shipped: ``gpt`` (:class:`~megaindex.gpt_dataset.GPTDataset`), ``mock``
(:class:`~megaindex.mock.MockGPTDataset`), ``fim`` (:class:`~megaindex.fim_dataset.GPTFIMDataset`)
and ``sft`` (:class:`~megaindex.sft_dataset.SFTDataset`). A third party adds a class (a
``MegatronDataset`` with megatron-core's two static methods) by declaring an entry point in that
group; the builder takes the name in place of the class and ``mega index build --dataset NAME``
builds it. A class that has part of ``BatchAssembly`` (``__getitems__``, ``merge_batches``) or
``PlannedPrefetch`` (``prefetches_samples``, ``prefetch_samples``) must have all of it: that is
checked when it is loaded or registered (a ``MegatronDataset`` subclass has ``BatchAssembly``).
"""

from __future__ import annotations

from megafmt.protocols import BatchAssembly, PlannedPrefetch
from megafmt.registry import Registry

DATASETS: Registry[type] = Registry(
    "megaindex.datasets",
    "megaindex dataset",
    required=("build_low_level_dataset", "numel_low_level_dataset"),
    claimable=(BatchAssembly, PlannedPrefetch),
    home="megaindex",
)
