"""``build_pretraining_data_loader``: Megatron-LM's data loader, as a loader that can resume.

The loader is a torch DataLoader over one of the batch samplers (built by name by a
``megaload.samplers`` plugin, see ``megaload.batch_sampler``), wrapped so that it counts the
samples it has handed out (globally, as Megatron-LM counts ``consumed_train_samples``) and
exposes ``state_dict()``/``load_state_dict()`` (torchdata's StatefulDataLoader protocol).
Loading a state continues on exactly the next sample.

The state records everything that defines the order of the samples: the sampler and its
options, the layout (micro-batch and global batch size, data-parallel size and rank) and the
dataset (its length and, for a dataset that declares one, its digest:
``megafmt.protocols.DescribedDataset``). A state restored into a loader that differs in any of
them is refused naming the field, unless the user asks for a re-shard
(``load_state_dict(state, reshard=True)``), which lets only the layout change and only where the
sampler continues exactly (:class:`~megaload.batch_sampler.Reshardable`): no sample of the
epoch twice, none skipped.

Over a blend of corpora the state also records each corpus's consumption (``mix``,
:mod:`megaload.mix_state`); with ``DataLoaderConfig.resume_with_new_mix`` it may be restored
over the blend resumed from it under new weights, corpora or layout.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader

from megafmt.protocols import DescribedDataset, PlannedPrefetch, split_name
from megaload.batch_sampler import GlobalBatchSampler, Reshardable, build_batch_sampler
from megaload.checks import (
    COUNT,
    FLAG,
    INTEGER,
    MAPPING,
    OPTIONAL_INTEGER,
    OPTIONAL_MAPPING,
    OPTIONAL_POSITIVE,
    OPTIONAL_TEXT,
    POSITIVE,
    TEXT,
    Kind,
    check_count,
    check_state,
)
from megaload.config import EXTERNAL, DataLoaderConfig
from megaload.errors import LoaderStateError, ResumeError, WorkerDiedError
from megaload.mix_state import check_resumed_mix, mix_state
from megaload.planned import PlannedBatchSampler
from megaload.shared_batches import Collate, SlotReader, available

logger = logging.getLogger(__name__)

#: how torch's messages for a DataLoader worker that died begin ("... (pid(s) N) exited
#: unexpectedly", "... (pid N) is killed by signal: Killed.")
TORCH_WORKER_DIED = "DataLoader worker (pid"

#: 2: the sampler's own resume fields moved under ``sampler_state``; 3: the ``layout``,
#: ``options`` and ``dataset_digest`` that define the order; 4: each corpus's consumption,
#: ``mix`` (1 to 3 are still read)
STATE_VERSION = 4

#: the keys of a saved state of each version, and their kinds
STATE_SCHEMAS: dict[int, dict[str, Kind]] = {
    1: {"consumed_samples": COUNT, "total_samples": COUNT},
    2: {
        "sampler": TEXT,
        "consumed_samples": COUNT,
        "total_samples": COUNT,
        "sampler_state": MAPPING,
    },
    3: {
        "sampler": TEXT,
        "consumed_samples": COUNT,
        "total_samples": COUNT,
        "dataset_digest": OPTIONAL_TEXT,
        "layout": MAPPING,
        "options": MAPPING,
        "sampler_state": MAPPING,
    },
}
STATE_SCHEMAS[STATE_VERSION] = {**STATE_SCHEMAS[3], "mix": OPTIONAL_MAPPING}
#: the configuration fields of the layout, which a re-shard may change, and their kinds
LAYOUT_SCHEMA: dict[str, Kind] = {
    "micro_batch_size": POSITIVE,
    "global_batch_size": OPTIONAL_POSITIVE,
    "data_parallel_size": POSITIVE,
    "data_parallel_rank": COUNT,
}
#: the sampler options that define the order, which no resume may change, and their kinds
OPTIONS_SCHEMA: dict[str, Kind] = {
    "data_sharding": FLAG,
    "drop_last": FLAG,
    "pad_last_batch": FLAG,
    "balanced": FLAG,
    "seed": OPTIONAL_INTEGER,
}
LAYOUT_FIELDS = tuple(LAYOUT_SCHEMA)
OPTION_FIELDS = tuple(OPTIONS_SCHEMA)


def dataset_digest(dataset: Any) -> str | None:
    """The digest a dataset declares for its samples, or None."""
    return dataset.unique_description_hash if isinstance(dataset, DescribedDataset) else None


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
    """Batches of one data-parallel rank, counted so that the run can resume on the next one.

    ``config`` is kept as it applies to the dataset's split (:meth:`DataLoaderConfig.for_split`):
    its ``dataloader_type`` names the sampler and its ``micro_batch_size`` is the split's.
    """

    def __init__(self, dataset: Any, consumed_samples: int, config: DataLoaderConfig) -> None:
        self.dataset = dataset
        self.config = config.for_split(split_name(dataset))
        self.consumed_samples = check_count("consumed_samples", consumed_samples)
        #: hand each batch with the one its worker reads next (e.g. a corpus in object storage)
        self.plans_prefetch = isinstance(dataset, PlannedPrefetch) and dataset.prefetches_samples
        self.loader = self._build(consumed_samples)

    def _build(self, consumed_samples: int) -> DataLoader:
        config = self.config
        workers = config.num_workers
        pin = torch.cuda.is_available() if config.pin_memory is None else config.pin_memory
        persistent = workers > 0 if config.persistent_workers is None else config.persistent_workers
        self.batch_sampler = build_batch_sampler(self.dataset, consumed_samples, config)
        batches: Any = self.batch_sampler
        if self.plans_prefetch:
            batches = PlannedBatchSampler(batches, max(1, workers))
        uncollated = isinstance(self.batch_sampler, GlobalBatchSampler)
        shared = workers > 0 and config.shared_batches and available() and not uncollated
        # a pass still running over the loader this replaces keeps its own reader
        self.slots = SlotReader(pin_memory=pin and torch.cuda.is_available())
        return DataLoader(
            self.dataset,
            batch_sampler=batches,
            num_workers=workers,
            pin_memory=pin,  # batches that went torch's way; the slots' are copied out pinned
            persistent_workers=persistent and workers > 0,
            worker_init_fn=close_gpu_descriptors if workers > 0 else None,
            collate_fn=list if uncollated else Collate(PREFETCH_FACTOR + 2 if shared else None),
            prefetch_factor=PREFETCH_FACTOR if workers > 0 else None,
        )

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        # each pass starts where the last one stopped: the sampler reads this when iterated
        self.batch_sampler.consumed_samples = self.consumed_samples
        # persistent workers keep their slots from pass to pass; new workers make new ones
        persistent = self.loader.persistent_workers
        slots = self.slots if persistent else SlotReader(self.slots.pin_memory)
        died = None
        try:
            for item in self.loader:
                batch = slots.read(item)  # at once: the worker reuses the slot later
                self.consumed_samples = self.batch_sampler.next_consumed(self.consumed_samples)
                yield batch
        except RuntimeError as error:
            if not str(error).startswith(TORCH_WORKER_DIED):
                raise
            died = self._worker_died(error)
        finally:
            if not persistent:
                slots.close()
        if died is not None:
            # raised here, not in the handler: torch's error, its cause and their frames (which
            # hold the dead loader's iterator) are gone, and the iterator with its loader, so
            # torch stops the other workers and no longer watches their pids (its SIGCHLD
            # handler would raise again anywhere); another pass starts new workers here
            self.loader = self._build(self.consumed_samples)
            raise died

    def _worker_died(self, error: RuntimeError) -> WorkerDiedError:
        """torch's error for a worker that died, with what it was reading and the likely cause:
        torch names only the process."""
        split = split_name(self.dataset)
        return WorkerDiedError(
            f"a DataLoader worker of the {split or 'unnamed'} split's loader (over "
            f"{type(self.dataset).__qualname__}, {self.config.num_workers} workers) died while "
            f"the batches from consumed_samples {self.consumed_samples} on were read: {error}. "
            "Killed (SIGKILL) is most often the out-of-memory killer; a bus error (SIGBUS), a "
            "mapped file that shrank or vanished under the reader; num_workers=0 reads in this "
            "process and shows the sample's own error"
        )

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: enough to continue on exactly the next sample, everything
        that defines the order, and what its sampler needs a resume to agree with
        (``sampler_state``)."""
        return {
            "version": STATE_VERSION,
            "sampler": self.config.dataloader_type,
            "consumed_samples": self.consumed_samples,
            "total_samples": len(self.dataset),
            "dataset_digest": dataset_digest(self.dataset),
            "layout": self._fields(LAYOUT_FIELDS),
            "options": self._fields(OPTION_FIELDS),
            "sampler_state": self.batch_sampler.resume_state(),
            "mix": mix_state(self.dataset, self.consumed_samples),
        }

    def _fields(self, names: tuple[str, ...]) -> dict[str, Any]:
        return {name: getattr(self.config, name) for name in names}

    def load_state_dict(self, state: Mapping[str, Any], *, reshard: bool = False) -> None:
        """Continue from ``state`` (as ``state_dict()`` returned it, possibly in another
        process). A loader that differs from the saver in any recorded field is refused, naming
        it; with ``reshard=True`` the layout (micro-batch, global batch and data-parallel size
        and rank) may differ where the sampler continues exactly, from a point its ``reshard``
        gives (in this layout's count, which ``state_dict()`` records from then on)."""
        state = self._checked(state)
        if self.config.resume_with_new_mix:
            check_resumed_mix(self.dataset, state)
            reshard = True
        else:
            self._check_same_data(state)
        for field in OPTION_FIELDS:
            self._check_field(state["options"], field, "the samples would come in another order")
        consumed = int(state["consumed_samples"])
        changed = [f for f in LAYOUT_FIELDS if state["layout"][f] != getattr(self.config, f)]
        if changed and not reshard:
            self._check_field(
                state["layout"],
                changed[0],
                "pass reshard=True to continue the run at this layout where the sampler can "
                "do so exactly",
            )
        if changed:
            if not isinstance(self.batch_sampler, Reshardable):
                raise ResumeError(
                    f"the {self.config.dataloader_type!r} sampler cannot re-shard a run (it "
                    f"does not implement megaload.batch_sampler.Reshardable); resume at the "
                    f"saved layout {state['layout']}"
                )
            consumed = self.batch_sampler.reshard(state["sampler_state"], consumed)
        else:
            self.batch_sampler.check_resume(state["sampler_state"])
        # built first: a count the sampler refuses leaves this loader as it was
        self.loader = self._build(consumed)
        self.consumed_samples = consumed

    def _checked(self, state: Any) -> Mapping[str, Any]:
        """``state`` as a version-4 state, after checking that it holds every key its version
        has, each of its kind (:class:`~megaload.errors.LoaderStateError` names the key)."""
        check_state(state, {"version": INTEGER}, "loader state")
        version = state["version"]
        if version not in STATE_SCHEMAS:
            raise LoaderStateError(
                f"loader state['version'] is {version!r}; expected one of "
                f"{', '.join(map(str, STATE_SCHEMAS))} (this loader writes {STATE_VERSION})"
            )
        current = version == STATE_VERSION  # the keys of older versions are read as they were
        schema = (
            {"version": INTEGER, **STATE_SCHEMAS[version]} if current else STATE_SCHEMAS[version]
        )
        check_state(state, schema, "loader state", exact=current)
        if version == 1:
            state = self._upgraded_from_1(state)
        if version <= 2:
            state = self._upgraded_from_2(state)
        if version <= 3:
            state = {**state, "version": STATE_VERSION, "mix": None}
        check_state(state["layout"], LAYOUT_SCHEMA, "loader state['layout']", exact=True)
        check_state(state["options"], OPTIONS_SCHEMA, "loader state['options']", exact=True)
        return state

    def _check_same_data(self, state: Mapping[str, Any]) -> None:
        if state["total_samples"] != len(self.dataset):
            raise ResumeError(
                f"the state was saved over {state['total_samples']} samples, this dataset holds "
                f"{len(self.dataset)}: it is not the same dataset"
            )
        saved, mine = state["dataset_digest"], dataset_digest(self.dataset)
        if saved is not None and mine is not None and saved != mine:
            raise ResumeError(
                f"the state was saved over the dataset of digest {saved}, this dataset's is "
                f"{mine} (unique_description_hash): it holds other samples or another order"
            )
        if state["sampler"] != self.config.dataloader_type:
            raise ResumeError(
                f"the state was saved by the {state['sampler']!r} sampler, this loader uses "
                f"{self.config.dataloader_type!r}"
            )

    def _check_field(self, saved: Mapping[str, Any], field: str, why: str) -> None:
        mine = getattr(self.config, field)
        if saved[field] != mine:
            raise ResumeError(
                f"the state was saved with {field}={saved[field]!r}, this loader has "
                f"{field}={mine!r}: {why}"
            )

    def _upgraded_from_1(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """A version-1 state (no ``sampler_state``; the sampler's layout at the top level) as
        version 2: what it recorded is checked, what it did not record is taken as this
        sampler's, with a warning naming it."""
        mine = self.batch_sampler.resume_state()
        recorded = {field: state[field] for field in mine if field in state}
        self._warn_unrecorded(1, sorted(set(mine) - set(recorded)))
        return {
            "version": 2,
            "sampler": state.get("sampler"),
            "consumed_samples": state.get("consumed_samples"),
            "total_samples": state.get("total_samples"),
            "sampler_state": {**mine, **recorded},
        }

    def _upgraded_from_2(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """A version-2 state (no layout, options or digest) as version 3: the layout and
        options its sampler state recorded are checked, the others are taken as this loader's,
        with a warning naming them."""
        recorded = state["sampler_state"]
        layout, options = self._fields(LAYOUT_FIELDS), self._fields(OPTION_FIELDS)
        unknown = sorted(f for f in (*layout, *options) if f not in recorded)
        self._warn_unrecorded(2, [*unknown, "dataset_digest"])
        return {
            **state,
            "version": 3,
            "dataset_digest": None,
            "layout": {f: recorded.get(f, v) for f, v in layout.items()},
            "options": {f: recorded.get(f, v) for f, v in options.items()},
        }

    @staticmethod
    def _warn_unrecorded(version: int, fields: list[str]) -> None:
        if fields:
            logger.warning(
                "the loader state (version %d) does not record %s; resuming as if they were "
                "this loader's",
                version,
                ", ".join(fields),
            )


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
