"""Megatron-LM's data loader functions, signature for signature: the one-line switch of
``megatron/training/datasets/data_samplers.py`` (the seed commit, e03878b5f).

Megatron-LM's ``build_pretraining_data_loader(dataset, consumed_samples)`` reads its arguments
(``get_args()``) and data-parallel rank and size (``mpu``); this module's does the same and
returns megaload's :class:`~megaload.loader.MegatronDataLoader`, so

    from megaload.megatron import build_pretraining_data_loader, cyclic_iter

in training.py switches the loaders. :func:`data_loader_config` is the
:class:`~megaload.config.DataLoaderConfig` it reads; the configuration knows nothing of
Megatron-LM (this adapter depends on it, never the reverse).

Read from the arguments: ``micro_batch_size``, ``global_batch_size``, ``dataloader_type``
(None is ``single``, as Megatron-LM's parser sets it), ``eval_micro_batch_size``,
``eval_global_batch_size`` (where it is missing, ``global_batch_size``, as Megatron-LM's loader
reads it), ``num_workers``, ``data_sharding``, ``full_validation``. Not carried over: the worker's
``exit_signal_handler`` (megaload's workers close GPU descriptors as Megatron's do, and leave
signals to the main process). With ``hybrid_context_parallel`` the ``single`` training loader
becomes the ``hybrid_cp`` sampler's (a rank's share of a whole global batch, uncollated), as
Megatron-LM's does; Megatron-LM allows hybrid context parallelism with ``single`` only.
"""

from __future__ import annotations

from typing import Any

from megaload.config import DataLoaderConfig
from megaload.errors import SamplerError
from megaload.hybrid_cp_sampler import HYBRID_CP_SAMPLER
from megaload.iterators import cyclic_iter
from megaload.loader import build_pretraining_data_loader as _build_loader


def _megatron_args(args: Any | None) -> Any:
    if args is not None:
        return args
    try:
        from megatron.training import get_args
    except ImportError as error:
        raise SamplerError(
            "megaload.megatron reads Megatron-LM's arguments (megatron.training.get_args), and "
            f"megatron.training cannot be imported here ({error}); pass args= explicitly"
        ) from error
    return get_args()


def _data_parallel_place() -> tuple[int, int]:
    """This rank's data-parallel rank and size from Megatron's ``parallel_state``."""
    try:
        from megatron.core import parallel_state
    except ImportError as error:
        raise SamplerError(
            "megaload.megatron reads the data-parallel rank from Megatron's parallel_state, "
            f"which cannot be imported here ({error}); pass data_parallel_rank and "
            "data_parallel_size"
        ) from error
    if not parallel_state.model_parallel_is_initialized():
        raise SamplerError(
            "Megatron's model-parallel groups are not initialised: call "
            "megatron.core.parallel_state.initialize_model_parallel first, or pass "
            "data_parallel_rank and data_parallel_size"
        )
    return parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size()


def data_loader_config(
    args: Any | None = None,
    *,
    data_parallel_rank: int | None = None,
    data_parallel_size: int | None = None,
) -> DataLoaderConfig:
    """The :class:`DataLoaderConfig` of Megatron-LM's arguments (``args``, default its
    ``get_args()``); the data-parallel place is read from ``parallel_state`` unless given."""
    args = _megatron_args(args)
    dataloader_type = getattr(args, "dataloader_type", None) or "single"
    if getattr(args, "hybrid_context_parallel", False):
        if dataloader_type != "single":
            raise SamplerError(
                f"--hybrid-context-parallel reads with the single dataloader type only, found "
                f"--dataloader-type {dataloader_type}"
            )
        dataloader_type = HYBRID_CP_SAMPLER
    if data_parallel_rank is None or data_parallel_size is None:
        data_parallel_rank, data_parallel_size = _data_parallel_place()
    global_batch_size = getattr(args, "global_batch_size", None)
    return DataLoaderConfig(
        micro_batch_size=args.micro_batch_size,
        global_batch_size=global_batch_size,
        dataloader_type=dataloader_type,
        eval_micro_batch_size=getattr(args, "eval_micro_batch_size", None),
        eval_global_batch_size=getattr(args, "eval_global_batch_size", global_batch_size),
        data_parallel_rank=data_parallel_rank,
        data_parallel_size=data_parallel_size,
        num_workers=getattr(args, "num_workers", 2),
        data_sharding=getattr(args, "data_sharding", True),
        full_validation=bool(getattr(args, "full_validation", False)),
    )


def build_pretraining_data_loader(
    dataset: Any, consumed_samples: int, *, args: Any | None = None
) -> Any:
    """Megatron-LM's ``build_pretraining_data_loader``: None without a dataset, the dataset
    itself for ``external``, else megaload's loader from ``consumed_samples`` on, configured
    from Megatron's arguments and data-parallel groups."""
    if dataset is None:
        return None
    return _build_loader(dataset, consumed_samples, data_loader_config(args))


__all__ = ["build_pretraining_data_loader", "cyclic_iter", "data_loader_config"]
