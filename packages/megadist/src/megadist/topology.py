"""Where a rank stands for ``get_batch``: its tensor and context-parallel groups, its pipeline
position, and what its micro-batches look like.

Megatron reads all of this from global state (``mpu``, ``get_args()``); here it is one explicit,
immutable object built from process groups the caller already has.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from enum import Enum

import torch
import torch.distributed as dist

from megadist.errors import TopologyError
from megadist.keys import BATCH_KEYS, BOUNDARY_KEYS


class PipelinePosition(Enum):
    """A rank's pipeline stage as far as data goes: the first stage embeds tokens, the last
    computes the loss, a single stage (pipeline size 1) does both, middle stages neither."""

    SINGLE = "single"
    FIRST = "first"
    MIDDLE = "middle"
    LAST = "last"

    @classmethod
    def of(cls, pp_rank: int, pp_size: int) -> PipelinePosition:
        """The position of stage ``pp_rank`` in a pipeline of ``pp_size`` stages."""
        if not 0 <= pp_rank < pp_size:
            raise TopologyError(f"pipeline rank {pp_rank} is outside a pipeline of {pp_size}")
        if pp_size == 1:
            return cls.SINGLE
        if pp_rank == 0:
            return cls.FIRST
        return cls.LAST if pp_rank == pp_size - 1 else cls.MIDDLE


#: the per-token keys each position needs (Megatron's get_batch_on_this_tp_rank)
_POSITION_KEYS: dict[PipelinePosition, tuple[str, ...]] = {
    PipelinePosition.SINGLE: ("tokens", "labels", "loss_mask", "position_ids"),
    PipelinePosition.FIRST: ("tokens", "position_ids"),
    PipelinePosition.LAST: ("labels", "loss_mask"),
    PipelinePosition.MIDDLE: (),
}


def _uses_nccl(group: dist.ProcessGroup | None) -> bool:
    """Whether ``group`` runs NCCL (alone, or for CUDA tensors as in ``cpu:gloo,cuda:nccl``)."""
    return dist.is_available() and dist.is_initialized() and "nccl" in dist.get_backend(group)


def device_for_group(group: dist.ProcessGroup | None) -> torch.device:
    """Where a group's collectives run: the current CUDA device for NCCL, else the CPU."""
    if _uses_nccl(group):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _rank_and_size(group: dist.ProcessGroup | None, name: str) -> tuple[int, int]:
    if group is None:
        return 0, 1
    rank = dist.get_rank(group)
    if rank < 0:
        raise TopologyError(
            f"global rank {dist.get_rank()} is not a member of the {name} group it was given "
            f"(ranks {dist.get_process_group_ranks(group)})"
        )
    return rank, dist.get_world_size(group)


@dataclass(frozen=True, eq=False)
class HybridCPGroups:
    """The groups of hybrid context parallelism for this rank (Megatron's
    ``--hybrid-context-parallel``): its data-parallel group (ranks with other data, same CP
    rank), its data-parallel-with-CP group (all ranks that share the scheduled sub-sequences),
    and, for each power-of-two size below that group's, the aligned block of that many
    consecutive DPxCP ranks it belongs to (Megatron's ``create_hybrid_dp_cp_groups``); the whole
    DPxCP group serves its own size. Compared by identity: groups are handles."""

    dp_group: dist.ProcessGroup
    dp_cp_group: dist.ProcessGroup
    blocks: tuple[tuple[int, dist.ProcessGroup], ...] = ()
    """(size, group) for sizes 2, 4, ... below the DPxCP group's size"""

    @property
    def dp_cp_size(self) -> int:
        return dist.get_world_size(self.dp_cp_group)

    def group(self, size: int) -> dist.ProcessGroup:
        """The CP group of ``size`` ranks this rank trains a sub-sequence with (Megatron's
        ``get_hybrid_data_context_parallel_groups(group_size=size)``)."""
        if size == self.dp_cp_size:
            return self.dp_cp_group
        for block_size, group in self.blocks:
            if block_size == size:
                return group
        sizes = sorted({*(s for s, _ in self.blocks), self.dp_cp_size})
        raise TopologyError(
            f"no hybrid CP group of {size} ranks: this rank's sizes are {sizes} (powers of two "
            f"below the DPxCP size {self.dp_cp_size}, and that size)"
        )


@dataclass(frozen=True)
class BatchTopology:
    """What ``broadcast_batch`` and ``get_batch`` need to know about this rank.

    ``tp_group``/``cp_group`` None mean size 1. ``attention_mask`` says whether the loader's
    batches carry a ``[mbs, 1, S, S]`` mask (Megatron's ``--create-attention-mask-in-dataloader``);
    ``packed_sequences`` whether they carry ``cu_seqlens``, ``cu_seqlens_padded`` and
    ``max_seqlen`` (SFT packing; micro batch size 1, as in Megatron). ``cp_partitioner`` names a
    ``megadist.cp_partitioners`` plugin; None takes ``thd`` for packed sequences, else
    ``zigzag``. ``device`` None takes the TP group's backend device.
    ``virtual_pipeline_size`` is the number of model chunks per pipeline rank (Megatron's
    virtual pipeline size); None without interleaving. With it, ``get_batch`` needs the
    chunk's ``vp_stage``. ``hybrid_cp`` (Megatron's ``--hybrid-context-parallel``): each
    micro-batch is one sub-sequence of any length up to ``seq_length``, with its boundaries and
    ``local_cp_size``, split across the hybrid CP group of that size (``cp_group`` is used for
    a micro-batch without boundaries, as in Megatron).
    """

    micro_batch_size: int
    seq_length: int
    tp_group: dist.ProcessGroup | None = None
    cp_group: dist.ProcessGroup | None = None
    pipeline: PipelinePosition = PipelinePosition.SINGLE
    mtp_on_this_rank: bool = False
    attention_mask: bool = False
    packed_sequences: bool = False
    cp_partitioner: str | None = None
    device: torch.device | None = None
    virtual_pipeline_size: int | None = None
    hybrid_cp: HybridCPGroups | None = None
    tp_rank: int = field(init=False)
    tp_size: int = field(init=False)
    tp_src_rank: int = field(init=False)
    """the global rank of the group's rank 0, which reads the data"""
    cp_rank: int = field(init=False)
    cp_size: int = field(init=False)

    def __post_init__(self) -> None:
        tp_rank, tp_size = _rank_and_size(self.tp_group, "TP")
        cp_rank, cp_size = _rank_and_size(self.cp_group, "CP")
        src = dist.get_global_rank(self.tp_group, 0) if self.tp_group is not None else 0
        settings = {
            "tp_rank": tp_rank,
            "tp_size": tp_size,
            "tp_src_rank": src,
            "cp_rank": cp_rank,
            "cp_size": cp_size,
            "pipeline": PipelinePosition(self.pipeline),
            "device": torch.device(self.device or device_for_group(self.tp_group)),
        }
        for name, value in settings.items():
            object.__setattr__(self, name, value)
        self._check()

    def _check(self) -> None:
        if self.micro_batch_size < 1 or self.seq_length < 1:
            raise TopologyError(
                f"micro_batch_size and seq_length must be positive, found "
                f"{self.micro_batch_size} and {self.seq_length}"
            )
        # under hybrid CP a micro-batch is one sub-sequence whatever the sampler's size
        # (_check_hybrid_cp refuses the sizes the seed's broadcast would get wrong)
        if self.packed_sequences and self.micro_batch_size != 1 and self.hybrid_cp is None:
            raise TopologyError(
                f"packed sequences need micro_batch_size 1 (one packed row per micro-batch, as "
                f"in Megatron), found {self.micro_batch_size}"
            )
        if self.device.type == "cpu" and self.tp_size > 1 and _uses_nccl(self.tp_group):
            raise TopologyError(
                "the TP group runs NCCL, which cannot broadcast CPU tensors; pass a CUDA device "
                "or leave device=None"
            )
        if self.virtual_pipeline_size is not None and self.virtual_pipeline_size < 1:
            raise TopologyError(
                f"virtual_pipeline_size must be positive or None, found "
                f"{self.virtual_pipeline_size}"
            )
        if self.hybrid_cp is not None:
            self._check_hybrid_cp()
        if self.cp_size > 1 and self.seq_length % (2 * self.cp_size):
            raise TopologyError(
                f"seq_length {self.seq_length} is not divisible by 2 x cp_size = "
                f"{2 * self.cp_size}: context parallelism splits each sequence into "
                f"{2 * self.cp_size} equal chunks"
            )

    def _check_hybrid_cp(self) -> None:
        """Hybrid CP runs without pipeline parallelism (Megatron refuses it). Each micro-batch
        is one scheduled sub-sequence, one row of its own length and no mask; at tensor-parallel
        size 1 nothing is broadcast and ``--micro-batch-size`` (the sampler's) and
        ``--create-attention-mask-in-dataloader`` change nothing, as at the seed commit. At
        larger TP sizes the seed's get_batch sizes the other TP ranks' buffers by them (a mask
        of seq_length x seq_length, micro_batch_size rows), so the batch would be corrupted:
        refused, naming the flag and the fix."""
        if self.pipeline is not PipelinePosition.SINGLE:
            raise TopologyError(
                "hybrid context parallelism works without pipeline parallelism (Megatron "
                f"refuses it); found pipeline {self.pipeline.value}"
            )
        if self.tp_size == 1:
            return
        if self.attention_mask:
            raise TopologyError(
                f"--hybrid-context-parallel with --create-attention-mask-in-dataloader (on by "
                f"default) at tensor-parallel size {self.tp_size}: a hybrid-CP sub-sequence "
                "carries no mask, and the seed commit's get_batch would broadcast a "
                "seq_length x seq_length one to the other TP ranks and corrupt the batch; give "
                "--no-create-attention-mask-in-dataloader (or tensor-parallel size 1)"
            )
        if self.micro_batch_size != 1:
            raise TopologyError(
                f"--hybrid-context-parallel with --micro-batch-size {self.micro_batch_size} at "
                f"tensor-parallel size {self.tp_size}: each hybrid-CP micro-batch is one "
                "scheduled sub-sequence (one row), and the seed commit's get_batch would size "
                f"the other TP ranks' buffers for {self.micro_batch_size} rows and corrupt the "
                "batch; give --micro-batch-size 1 (or tensor-parallel size 1)"
            )

    @property
    def is_source(self) -> bool:
        """Whether this rank reads the data loader (TP rank 0)."""
        return self.tp_rank == 0

    @property
    def reads_data(self) -> bool:
        """Whether this position needs any data; Megatron's middle stages skip get_batch
        unless they carry MTP layers or packed-sequence boundaries."""
        return bool(self.payload_keys)

    @functools.cached_property  # asked several times per micro-batch; the topology is frozen
    def payload_keys(self) -> tuple[str, ...]:
        """The keys that reach this position, in ``BATCH_KEYS`` order; the others are None."""
        position = PipelinePosition.SINGLE if self.mtp_on_this_rank else self.pipeline
        needed = set(_POSITION_KEYS[position])
        if self.attention_mask and needed:
            needed.add("attention_mask")
        if self.packed_sequences or self.hybrid_cp is not None:
            needed.update(BOUNDARY_KEYS, ["max_seqlen"])
        if self.hybrid_cp is not None:
            needed.add("local_cp_size")
        return tuple(key for key in BATCH_KEYS if key in needed)

    def chunk_at_an_end(self, vp_stage: int | None) -> bool:
        """Whether model chunk ``vp_stage`` of this rank holds the first or the last layers of
        the whole model: Megatron's ``is_first_or_last_pipeline_stage(vp_stage)``. ``vp_stage``
        None asks about the rank (every chunk), as Megatron does without it."""
        if vp_stage is None or self.virtual_pipeline_size is None:
            return self.pipeline is not PipelinePosition.MIDDLE
        if not 0 <= vp_stage < self.virtual_pipeline_size:
            raise TopologyError(
                f"vp_stage {vp_stage} is outside the {self.virtual_pipeline_size} model chunks "
                f"of a rank"
            )
        first = vp_stage == 0 and self.pipeline in (PipelinePosition.SINGLE, PipelinePosition.FIRST)
        last_chunk = vp_stage == self.virtual_pipeline_size - 1
        last = last_chunk and self.pipeline in (PipelinePosition.SINGLE, PipelinePosition.LAST)
        return first or last

    @property
    def partitioner_name(self) -> str:
        """The ``megadist.cp_partitioners`` plugin that splits this rank's batches."""
        return self.cp_partitioner or ("thd" if self.packed_sequences else "zigzag")

    @property
    def local_seq_length(self) -> int:
        """The sequence length each CP rank keeps."""
        return self.seq_length // self.cp_size
