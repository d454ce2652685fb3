"""Megatron-LM's ``get_batch``, signature for signature: the one-line switch of pretrain_gpt.py.

In Megatron-LM's ``pretrain_gpt.py`` (the seed commit, e03878b5f), ``get_batch(data_iterator,
vp_stage=None)`` reads its arguments (``get_args()``) and process groups (``mpu``) and returns
ten values in the order of its ``BATCH_KEYS``. ``megadist.megatron.get_batch`` takes the same
arguments, reads the same state and returns the same list, so

    from megadist.megatron import get_batch

in place of its definition switches a training script to megadist's broadcast and splits.
``topology_from_megatron`` is the :class:`~megadist.topology.BatchTopology` it builds; the
topology knows nothing of Megatron-LM (this adapter depends on it, never the reverse).

What is read: ``micro_batch_size``, ``seq_length``, ``create_attention_mask_in_dataloader``,
``sft`` (packed sequences), ``mtp_num_layers`` and ``hybrid_context_parallel`` from the
arguments; the tensor- and context-parallel groups, the pipeline rank and size and the virtual
pipeline size from ``megatron.core.parallel_state``, and with ``hybrid_context_parallel`` its
data-parallel groups (with and without CP) and hybrid DPxCP groups. Megatron must be importable
(this module imports nothing of it until called).

``HybridCPDataLoaderWrapper(data_iterator, config, pg_collection=None)`` is training.py's
wrapper of the same name (``megatron.core.datasets.data_schedule``), signature for signature:
megadist's :class:`~megadist.hybrid_cp_loader.HybridCPDataLoaderWrapper` on the groups of
``topology_from_megatron`` (or of ``pg_collection``), with the model configuration's
``max_seqlen_per_dp_cp_rank``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from megadist import hybrid_cp_loader
from megadist.errors import TopologyError
from megadist.get_batch import get_batch as _get_batch
from megadist.layout import hybrid_block_sizes
from megadist.topology import BatchTopology, HybridCPGroups, PipelinePosition


def _megatron_args(args: Any | None) -> Any:
    if args is not None:
        return args
    try:
        from megatron.training import get_args
    except ImportError as error:
        raise TopologyError(
            "megadist.megatron reads Megatron-LM's arguments (megatron.training.get_args), and "
            f"megatron.training cannot be imported here ({error}); pass args= explicitly"
        ) from error
    return get_args()


def _parallel_state() -> Any:
    try:
        from megatron.core import parallel_state
    except ImportError as error:
        raise TopologyError(
            "megadist.megatron reads Megatron's process groups (megatron.core.parallel_state), "
            f"which cannot be imported here ({error})"
        ) from error
    if not parallel_state.model_parallel_is_initialized():
        raise TopologyError(
            "Megatron's model-parallel groups are not initialised: call "
            "megatron.core.parallel_state.initialize_model_parallel first (Megatron-LM's "
            "initialize_megatron does)"
        )
    return parallel_state


def _mtp_on_this_rank(args: Any, vp_stage: int | None) -> bool:
    """Megatron's ``mtp_on_this_rank`` for the model chunk, as pretrain_gpt.py asks it."""
    if not getattr(args, "mtp_num_layers", None):
        return False
    from megatron.core.transformer.multi_token_prediction import mtp_on_this_rank
    from megatron.training.arguments import core_transformer_config_from_args

    config = core_transformer_config_from_args(args)
    return bool(
        mtp_on_this_rank(
            layout=config.pipeline_model_parallel_layout,
            mtp_num_layers=config.mtp_num_layers,
            ignore_virtual=False,
            vp_stage=vp_stage,
        )
    )


def topology_from_megatron(vp_stage: int | None = None, args: Any | None = None) -> BatchTopology:
    """This rank's :class:`BatchTopology`, read from Megatron's arguments (``args``, default
    ``get_args()``) and its initialised ``parallel_state``, for model chunk ``vp_stage``."""
    args = _megatron_args(args)
    mpu = _parallel_state()
    pipeline = PipelinePosition.of(
        mpu.get_pipeline_model_parallel_rank(), mpu.get_pipeline_model_parallel_world_size()
    )
    return BatchTopology(
        micro_batch_size=args.micro_batch_size,
        seq_length=args.seq_length,
        tp_group=mpu.get_tensor_model_parallel_group(),
        cp_group=mpu.get_context_parallel_group(),
        pipeline=pipeline,
        mtp_on_this_rank=_mtp_on_this_rank(args, vp_stage),
        attention_mask=bool(getattr(args, "create_attention_mask_in_dataloader", False)),
        packed_sequences=bool(getattr(args, "sft", False)),
        # without a chunk, Megatron asks about the rank's stage, whatever the virtual pipeline
        virtual_pipeline_size=(
            None if vp_stage is None else mpu.get_virtual_pipeline_model_parallel_world_size()
        ),
        hybrid_cp=_hybrid_cp_groups(mpu)
        if getattr(args, "hybrid_context_parallel", False)
        else None,
    )


def _hybrid_cp_groups(mpu: Any) -> HybridCPGroups:
    """Megatron's hybrid DPxCP groups of this rank (initialize_model_parallel with
    ``hybrid_context_parallel=True`` builds them)."""
    dp_cp = mpu.get_data_parallel_group(with_context_parallel=True)
    sizes = hybrid_block_sizes(mpu.get_data_parallel_world_size(with_context_parallel=True))
    return HybridCPGroups(
        dp_group=mpu.get_data_parallel_group(),
        dp_cp_group=dp_cp,
        blocks=tuple((s, mpu.get_hybrid_data_context_parallel_groups(group_size=s)) for s in sizes),
    )


def get_batch(
    data_iterator: Iterator[Mapping[str, Any]] | None,
    vp_stage: int | None = None,
    *,
    args: Any | None = None,
) -> list[Any]:
    """Megatron-LM's ``pretrain_gpt.get_batch``: this rank's share of the next micro-batch as
    the list of its ten ``BATCH_KEYS``, alphabetical (keys this rank does not hold are None)."""
    topology = topology_from_megatron(vp_stage, args)
    return list(_get_batch(data_iterator, topology, vp_stage=vp_stage))


class HybridCPModelConfig(Protocol):
    """What the wrapper reads of Megatron's model configuration (``TransformerConfig``)."""

    max_seqlen_per_dp_cp_rank: int


#: the groups Megatron's wrapper takes from a ``pg_collection``: its attribute -> what it is
PG_COLLECTION_GROUPS = {"dp_cp": "data parallel with CP", "dp": "data parallel", "tp": "tensor"}


def _with_pg_collection(
    topology: BatchTopology, hybrid: HybridCPGroups, pg_collection: Any
) -> BatchTopology:
    """``topology`` (whose hybrid CP groups are ``hybrid``) on the DPxCP, DP and TP groups of
    Megatron's ``ProcessGroupCollection``, which the seed's wrapper reads in place of
    ``parallel_state``'s when given one."""
    groups = {name: getattr(pg_collection, name, None) for name in PG_COLLECTION_GROUPS}
    missing = [f"{name} ({PG_COLLECTION_GROUPS[name]})" for name, g in groups.items() if g is None]
    if missing:
        raise TopologyError(
            f"the pg_collection given to HybridCPDataLoaderWrapper has no {', '.join(missing)} "
            "group; hybrid context parallelism needs dp_cp, dp and tp: set them, or pass none "
            "(the groups then come from parallel_state)"
        )
    hybrid = dataclasses.replace(hybrid, dp_group=groups["dp"], dp_cp_group=groups["dp_cp"])
    return dataclasses.replace(topology, tp_group=groups["tp"], hybrid_cp=hybrid)


class HybridCPDataLoaderWrapper(hybrid_cp_loader.HybridCPDataLoaderWrapper):
    """Megatron-LM's ``HybridCPDataLoaderWrapper(data_iterator, config, pg_collection=None)``:
    megadist's wrapper on this rank's groups (its arguments need ``hybrid_context_parallel``),
    dealing at most ``config.max_seqlen_per_dp_cp_rank`` tokens of a sequence to a rank. The
    DPxCP, DP and TP groups are ``pg_collection``'s ``dp_cp``, ``dp`` and ``tp`` when one is
    given, else ``parallel_state``'s, as the seed commit's wrapper takes them."""

    def __init__(
        self,
        data_iterator: Iterator[list[Mapping[str, Any]]] | None,
        config: HybridCPModelConfig,
        pg_collection: Any = None,
        *,
        args: Any | None = None,
    ) -> None:
        topology = topology_from_megatron(args=args)
        if topology.hybrid_cp is None:
            raise TopologyError(
                "HybridCPDataLoaderWrapper needs Megatron-LM's --hybrid-context-parallel "
                "(args.hybrid_context_parallel is off)"
            )
        if pg_collection is not None:
            topology = _with_pg_collection(topology, topology.hybrid_cp, pg_collection)
        super().__init__(data_iterator, topology, config.max_seqlen_per_dp_cp_rank)
