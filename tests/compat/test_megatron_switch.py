"""The one-line switch: megadist.megatron.get_batch and megaload.megatron's loader read
Megatron's own arguments and process groups and answer as the seed commit's functions do.

The process groups are megatron-core's (``parallel_state.initialize_model_parallel`` on gloo
ranks); the arguments a namespace with the names Megatron-LM's parser gives them.
"""

from __future__ import annotations

import ast
import itertools
import random
import types
import warnings

import numpy
import pytest
import torch
from seedref import source_root

from megadist import TopologyError, zigzag_split
from megadist.spawn import run_distributed

pytestmark = [pytest.mark.compat, pytest.mark.distributed]

SEQ = 8
MBS = 2


def seed_batch_keys() -> list[str]:
    """``BATCH_KEYS`` as the seed commit's pretrain_gpt.get_batch lists them (its source)."""
    tree = ast.parse((source_root() / "pretrain_gpt.py").read_text())
    function = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "get_batch"
    )
    assignment = next(
        node
        for node in ast.walk(function)
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "BATCH_KEYS"
    )
    return ast.literal_eval(assignment.value)


@pytest.mark.seed
def test_batch_keys_are_the_seed_commit_s_in_its_order() -> None:
    from megadist import BATCH_KEYS, Batch

    assert list(BATCH_KEYS) == seed_batch_keys()
    assert list(Batch._fields) == seed_batch_keys()


def megatron_args(**overrides: object) -> types.SimpleNamespace:
    settings = {
        "micro_batch_size": MBS,
        "seq_length": SEQ,
        "create_attention_mask_in_dataloader": False,
        "sft": False,
        "mtp_num_layers": None,
        "hybrid_context_parallel": False,
    }
    settings.update(overrides)
    return types.SimpleNamespace(**settings)


def loader_batch() -> dict:
    generator = torch.Generator().manual_seed(7)
    shape = (MBS, SEQ)
    return {
        "tokens": torch.randint(0, 1000, shape, generator=generator),
        "labels": torch.randint(0, 1000, shape, generator=generator),
        "loss_mask": torch.rand(shape, generator=generator),
        "position_ids": torch.arange(SEQ).repeat(MBS, 1),
        "dataset_id": torch.zeros(MBS, dtype=torch.int64),
    }


def switched_rank(tp: int, cp: int, pp: int) -> dict:
    """One rank: Megatron's groups, then the switched get_batch, values as numpy."""
    warnings.simplefilter("ignore")
    from megatron.core import parallel_state as mpu

    from megadist.megatron import get_batch

    mpu.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        context_parallel_size=cp,
    )
    try:
        is_source = mpu.get_tensor_model_parallel_rank() == 0
        values = get_batch(iter([loader_batch()]) if is_source else None, args=megatron_args())
        return {
            "cp_rank": mpu.get_context_parallel_rank(),
            "pp_rank": mpu.get_pipeline_model_parallel_rank(),
            "values": [v.numpy() if isinstance(v, torch.Tensor) else v for v in values],
        }
    finally:
        mpu.destroy_model_parallel()


@pytest.mark.parametrize(("tp", "cp", "pp"), [(2, 2, 1), (2, 1, 2)])
@pytest.mark.seed
def test_switched_get_batch_returns_the_seed_commit_s_ten_values_per_rank(
    tp: int, cp: int, pp: int
) -> None:
    keys = seed_batch_keys()
    full = loader_batch()
    for report in run_distributed(switched_rank, 4, tp, cp, pp):
        values = dict(zip(keys, report["values"], strict=True))
        expected = {k: v for k, v in full.items() if k != "dataset_id"}
        if cp > 1:
            expected = zigzag_split(expected, report["cp_rank"], cp)
        if pp > 1:  # the first stage embeds, the last computes the loss
            kept = ("tokens", "position_ids") if report["pp_rank"] == 0 else ("labels", "loss_mask")
            expected = {k: expected[k] for k in kept}
        assert {k for k, v in values.items() if v is not None} == set(expected)
        for key, tensor in expected.items():
            numpy.testing.assert_array_equal(values[key], tensor.numpy(), err_msg=key)


def switched_hybrid_rank() -> dict:
    """One rank of CP=2 x DP=2 with Megatron's hybrid groups: a sub-sequence of SEQ tokens
    scheduled on 2 ranks, through the switched get_batch."""
    warnings.simplefilter("ignore")
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    from megadist.megatron import get_batch

    mpu.initialize_model_parallel(context_parallel_size=2, hybrid_context_parallel=True)
    try:
        batch = {k: v[:1] for k, v in loader_batch().items() if k != "dataset_id"}
        batch["cu_seqlens"] = torch.tensor([[0, SEQ]], dtype=torch.int32)
        batch["max_seqlen"] = torch.tensor([SEQ], dtype=torch.int32)
        batch["local_cp_size"] = torch.tensor([2], dtype=torch.int32)
        args = megatron_args(hybrid_context_parallel=True, micro_batch_size=1)
        values = dict(zip(seed_batch_keys(), get_batch(iter([batch]), args=args), strict=True))
        return {
            "group": dist.get_process_group_ranks(values["hybrid_cp_group"]),
            "tokens": values["tokens"].numpy(),
            "local_cp_size": int(values["local_cp_size"]),
        }
    finally:
        mpu.destroy_model_parallel()


@pytest.mark.seed
def test_switched_get_batch_splits_over_megatron_s_hybrid_cp_groups() -> None:
    full = loader_batch()["tokens"][:1]
    for rank, report in enumerate(run_distributed(switched_hybrid_rank, 4)):
        block = [rank - rank % 2, rank - rank % 2 + 1]  # Megatron's aligned blocks of 2
        assert report["group"] == block and report["local_cp_size"] == 2
        expected = zigzag_split({"tokens": full}, rank % 2, 2)["tokens"]
        numpy.testing.assert_array_equal(report["tokens"], expected.numpy())


def test_the_switch_refuses_what_it_cannot_do_with_the_reason() -> None:
    from megadist.megatron import get_batch

    with pytest.raises(TopologyError, match="model-parallel groups are not initialised"):
        get_batch(iter([]), args=megatron_args())


def test_our_split_is_megatron_s_split_for_megatron_s_code(seed) -> None:
    from megatron.core.datasets.utils import Split as CoreSplit

    from megaindex import Split

    for member in Split:
        assert member == CoreSplit[member.name] and CoreSplit[member.name] == member
        assert {CoreSplit[member.name]: True}.get(member)
        assert member == seed.call("seed_loader:seed_split", member.name)
    assert Split.valid != CoreSplit.test and Split.valid not in (CoreSplit.train, CoreSplit.test)


def loader_settings(rng: random.Random) -> dict:
    micro = rng.choice([1, 2, 3])
    eval_micro = rng.choice([micro, micro + 1])
    return {  # as Megatron-LM's parser accepts them: whole micro-batches per step
        "dataloader_type": rng.choice(["single", "cyclic"]),
        "micro_batch_size": micro,
        "global_batch_size": micro * 4,
        "eval_micro_batch_size": eval_micro,
        "eval_global_batch_size": eval_micro * 4,
        "full_validation": rng.random() < 0.3,
        "hybrid_context_parallel": False,
        "data_sharding": rng.random() < 0.5,
        "num_workers": 0,
        "exit_signal_handler": False,
    }


@pytest.mark.parametrize("case", range(12))
def test_switched_loader_samples_as_the_seed_commit_s_for_every_split(seed, case: int) -> None:
    """Random configurations: the seed's build_pretraining_data_loader (handed a dataset that
    declares our Split) and ours give the same index batches on every data-parallel rank."""
    from megaindex import Split
    from megaload import build_pretraining_data_loader
    from megaload.megatron import data_loader_config

    rng = random.Random(case)
    settings = loader_settings(rng)
    length, split = rng.randint(20, 60), rng.choice(list(Split))
    dp_size = rng.choice([1, 2])
    consumed = rng.choice([0, settings["micro_batch_size"] * dp_size * rng.randint(1, 3)])
    args = types.SimpleNamespace(**settings)
    for dp_rank in range(dp_size):
        reference = seed.call(
            "seed_loader:batches", length, split, consumed, settings, dp_rank, dp_size, 6
        )
        config = data_loader_config(args, data_parallel_rank=dp_rank, data_parallel_size=dp_size)
        assert reference, (case, dp_rank)
        ours = build_pretraining_data_loader(IndexDataset(length, split), consumed, config)
        assert [list(b) for b in itertools.islice(ours.batch_sampler, 6)] == reference, (
            case,
            settings,
            split,
            dp_rank,
        )


class IndexDataset:
    def __init__(self, length: int, split: object) -> None:
        self.length, self.index_split = length, split

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        return index
