"""The batch-sampler plugin contract: what a ``megaload.samplers`` entry point builds, and how the
loader builds and checks it.

Every sampler, shipped or third-party, is registered as one kind of factory,
``factory(dataset, consumed_samples, config) -> BatchSampler``: the dataset to sample, where the
run stands (samples consumed by all ranks together, as Megatron-LM counts them), and the
loader's :class:`~megaload.config.DataLoaderConfig` as it applies to the dataset's split (its
``micro_batch_size`` is the split's). What it builds carries its own resume rules: the loader
records ``resume_state()`` in its state dict and, given a saved state, asks ``check_resume`` of
the sampler it would continue with. A sampler that can also continue a run saved at another
micro-batch or data-parallel layout, exactly, implements :class:`Reshardable`; the loader asks
it only when the user asks for a re-shard (``load_state_dict(state, reshard=True)``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from megafmt.registry import Registry
from megaload.errors import SamplerPluginError

if TYPE_CHECKING:
    from megaload.config import DataLoaderConfig


@runtime_checkable
class BatchSampler(Protocol):
    """One data-parallel rank's batches of sample indices, and the rules for resuming them."""

    consumed_samples: int
    """Samples consumed by all ranks together: where the next pass starts. The loader sets it
    before each pass."""

    def __iter__(self) -> Iterator[list[int | None]]:
        """This rank's batches from ``consumed_samples`` on, as lists of sample indices (None: a
        padding sample)."""
        ...

    def __len__(self) -> int:
        """The length torch's DataLoader reports (Megatron-LM's samplers: the sample count)."""
        ...

    def next_consumed(self, consumed_samples: int) -> int:
        """Samples consumed once every rank has taken one more batch after
        ``consumed_samples`` (the loader's count of a batch it hands out)."""
        ...

    def resume_state(self) -> dict[str, Any]:
        """What a resume must agree with, as plain values; the loader saves it."""
        ...

    def check_resume(self, saved: Mapping[str, Any]) -> None:
        """Raise :class:`~megaload.errors.ResumeError`, naming the field, if this sampler cannot
        continue exactly where one whose ``resume_state()`` was ``saved`` stopped."""
        ...


@runtime_checkable
class Reshardable(Protocol):
    """A batch sampler that continues, exactly, a run saved at another layout."""

    def reshard(self, saved: Mapping[str, Any], consumed_samples: int) -> int:
        """Where this sampler continues a run whose sampler's ``resume_state()`` was ``saved``
        and which stopped at ``consumed_samples`` (the saved sampler's count): the count in this
        sampler's layout from which every sample not yet read in the current epoch comes once
        and none read comes again. Raise :class:`~megaload.errors.ResumeError`, naming the
        field, where no such point exists."""
        ...


@runtime_checkable
class Bounded(Protocol):
    """A batch sampler whose batches end with its data (the ``single`` sampler; the
    ``cyclic`` one deals out epoch after epoch and never ends)."""

    def batches_from(self, consumed_samples: int) -> int:
        """This rank's batches from ``consumed_samples`` on, until the data ends."""
        ...


@runtime_checkable
class GlobalBatchSampler(Protocol):
    """A batch sampler each of whose batches is a rank's share of a whole global batch, its
    ``num_micro_batches`` micro-batches together (the ``hybrid_cp`` sampler). The loader hands
    such a batch over uncollated, as a list of sample dicts, for a wrapper to re-deal (Megatron-LM
    passes ``collate_fn=lambda x: x`` there)."""

    num_micro_batches: int
    """The micro-batches of this rank in each batch."""


class SamplerFactory(Protocol):
    """What a ``megaload.samplers`` entry point names."""

    def __call__(
        self, dataset: Any, consumed_samples: int, config: DataLoaderConfig
    ) -> BatchSampler: ...


#: the batch-sampler factories, by ``dataloader_type`` name (``megaload.samplers`` entry points);
#: the name ``external`` is not a sampler: the dataset is then a loader of its own
SAMPLERS: Registry[SamplerFactory] = Registry(
    "megaload.samplers", "megaload sampler", required=("__call__",), home="megaload"
)


def build_batch_sampler(
    dataset: Any, consumed_samples: int, config: DataLoaderConfig
) -> BatchSampler:
    """The ``config.dataloader_type`` sampler of ``dataset`` from ``consumed_samples`` on."""
    name = config.dataloader_type
    sampler = SAMPLERS.get(name)(dataset, consumed_samples, config)
    if not isinstance(sampler, BatchSampler):
        raise SamplerPluginError(
            f"megaload sampler {name!r} ({SAMPLERS.view()[name]}) built a "
            f"{type(sampler).__qualname__}, not a megaload BatchSampler: expected __iter__, "
            "__len__, a settable consumed_samples, next_consumed(), resume_state() and "
            "check_resume()"
        )
    return sampler
