"""The rank spawner every multi-rank run uses: real gloo groups, failures and hangs reported."""

import os
import time

import pytest
import torch

from megadist.spawn import run_distributed


def _sum_of_ranks(offset):
    value = torch.tensor([torch.distributed.get_rank() + offset])
    torch.distributed.all_reduce(value)
    return int(value)


def _fail_on_rank_one():
    if torch.distributed.get_rank() == 1:
        raise ValueError("rank one broke")
    return "fine"


def _rank_one_never_returns():
    if torch.distributed.get_rank() == 1:
        time.sleep(600)


@pytest.mark.distributed
def test_ranks_share_one_group():
    assert run_distributed(_sum_of_ranks, 3, 10) == [33, 33, 33]


def _probed_environment():
    return os.environ.get("MEGADIST_SPAWN_PROBE")


@pytest.mark.distributed
def test_ranks_see_the_callers_environment_as_it_is_at_each_call(monkeypatch):
    # the first call starts the fork server; the variable set after it reaches the second's ranks
    monkeypatch.setenv("MEGADIST_SPAWN_PROBE", "first")
    assert run_distributed(_probed_environment, 2) == ["first", "first"]
    monkeypatch.setenv("MEGADIST_SPAWN_PROBE", "second")
    assert run_distributed(_probed_environment, 2) == ["second", "second"]
    monkeypatch.delenv("MEGADIST_SPAWN_PROBE")
    assert run_distributed(_probed_environment, 2) == [None, None]


@pytest.mark.distributed
def test_a_failing_rank_is_reported_with_its_traceback():
    with pytest.raises(RuntimeError, match=r"(?s)rank 1:\n.*ValueError: rank one broke"):
        run_distributed(_fail_on_rank_one, 2)


@pytest.mark.distributed
def test_a_hanging_rank_is_named_and_killed():
    # rank 1 sleeps 600 s: returning at all shows it was killed. The bound leaves rank 0
    # half a minute to be forked from the fork server (torch already imported there) on a
    # loaded machine.
    with pytest.raises(TimeoutError, match=r"ranks \[1\] of 2 did not finish within 30"):
        run_distributed(_rank_one_never_returns, 2, timeout=30)


_IN_FLIGHT = []


def _rank_zero_leaves_a_send_in_flight():
    """Rank 0 returns before its large message has been received; rank 1 reads it late."""
    payload = torch.arange(16 * 1024 * 1024, dtype=torch.int32)
    if torch.distributed.get_rank() == 0:
        _IN_FLIGHT.append(torch.distributed.isend(payload, dst=1))
        return "sent"
    time.sleep(2)
    received = torch.empty_like(payload)
    torch.distributed.recv(received, src=0)
    return bool(torch.equal(received, payload))


@pytest.mark.distributed
def test_a_rank_that_returns_first_keeps_its_connections_until_all_are_done():
    assert run_distributed(_rank_zero_leaves_a_send_in_flight, 2) == ["sent", True]
