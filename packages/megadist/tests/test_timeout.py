"""A stalled peer on a real gloo group: build_parallel_groups' groups take a timeout, and a rank
waiting for a source that never sends ends within it in a CollectiveError naming the group, the
rank that waited and the rank it waited for."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from megadist import (
    DEFAULT_TIMEOUT,
    CollectiveError,
    TopologyError,
    build_parallel_groups,
    get_batch,
)
from megadist.layout import job_timeout
from megadist.spawn import run_distributed

pytestmark = pytest.mark.distributed

TIMEOUT = 2.0


def wait_for_a_silent_source() -> tuple[str, float] | None:
    """Rank 0, the TP source, never calls get_batch; rank 1 waits for it."""
    layout = build_parallel_groups(tp=2, timeout=TIMEOUT)
    if dist.get_rank() == 0:
        return None
    topology = layout.topology(2, 16)
    start = time.perf_counter()
    try:
        get_batch(None, topology)
    except CollectiveError as error:
        return str(error), time.perf_counter() - start
    return "no error", time.perf_counter() - start


def test_a_stalled_source_ends_in_a_clear_error_within_the_group_timeout() -> None:
    _, (message, seconds) = run_distributed(wait_for_a_silent_source, 2)
    assert message.startswith(
        "an all-reduce in the TP group of global ranks [0, 1] failed on global rank 1, waiting "
        "for global rank 0 (stalled past the group's timeout, or gone): "
    ), message
    assert TIMEOUT * 0.9 < seconds < TIMEOUT + 10


def layout_timeouts() -> list[timedelta]:
    return [build_parallel_groups(tp=2).timeout, build_parallel_groups(tp=2, timeout=90).timeout]


def test_the_default_timeout_is_the_job_s_and_seconds_are_accepted() -> None:
    assert timedelta(minutes=10) == DEFAULT_TIMEOUT  # --distributed-timeout-minutes, seed commit
    # the job's: what init_process_group was given (run_distributed's group_timeout), not
    # torch's 30 minute default for a new gloo group
    ranks = run_distributed(layout_timeouts, 2, group_timeout=123.0)
    assert ranks[0] == [timedelta(seconds=123), timedelta(seconds=90)]


def test_a_timeout_must_be_positive() -> None:
    with pytest.raises(TopologyError, match="a group timeout must be positive, found 0:00:00"):
        build_parallel_groups(tp=1, timeout=0)


def test_without_torch_s_backend_options_the_job_timeout_falls_back_to_megatron_s(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # a torch release (or backend) whose world group has no readable backend options
    monkeypatch.setattr(dist, "group", SimpleNamespace(WORLD=object()))
    with caplog.at_level(logging.WARNING, logger="megadist.layout"):
        assert job_timeout() == timedelta(minutes=10)
    assert "cannot read the job's process-group timeout from torch" in caplog.text
    assert "pass build_parallel_groups(timeout=...) to choose" in caplog.text
