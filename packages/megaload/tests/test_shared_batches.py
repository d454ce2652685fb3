"""Batches from workers through shared slots: equal to torch's way, slots reused safely,
nothing left in /dev/shm, and torch's way for what does not fit."""

import os
import subprocess
import sys

import pytest
import torch

from megaload import DataLoaderConfig, build_pretraining_data_loader
from megaload.shared_batches import (
    SHM_DIR,
    Collate,
    SlotBatch,
    SlotReader,
    SlotWriter,
    reader_name,
    slot_file_prefix,
)

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason="no /dev/shm")


CAUSAL = torch.ones(64, 64, dtype=torch.bool).triu_(1).unsqueeze(0)


class Batches(torch.utils.data.Dataset):
    """Already collated batches (``__getitems__``) whose every value tells its indices."""

    def __len__(self):
        return 400

    def __getitem__(self, idx):
        raise AssertionError("batches are read with __getitems__")

    def __getitems__(self, indices):
        ids = torch.tensor(indices)
        return {
            "tokens": ids[:, None] * 1000 + torch.arange(64),
            "loss_mask": (ids[:, None] % 3 == 0).float().expand(-1, 64).contiguous(),
            "dataset_id": None,
            "first": int(indices[0]),
            "flags": ids % 2 == 0,
            "attention_mask": CAUSAL.expand(len(indices), 1, 64, 64),  # torch's way, beside
        }


def shm_files():
    return {name for name in os.listdir(SHM_DIR) if name.startswith("megaload-")}


def test_a_batch_round_trips_through_a_slot_as_a_copy():
    batch = Batches().__getitems__([4, 5, 6])
    writer = SlotWriter(slots=2)
    item = writer.write(batch)
    assert isinstance(item, SlotBatch) and item.path.startswith(SHM_DIR)
    reader = SlotReader(pin_memory=False)
    copy = reader.read(item)
    assert list(copy) == list(batch)  # the keys in their order
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            assert copy[key].dtype == value.dtype and torch.equal(copy[key], value)
        else:
            assert copy[key] == value
    assert not os.path.exists(item.path)  # removed once mapped on both sides
    writer.write(Batches().__getitems__([7, 8, 9]))  # the other slot
    writer.write(Batches().__getitems__([1, 2, 3]))  # this batch's slot again
    assert torch.equal(copy["tokens"], batch["tokens"])  # the copy does not change
    reader.close()


def test_tensors_that_are_not_contiguous_travel_beside_the_slot():
    causal = torch.ones(8, 8, dtype=torch.bool).triu_(1).unsqueeze(0)
    batch = {"attention_mask": causal.expand(3, 1, 8, 8), "tokens": torch.arange(6).view(3, 2)}
    writer = SlotWriter(slots=2)  # its file goes with it
    item = writer.write(batch)
    assert item.nbytes == 64 and list(item.tensors) == ["tokens"]  # 48 bytes, aligned
    assert item.others["attention_mask"] is batch["attention_mask"]  # pickled by torch
    copy = SlotReader(pin_memory=False).read(item)
    assert list(copy) == ["attention_mask", "tokens"]
    assert torch.equal(copy["tokens"], batch["tokens"])


def test_without_room_in_shared_memory_batches_go_torchs_way(monkeypatch, tmp_path):
    from megaload import shared_batches

    before = shm_files()
    batch = {"tokens": torch.zeros(4)}
    large = {"tokens": torch.zeros(100)}
    assert SlotWriter(slots=2, max_slot_bytes=64).write(large) is large
    empty = {"tokens": torch.zeros(0)}
    assert SlotWriter(slots=2).write(empty) is empty
    monkeypatch.setattr(shared_batches, "SHM_DIR", str(tmp_path / "missing"))
    writer = SlotWriter(slots=2)
    assert writer.write(batch) is batch and writer.write(batch) is batch
    assert shm_files() == before


def test_what_does_not_fit_a_slot_passes_unchanged():
    writer = SlotWriter(slots=2)
    listed = [torch.zeros(3)]
    assert writer.write(listed) is listed  # not a mapping
    transposed = {"mask": torch.ones(4, 3).t()}
    assert writer.write(transposed) is transposed  # no contiguous tensor: nothing to write
    writer.write({"tokens": torch.zeros(4)})  # sizes the slots for 32 bytes
    larger = {"tokens": torch.zeros(100)}
    assert writer.write(larger) is larger
    assert SlotReader(pin_memory=False).read(larger) is larger
    collate = Collate(slots=2)
    assert collate([{"a": torch.tensor(1)}, {"a": torch.tensor(2)}])["a"].tolist() == [1, 2]


@pytest.mark.parametrize("persistent,pin", [(True, False), (False, True)])
def test_a_loader_with_workers_gives_torchs_batches(persistent, pin):
    before = shm_files()
    loaders = {
        shared: build_pretraining_data_loader(
            Batches(),
            0,
            DataLoaderConfig(
                micro_batch_size=4,
                num_workers=2,
                shared_batches=shared,
                persistent_workers=persistent,
                pin_memory=pin,  # pinned where CUDA is, as torch does; ignored here otherwise
            ),
        )
        for shared in (True, False)
    }
    for _ in range(2):  # two passes: persistent workers keep their slots, new ones make theirs
        ours, torchs = (list(loaders[shared]) for shared in (True, False))
        assert len(ours) == len(torchs) == 100  # 25 batches of each worker: slots reused often
        for mine, theirs in zip(ours, torchs, strict=True):
            assert list(mine) == list(theirs)
            assert torch.equal(mine["tokens"], theirs["tokens"])
            assert torch.equal(mine["loss_mask"], theirs["loss_mask"])
            assert torch.equal(mine["flags"], theirs["flags"])
            assert torch.equal(mine["attention_mask"], theirs["attention_mask"])
            assert mine["first"] == theirs["first"] and mine["dataset_id"] is None
            assert mine["tokens"].is_pinned() == theirs["tokens"].is_pinned()
        # persistent workers' slots stay mapped for the next pass; others' go with their pass
        assert len(loaders[True].slots.maps) == (2 if persistent else 0)
        assert not loaders[False].slots.maps
        loaders[True].consumed_samples = loaders[False].consumed_samples = 0
    del loaders
    assert shm_files() == before


def test_a_pass_started_while_another_is_under_way_leaves_it_working():
    config = DataLoaderConfig(micro_batch_size=4, num_workers=2, persistent_workers=False)
    loader = build_pretraining_data_loader(Batches(), 0, config)
    first = iter(loader)
    heads = [next(first)["first"] for _ in range(3)]
    loader.consumed_samples = 0
    assert [batch["first"] for batch in loader] == list(range(0, 400, 4))
    heads.append(next(first)["first"])
    assert heads == [0, 4, 8, 12]


EXITS_WITH_A_BATCH_UNREAD = """
import os, sys, time
sys.path.insert(0, {tests!r})
from test_shared_batches import Batches
from megaload import DataLoaderConfig, build_pretraining_data_loader
from megaload.shared_batches import SHM_DIR, reader_name, slot_file_prefix

config = DataLoaderConfig(micro_batch_size=4, num_workers=2, persistent_workers={persistent})
batches = iter(build_pretraining_data_loader(Batches(), 0, config))
next(batches)  # worker 0's; worker 1 makes its first batch into a file never mapped
deadline = time.monotonic() + 60
prefix = slot_file_prefix(reader_name())
while time.monotonic() < deadline:
    mine = [name for name in os.listdir(SHM_DIR) if name.startswith(prefix)]
    if mine:
        break
    time.sleep(0.05)
print(len(mine))
"""  # and it ends with its loader's workers running: multiprocessing terminates them


@pytest.mark.parametrize("persistent", [True, False])
def test_slot_files_of_batches_never_read_are_removed_when_the_trainer_exits(persistent):
    script = EXITS_WITH_A_BATCH_UNREAD.format(
        tests=os.path.dirname(__file__), persistent=persistent
    )
    trainer = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, err = trainer.communicate(timeout=300)
    assert trainer.returncode == 0, err
    assert out.split() == ["1"]  # a worker's file was left unmapped while it ran
    # the trainer's pid: the files it was to read are named for it
    assert [name for name in shm_files() if name.startswith(f"megaload-{trainer.pid}-")] == []


def test_the_exit_removes_only_this_process_s_files_not_those_of_its_pid_elsewhere():
    from megaload.shared_batches import _remove_left_for

    mine = os.path.join(SHM_DIR, f"{slot_file_prefix(reader_name())}1-left")
    # the same pid in another pid namespace sharing /dev/shm (a container given the host's IPC)
    namesake = os.path.join(SHM_DIR, f"megaload-{os.getpid()}-{'0' * 16}-1-in-use")
    for path in (mine, namesake):
        open(path, "wb").close()
    try:
        _remove_left_for(os.getpid(), reader_name())
        assert not os.path.exists(mine) and os.path.exists(namesake)
    finally:
        for path in (mine, namesake):
            if os.path.exists(path):
                os.unlink(path)
