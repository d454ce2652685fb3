"""``build_pretraining_data_loader``: Megatron-LM's data loader, as a loader that can resume.

The loader is a torch DataLoader over one of the batch samplers (chosen by name from the
``megaload.samplers`` plugins), wrapped so that it counts the samples it has handed out
(globally, as Megatron-LM counts ``consumed_train_samples``) and exposes
``state_dict()``/``load_state_dict()`` (torchdata's StatefulDataLoader protocol). Loading a
state continues on exactly the next sample, with the same or, for the sequential sampler, a
different data-parallel size.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader

from megaload.config import EXTERNAL, DataLoaderConfig
from megaload.planned import PlannedBatchSampler
from megaload.samplers import SAMPLERS, SamplerError
from megaload.shared_batches import Collate, SlotReader, available

logger = logging.getLogger(__name__)

STATE_VERSION = 1


def close_gpu_descriptors(worker_id: int) -> None:
    """DataLoader worker start-up: close the ``/dev/nvidia*`` descriptors inherited from the
    trainer, so a worker that lingers cannot keep GPU memory from being released."""
    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else ():
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{name}").startswith("/dev/nvidia"):
                os.close(int(name))


#: torch's default collation, except for a batch the dataset already collated (see ``Collate``),
#: which passes through untouched
collate = Collate()

#: batches each worker has under way at most (the DataLoader's prefetch_factor)
PREFETCH_FACTOR = 2


class MegatronDataLoader:
    """Batches of one data-parallel rank, counted so that the run can resume on the next one."""

    def __init__(self, dataset: Any, consumed_samples: int, config: DataLoaderConfig) -> None:
        self.dataset = dataset
        self.config = config
        split = _split_name(dataset)
        self.is_eval = split in ("valid", "test")
        self.micro_batch_size = (
            config.eval_micro_batch_size or config.micro_batch_size
            if self.is_eval
            else config.micro_batch_size
        )
        self.sampler_name = (
            "full_validation"
            if config.full_validation and split == "valid"
            else config.dataloader_type
        )
        if self.sampler_name == "full_validation":
            self.micro_batch_size = 1
        self.data_parallel_size = config.data_parallel_size
        self.consumed_samples = consumed_samples
        self.loader = self._build(consumed_samples)

    @property
    def samples_per_batch(self) -> int:
        """Samples one batch of every rank together consume."""
        return self.micro_batch_size * self.data_parallel_size

    def _sampler(self, consumed_samples: int) -> Any:
        config = self.config
        factory = SAMPLERS.get(self.sampler_name)
        common = dict(
            data_parallel_rank=config.data_parallel_rank,
            data_parallel_size=config.data_parallel_size,
        )
        if self.sampler_name == "full_validation":
            return factory(total_samples=len(self.dataset), **common)
        if self.sampler_name == "single":
            return factory(
                total_samples=len(self.dataset),
                consumed_samples=consumed_samples,
                micro_batch_size=self.micro_batch_size,
                drop_last=config.drop_last,
                pad_last_batch=config.pad_last_batch,
                **common,
            )
        if self.sampler_name == "cyclic":
            return factory(
                self.dataset,
                total_samples=len(self.dataset),
                consumed_samples=consumed_samples,
                micro_batch_size=self.micro_batch_size,
                data_sharding=config.data_sharding,
                balanced=config.balanced,
                seed=config.seed,
                **common,
            )
        # a third-party sampler: Megatron-LM's sequential sampler arguments
        return factory(
            total_samples=len(self.dataset),
            consumed_samples=consumed_samples,
            micro_batch_size=self.micro_batch_size,
            **common,
        )

    def _build(self, consumed_samples: int) -> DataLoader:
        config = self.config
        workers = config.num_workers
        pin = torch.cuda.is_available() if config.pin_memory is None else config.pin_memory
        persistent = workers > 0 if config.persistent_workers is None else config.persistent_workers
        self.batch_sampler = self._sampler(consumed_samples)
        batches = self.batch_sampler
        if callable(getattr(self.dataset, "prefetch", None)):  # e.g. a corpus in object storage
            batches = PlannedBatchSampler(batches, max(1, workers))
        shared = workers > 0 and config.shared_batches and available()
        # a pass still running over the loader this replaces keeps its own reader
        self.slots = SlotReader(pin_memory=pin and torch.cuda.is_available())
        return DataLoader(
            self.dataset,
            batch_sampler=batches,
            num_workers=workers,
            pin_memory=pin,  # batches that went torch's way; the slots' are copied out pinned
            persistent_workers=persistent and workers > 0,
            worker_init_fn=close_gpu_descriptors if workers > 0 else None,
            collate_fn=Collate(PREFETCH_FACTOR + 2 if shared else None),
            prefetch_factor=PREFETCH_FACTOR if workers > 0 else None,
        )

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        # each pass starts where the last one stopped: the samplers read this when iterated
        if hasattr(self.batch_sampler, "consumed_samples"):
            self.batch_sampler.consumed_samples = self.consumed_samples
        # persistent workers keep their slots from pass to pass; new workers make new ones
        persistent = self.loader.persistent_workers
        slots = self.slots if persistent else SlotReader(self.slots.pin_memory)
        try:
            for item in self.loader:
                batch = slots.read(item)  # at once: the worker reuses the slot later
                self.consumed_samples += self.samples_per_batch
                if self.sampler_name == "single":  # the last global batch may be short
                    self.consumed_samples = min(self.consumed_samples, len(self.dataset))
                yield batch
        finally:
            if not persistent:
                slots.close()

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: enough to continue on exactly the next sample."""
        return {
            "version": STATE_VERSION,
            "sampler": self.sampler_name,
            "consumed_samples": self.consumed_samples,
            "total_samples": len(self.dataset),
            "micro_batch_size": self.micro_batch_size,
            "data_parallel_size": self.data_parallel_size,
            "data_sharding": self.config.data_sharding,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (as ``state_dict()`` returned it, possibly in another process
        and with another data-parallel size for the sequential sampler)."""
        if state.get("version") != STATE_VERSION:
            raise SamplerError(
                f"loader state version {state.get('version')!r} is not {STATE_VERSION}"
            )
        if state["total_samples"] != len(self.dataset):
            raise SamplerError(
                f"the state was saved over {state['total_samples']} samples, this dataset holds "
                f"{len(self.dataset)}: it is not the same dataset"
            )
        if state["sampler"] != self.sampler_name:
            raise SamplerError(
                f"the state was saved by the {state['sampler']!r} sampler, this loader uses "
                f"{self.sampler_name!r}"
            )
        if (
            self.sampler_name == "cyclic"
            and state["data_sharding"]
            and state["data_parallel_size"] != self.data_parallel_size
        ):
            raise SamplerError(
                f"the cyclic sampler with data sharding cannot resume at data_parallel_size "
                f"{self.data_parallel_size} a run saved at {state['data_parallel_size']}: each "
                "rank shuffles its own bucket of the data, and the buckets depend on the size. "
                "Resume at the saved size, or run without data_sharding (one global shuffle)"
            )
        self.consumed_samples = int(state["consumed_samples"])
        self.loader = self._build(self.consumed_samples)


def _split_name(dataset: Any) -> str | None:
    split = getattr(dataset, "index_split", getattr(dataset, "split", None))
    return getattr(split, "name", split)


def build_pretraining_data_loader(
    dataset: Any, consumed_samples: int, config: DataLoaderConfig
) -> Any:
    """Megatron-LM's data loader for ``dataset`` from ``consumed_samples`` on: a
    :class:`MegatronDataLoader`, the dataset itself for ``external``, or None without data."""
    if dataset is None:
        return None
    if config.dataloader_type == EXTERNAL:
        return dataset
    return MegatronDataLoader(dataset, consumed_samples, config)
