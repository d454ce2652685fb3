"""The log records megatron-core writes when a dataset's index tables are built or loaded,
written here under megatron-core's logger names, so that a job's logs (and whatever filters,
greps or dashboards read them) look the same after the switch.

megatron-core logs through ``logging.getLogger("megatron.core.datasets.gpt_dataset")`` and
``...blended_dataset`` on global rank 0 only (every process when no process group is up). The
messages and levels are its own; the timings it logs at DEBUG are left out. megaindex's own
records (cache checks, rebuilds, timings) stay under the ``megaindex.*`` loggers.
"""

from __future__ import annotations

import logging
import os
from functools import partial

from megaindex.distributed import builds_shared_files
from megaindex.tables import TableSource

GPT_LOGGER = logging.getLogger("megatron.core.datasets.gpt_dataset")
BLENDED_LOGGER = logging.getLogger("megatron.core.datasets.blended_dataset")


def log_on_first_rank(logger: logging.Logger, level: int, message: str) -> None:
    """megatron-core's ``log_single_rank``: log on global rank 0, or when alone."""
    if builds_shared_files():
        logger.log(level, message)


def log_gpt_tables(
    class_name: str, split: str, source: TableSource, samples: int, epochs: int | None
) -> None:
    """What megatron-core's GPTDataset logs once its three tables are built or loaded."""
    if source.kind == "deferred":  # megatron-core maps the files later, silently
        return
    if source.kind != "memory" and not GPT_LOGGER.isEnabledFor(logging.INFO):
        return  # nothing would be written: no message made (five per corpus of a blend)
    say = partial(log_on_first_rank, GPT_LOGGER, logging.INFO)
    if source.kind == "cache":
        say(f"Load the {class_name} {split} indices")
        for table in ("document_index", "sample_index", "shuffle_index"):
            name = f"{source.cache_entry.base}-{table}.npy"
            say(f"\tLoad the {table.replace('_', ' ')} from {name}")
        say(f"> total number of samples: {samples}")
        return
    say(f"Build and save the {class_name} {split} indices")
    if source.kind == "memory":
        log_on_first_rank(
            GPT_LOGGER,
            logging.WARNING,
            f"Unable to save {class_name} indexes because path_to_cache is None",
        )
    say(f"> total number of samples: {samples}")
    say(f"> total number of epochs: {epochs}")


def log_blended_tables(class_name: str, source: TableSource, path_to_cache: str | None) -> None:
    """What megatron-core's BlendedDataset logs once its two tables are built or loaded; the
    table paths as it joins them (``path_to_cache`` as configured, not made absolute)."""
    if source.kind == "deferred":
        return
    say = partial(log_on_first_rank, BLENDED_LOGGER, logging.INFO)
    if source.kind == "cache":
        say(f"Load the {class_name} indices")
        for table in ("dataset_index", "dataset_sample_index"):
            path = os.path.join(path_to_cache or "", f"{source.cache_entry.base}-{table}.npy")
            say(f"\tLoad the {table.replace('_', ' ')} from {path}")
        return
    say(f"Build and save the {class_name} indices")
    say("\tBuild and save the dataset and dataset sample indexes")
    if source.kind == "memory":
        log_on_first_rank(
            BLENDED_LOGGER,
            logging.WARNING,
            f"Cannot save the {class_name} indexes because path_to_cache is None",
        )


def log_single_dataset_blend() -> None:
    """megatron-core's warning for a blend of one dataset."""
    log_on_first_rank(
        BLENDED_LOGGER, logging.WARNING, "Building a BlendedDataset for a single MegatronDataset"
    )
