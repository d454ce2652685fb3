"""What Megatron-LM reads from its global arguments to build a data loader, as a dataclass."""

from __future__ import annotations

from dataclasses import dataclass, replace

from megaload.accounting import num_micro_batches
from megaload.batch_sampler import SAMPLERS
from megaload.errors import SamplerError
from megaload.samplers import check_batch_layout

#: the dataloader_type that names no sampler: the dataset is a loader of its own
EXTERNAL = "external"
#: the sampler Megatron-LM reads the validation split with under ``full_validation``
FULL_VALIDATION = "full_validation"


@dataclass(frozen=True, kw_only=True)
class DataLoaderConfig:
    """Megatron-LM's data loader arguments (same names), and the fixes for its quirks."""

    micro_batch_size: int
    """Samples per micro-batch on each data-parallel rank."""

    dataloader_type: str = "single"
    """``single`` (sequential), ``cyclic`` (random, epoch after epoch), ``external`` (the dataset
    is a loader of its own) or another ``megaload.samplers`` plugin (``mega load samplers``
    lists them)."""

    global_batch_size: int | None = None
    """Samples per step across all ranks (for accounting and validation)."""

    eval_micro_batch_size: int | None = None
    """Micro-batch size of the validation and test loaders (default: micro_batch_size)."""

    eval_global_batch_size: int | None = None
    """Samples per validation or test step across all ranks (Megatron's
    ``--eval-global-batch-size``; default: global_batch_size, where the evaluation micro-batch
    is the training one). The ``hybrid_cp`` sampler reads a whole one per step."""

    data_parallel_rank: int = 0
    data_parallel_size: int = 1

    num_workers: int = 2
    """DataLoader worker processes (Megatron-LM's default is 2)."""

    data_sharding: bool = True
    """``cyclic``: shuffle within each rank's bucket of the data."""

    full_validation: bool = False
    """Validate on the whole validation set, one sample per rank per batch (the
    ``full_validation`` sampler, whatever ``dataloader_type`` says)."""

    drop_last: bool = True
    """``single``: drop the last, partial global batch."""

    pin_memory: bool | None = None
    """Pin batches in page-locked memory (default: when CUDA is available)."""

    persistent_workers: bool | None = None
    """Keep workers between epochs (default: when there are workers)."""

    shared_batches: bool = True
    """Workers hand batches over through shared-memory slots set up once, each batch copied
    out as it arrives (``megaload.shared_batches``); False: torch's new shared memory for every
    tensor of every batch."""

    pad_last_batch: bool = False
    """``single`` with ``drop_last=False``: fill the last micro-batch with padding samples
    (index None) instead of giving higher ranks a short or empty one."""

    balanced: bool = False
    """``cyclic`` without sharding: trim each epoch to whole global batches, so every rank gets
    the same number of batches."""

    seed: int | None = None
    """``cyclic``: seed the permutations with seed + epoch instead of the epoch alone."""

    resume_with_new_mix: bool = False
    """``single`` over a blend: restore a state saved under another blend (weights, corpora)
    or layout, the dataset being the blend resumed from that state (megaindex's
    ``resume_with_new_mix`` config field); off, a state is restored only over the same data
    (Megatron's behaviour)."""

    def __post_init__(self) -> None:
        if self.dataloader_type != EXTERNAL and self.dataloader_type not in SAMPLERS:
            raise SamplerError(
                f"dataloader_type {self.dataloader_type!r} is not supported; expected "
                f"{EXTERNAL!r} or a sampler: {', '.join(SAMPLERS.available())}"
            )
        check_batch_layout(self.micro_batch_size, self.data_parallel_rank, self.data_parallel_size)
        if self.resume_with_new_mix and self.dataloader_type != "single":
            raise SamplerError(
                f"resume_with_new_mix needs dataloader_type 'single', got "
                f"{self.dataloader_type!r}: only a sequential run has consumed a prefix of each "
                "corpus; read the run with dataloader_type 'single', or resume it as Megatron "
                "does (resume_with_new_mix=False, the same data)"
            )
        if self.num_workers < 0:
            raise SamplerError(f"num_workers must be >= 0, got {self.num_workers}")
        if self.global_batch_size is not None:
            num_micro_batches(
                self.global_batch_size, self.micro_batch_size, self.data_parallel_size
            )

    def for_split(self, split: str | None) -> DataLoaderConfig:
        """This configuration as a loader of ``split`` (``"train"``, ``"valid"``, ``"test"`` or
        None) applies it, by Megatron-LM's rules: validation and test batches hold
        ``eval_micro_batch_size`` samples, and with ``full_validation`` the validation split
        is read by the ``full_validation`` sampler, one sample per rank per batch. Their
        ``global_batch_size`` is ``eval_global_batch_size``; without it, the training step's
        where the micro-batch is the same (Megatron-LM's parser defaults it so), else None (no
        step of the training's size describes those batches); under ``full_validation`` None.
        A split of another name is refused: guessing would read it with the wrong sampler."""
        if split not in (None, "train", "valid", "test"):
            raise SamplerError(
                f"the dataset declares split {split!r}; megaload knows 'train', 'valid' and "
                f"'test' (Megatron's Split names) and would not guess which loader it needs"
            )
        if split not in ("valid", "test"):
            return self
        if self.full_validation and split == "valid":
            kind, micro, step = FULL_VALIDATION, 1, None
        else:
            kind, micro = self.dataloader_type, self.eval_micro_batch_size or self.micro_batch_size
            step = self.eval_global_batch_size
            if step is None and micro == self.micro_batch_size:
                step = self.global_batch_size
        if (kind, micro, step) == (
            self.dataloader_type,
            self.micro_batch_size,
            self.global_batch_size,
        ):
            return self
        if step is not None:
            num_micro_batches(step, micro, self.data_parallel_size, prefix="eval_")
        return replace(
            self,
            dataloader_type=kind,
            micro_batch_size=micro,
            eval_micro_batch_size=None,
            global_batch_size=step,
            eval_global_batch_size=None,
        )
