"""Runs inside a seed worker (testing/seedref.py): the seed commit's hybrid context parallelism,
its ``BalancedCPScheduler``, its ``HybridCPDataLoaderWrapper`` and its get_batch functions
under ``is_hybrid_cp``, on CPU tensors over gloo.

Stand-ins, only for what needs CUDA or a real process group object:

- ``torch.Tensor.cuda`` returns the tensor itself and ``torch.cuda.current_device`` answers
  ``"cpu"`` (the wrapper and get_batch move tensors to and allocate buffers on the GPU);
- the scheduler alone (``schedules``) is given a stand-in for its DPxCP group: an object whose
  ``size()`` is the number of ranks, which is all the scheduler asks of it.
"""

from __future__ import annotations

import types

from seed_sft_dist import read_on_source


def schedules(cases: list) -> list:
    """For each (max_seq_len_per_rank, total_ranks, [(id, length), ...]) case, the seed's
    (lengths per group and rank, ids per group and rank), or ("raised", exception class)."""
    from megatron.core.pipeline_parallel.hybrid_cp_schedule import BalancedCPScheduler

    answers = []
    for max_len, total, items in cases:
        group = types.SimpleNamespace(size=lambda total=total: total)
        try:
            scheduler = BalancedCPScheduler(max_seq_len_per_rank=max_len, dp_cp_group=group)
            answers.append(scheduler.get_groups_and_subsamples(list(items), None))
        except Exception as error:  # compared with ours: both raise or neither
            answers.append(("raised", type(error).__name__))
    return answers


def sampler_batches(
    total: int,
    consumed: int,
    micro: int,
    global_batch: int,
    rank: int,
    dp: int,
    drop_last: bool,
    count: int,
) -> list:
    """The first ``count`` batches of the seed's ``HybridCPMegatronPretrainingSampler``."""
    import itertools

    from megatron.training.datasets.data_samplers import HybridCPMegatronPretrainingSampler

    sampler = HybridCPMegatronPretrainingSampler(
        total_samples=total,
        consumed_samples=consumed,
        micro_batch_size=micro,
        global_batch_size=global_batch,
        data_parallel_rank=rank,
        data_parallel_size=dp,
        drop_last=drop_last,
    )
    return [list(batch) for batch in itertools.islice(sampler, count)]


def _without_cuda() -> None:
    import torch

    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.cuda.current_device = lambda: "cpu"


def _numpy(batch: dict) -> dict:
    import torch.distributed as dist

    answer = {}
    for key, value in batch.items():
        if key == "hybrid_cp_group":
            answer[key] = None if value is None else dist.get_process_group_ranks(value)
        else:
            answer[key] = None if value is None else value.numpy().copy()
    return answer


def hybrid_run(rank: int, world: int, rendezvous: str, cases: list) -> list:
    """Each case on this rank, under Megatron's own groups (``initialize_model_parallel`` with
    ``hybrid_context_parallel``): ``("wrapper", tp, cp, max_len, steps)`` gives, per step,
    the wrapper's schedule and the sub-sequences this rank receives (``steps[s][dp_rank]`` is a
    DP rank's list of packed samples); ``("get_batch", tp, cp, micro_batches)`` gives this
    rank's get_batch share of each micro-batch (fed on TP rank 0). ``("switched_wrapper",
    ...)`` is a wrapper case run by megadist.megatron's wrapper (the one-line switch of
    training.py) on the same Megatron groups."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu
    from megatron.core.datasets.data_schedule import HybridCPDataLoaderWrapper

    _without_cuda()
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    answers = []
    try:
        for kind, tp, cp, *rest in cases:
            mpu.initialize_model_parallel(
                tensor_model_parallel_size=tp,
                context_parallel_size=cp,
                hybrid_context_parallel=True,
            )
            tp_rank = mpu.get_tensor_model_parallel_rank()
            if kind in ("wrapper", "switched_wrapper"):
                max_len, steps = rest
                dp_rank = mpu.get_data_parallel_rank()
                loaded = [
                    [{k: torch.from_numpy(v) for k, v in s.items()} for s in step[dp_rank]]
                    for step in steps
                ]
                config = types.SimpleNamespace(max_seqlen_per_dp_cp_rank=max_len)
                source = iter(loaded) if tp_rank == 0 else None
                if kind == "wrapper":
                    wrapper = HybridCPDataLoaderWrapper(source, config)
                else:
                    from megadist import megatron as switched

                    args = types.SimpleNamespace(
                        micro_batch_size=1, seq_length=max_len, hybrid_context_parallel=True
                    )
                    wrapper = switched.HybridCPDataLoaderWrapper(source, config, args=args)
                taken = []
                for _ in steps:
                    received, schedule = next(wrapper)
                    if received is not None:
                        received = {gid: _numpy(piece) for gid, piece in received.items()}
                    taken.append((schedule, received))
                answers.append(taken)
            else:
                (micro_batches,) = rest
                shares = []
                for loaded in micro_batches:
                    batch = _seed_share(read_on_source(loaded, tp_rank), cp, tp_rank, False, 1, 0)
                    shares.append(_numpy(batch))
                answers.append(shares)
            mpu.destroy_model_parallel()
        dist.barrier()
        return answers
    finally:
        dist.destroy_process_group()


def defaults_run(rank: int, world: int, rendezvous: str, cases: list) -> list:
    """Hybrid CP with Megatron-LM's default flags (``--create-attention-mask-in-dataloader``)
    and ``--micro-batch-size`` above 1, each wrapper given a ``pg_collection``: per case
    ``(tp, cp, max_len, steps, micro_batches, mbs, seq_length)``, the seed's wrapper steps and
    get_batch shares and megadist.megatron's (the switched ones) on the same groups; at TP > 1,
    where the seed would corrupt the batch, only ours run: the message each refusal raises."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu
    from megatron.core.datasets.data_schedule import HybridCPDataLoaderWrapper

    from megadist import megatron as switched
    from megadist.errors import TopologyError

    _without_cuda()
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    answers = []
    try:
        for tp, cp, max_len, steps, micro_batches, mbs, seq_length in cases:
            mpu.initialize_model_parallel(
                tensor_model_parallel_size=tp,
                context_parallel_size=cp,
                hybrid_context_parallel=True,
            )
            tp_rank, dp_rank = mpu.get_tensor_model_parallel_rank(), mpu.get_data_parallel_rank()
            pg = types.SimpleNamespace(
                dp_cp=mpu.get_data_parallel_group(with_context_parallel=True),
                dp=mpu.get_data_parallel_group(),
                tp=mpu.get_tensor_model_parallel_group(),
            )
            config = types.SimpleNamespace(max_seqlen_per_dp_cp_rank=max_len)
            args = types.SimpleNamespace(
                micro_batch_size=mbs, seq_length=seq_length,
                hybrid_context_parallel=True, create_attention_mask_in_dataloader=True,
            )  # fmt: skip

            answer = {}
            try:
                answer["ours_steps"] = _steps_of(
                    switched.HybridCPDataLoaderWrapper(
                        _source(steps, dp_rank, tp_rank), config, pg, args=args
                    ),
                    len(steps),
                )
                feed = iter([{k: torch.from_numpy(v) for k, v in b.items()} for b in micro_batches])
                answer["ours_shares"] = [
                    _numpy(dict(zip(_KEYS, batch, strict=True)))
                    for batch in (
                        switched.get_batch(feed if tp_rank == 0 else None, args=args)
                        for _ in micro_batches
                    )
                ]
            except TopologyError as error:
                answer["ours_refused"] = str(error)
            if tp == 1:
                answer["seed_steps"] = _steps_of(
                    HybridCPDataLoaderWrapper(_source(steps, dp_rank, tp_rank), config, pg),
                    len(steps),
                )
                answer["seed_shares"] = [
                    _numpy(
                        _seed_share(
                            read_on_source(loaded, tp_rank), cp, tp_rank, True, mbs, seq_length
                        )
                    )
                    for loaded in micro_batches
                ]
            answers.append(answer)
            mpu.destroy_model_parallel()
        dist.barrier()
        return answers
    finally:
        dist.destroy_process_group()


def _seed_share(
    loaded, cp: int, tp_rank: int, attention_mask: bool, micro_batch_size: int, seq_length: int
) -> dict:
    """The seed's get_batch under hybrid CP for one micro-batch (``loaded`` on TP rank 0, None
    elsewhere): ``get_batch_on_this_tp_rank`` then ``get_batch_on_this_cp_rank``, as
    pretrain_gpt.py calls them, with ``--create-attention-mask-in-dataloader`` as given."""
    from megatron.core import parallel_state as mpu
    from megatron.core import utils as core_utils

    batch = core_utils.get_batch_on_this_tp_rank(
        loaded,
        is_sft=False,
        is_hybrid_cp=True,
        create_attention_mask_in_dataloader=attention_mask,
        broadcast_src_rank=mpu.get_tensor_model_parallel_src_rank(),
        broadcast_group=mpu.get_tensor_model_parallel_group(),
        cp_size=cp,
        tp_rank=tp_rank,
        micro_batch_size=micro_batch_size,
        seq_length=seq_length,
        mtp_on_this_rank=False,
    )
    return core_utils.get_batch_on_this_cp_rank(
        batch,
        is_hybrid_cp=True,
        cp_group=mpu.get_context_parallel_group(),
        hybrid_cp_group_func=mpu.get_hybrid_data_context_parallel_groups,
    )


def _source(steps: list, dp_rank: int, tp_rank: int):
    """The loader of a DP rank's steps (its lists of packed samples), on TP rank 0 only."""
    import torch

    if tp_rank != 0:
        return None
    return iter([[{k: torch.from_numpy(v) for k, v in s.items()} for s in step[dp_rank]]
                 for step in steps])  # fmt: skip


def _steps_of(wrapper, count: int) -> list:
    """A wrapper's first ``count`` steps: (schedule, sub-sequences received, as numpy)."""
    taken = []
    for _ in range(count):
        received, schedule = next(wrapper)
        if received is not None:
            received = {gid: _numpy(piece) for gid, piece in received.items()}
        taken.append((schedule, received))
    return taken


#: pretrain_gpt.get_batch's keys: the order of the list megadist.megatron.get_batch returns
_KEYS = (
    "attention_mask", "cu_seqlens", "cu_seqlens_padded", "hybrid_cp_group", "labels",
    "local_cp_size", "loss_mask", "max_seqlen", "position_ids", "tokens",
)  # fmt: skip
