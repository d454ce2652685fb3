"""megadist's zigzag split against megatron-core 0.16.1's get_batch_on_this_cp_rank."""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from megadist import zigzag_split

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.utils import get_batch_on_this_cp_rank

pytestmark = pytest.mark.compat


class CPGroup:
    """What megatron-core asks of a CP group: its size and this rank's place in it."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


@pytest.fixture(scope="module")
def one_rank_world() -> Iterator[None]:
    """megatron-core reads the group only once torch.distributed is initialised."""
    with tempfile.TemporaryDirectory() as directory:
        dist.init_process_group(
            "gloo", init_method=f"file://{os.path.join(directory, 'rdv')}", rank=0, world_size=1
        )
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


def batch(micro_batch_size: int, seq: int, generator: torch.Generator) -> dict:
    shape = (micro_batch_size, seq)
    return {
        "tokens": torch.randint(0, 1000, shape, generator=generator),
        "labels": torch.randint(0, 1000, shape, generator=generator),
        "loss_mask": torch.rand(shape, generator=generator),
        "position_ids": torch.randint(0, seq, shape, generator=generator),
        "attention_mask": torch.rand((micro_batch_size, 1, seq, seq), generator=generator) > 0.5,
    }


@pytest.mark.parametrize(("cp_size", "seq"), [(2, 8), (2, 64), (4, 32), (8, 64)])
def test_zigzag_split_equals_megatron_core_on_every_cp_rank(
    one_rank_world: None, cp_size: int, seq: int
) -> None:
    generator = torch.Generator().manual_seed(cp_size * seq)
    full = batch(3, seq, generator)
    for cp_rank in range(cp_size):
        ours = zigzag_split(full, cp_rank, cp_size)
        theirs = get_batch_on_this_cp_rank(dict(full), cp_group=CPGroup(cp_rank, cp_size))
        assert ours.keys() == theirs.keys()
        for key in full:
            assert ours[key].dtype == theirs[key].dtype
            assert torch.equal(ours[key], theirs[key]), (cp_rank, key)
