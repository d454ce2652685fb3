"""A DataLoader worker that dies (killed by the out-of-memory killer, a crash) is named with
the loader's split, its dataset and where in the samples it was, not only torch's pid."""

from __future__ import annotations

import enum
import os
import signal
import time

import pytest
import torch

from megaload import DataLoaderConfig, WorkerDiedError, build_pretraining_data_loader


class Split(enum.Enum):
    train = 0


class DiesAtSample:
    """Samples are their index; reading ``fatal`` in a worker kills that worker."""

    index_split = Split.train

    def __init__(self, length: int, fatal: int) -> None:
        self.length, self.fatal = length, fatal

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        if index == self.fatal and torch.utils.data.get_worker_info() is not None:
            # after the trainer has taken every batch before it and waits for this one: torch's
            # SIGCHLD handler raises in whatever the trainer runs, which is then the loader
            time.sleep(2.0)
            os.kill(os.getpid(), signal.SIGKILL)
        return index


def test_a_killed_worker_is_named_with_the_split_and_position() -> None:
    config = DataLoaderConfig(micro_batch_size=2, num_workers=1, shared_batches=False)
    loader = build_pretraining_data_loader(DiesAtSample(40, fatal=12), 4, config)
    read = []
    with pytest.raises(WorkerDiedError) as error:
        read.extend(batch.tolist() for batch in loader)
    message = str(error.value)
    assert "a DataLoader worker of the train split's loader (over DiesAtSample, 1 workers)" in (
        message
    )
    assert "DataLoader worker (pid" in message and "out-of-memory killer" in message
    assert isinstance(error.value, RuntimeError)
    # batches before the fatal sample come through (torch may drop those the dead worker had
    # queued), and the position named is after the last one handed out
    assert read == [[i, i + 1] for i in range(4, 4 + 2 * len(read), 2)] and len(read) <= 4
    assert loader.consumed_samples == 4 + 2 * len(read)
    assert f"from consumed_samples {loader.consumed_samples} on" in message
    # the loader is usable again: a new pass starts new workers where the last batch ended
    loader.dataset.fatal = None
    rest = [batch.tolist() for batch in loader]
    assert read + rest == [[i, i + 1] for i in range(4, 40, 2)]
