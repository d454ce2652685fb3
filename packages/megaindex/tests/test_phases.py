"""PhaseSchedule: the phases' sample counts as each phase's launch asks them."""

from __future__ import annotations

import pytest

from megaindex import ConfigError
from megaindex.phases import Phase, PhaseSchedule


def test_each_phase_holds_the_samples_of_its_iterations() -> None:
    schedule = PhaseSchedule((Phase(0), Phase(4), Phase(9)))
    assert schedule.transitions == [4, 9]
    # 8 samples per iteration; 96 samples end the last phase at iteration 12
    assert schedule.train_samples(8, 96) == [32, 40, 24]
    assert [schedule.phase_at(i) for i in (0, 3, 4, 8, 9, 11)] == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("starts", [[1], [0, 4, 4], [0, 5, 2], []])
def test_a_schedule_starts_at_zero_and_increases(starts: list[int]) -> None:
    with pytest.raises(ConfigError, match="phases start at iteration 0"):
        PhaseSchedule(tuple(Phase(start) for start in starts))


@pytest.mark.parametrize("start", [2.5, 2.0, True, "2"])
def test_a_schedule_starts_at_whole_iterations(start: object) -> None:
    with pytest.raises(ConfigError, match="phases start at whole iterations"):
        PhaseSchedule((Phase(0), Phase(start)))


def test_a_schedule_reads_from_the_phases_flag() -> None:
    schedule = PhaseSchedule.parse(["0:0.3 web 0.7 code", "40:code"])
    assert schedule.phases == (
        Phase(0, blend=(["web", "code"], [0.3, 0.7])),
        Phase(40, blend=(["code"], None)),
    )
    with pytest.raises(ConfigError, match="--phases item 'x:web': expected START:DATA_PATH"):
        PhaseSchedule.parse(["x:web"])
    with pytest.raises(ConfigError, match=r"--phases item '0:nan web': the weight of 'web' is nan"):
        PhaseSchedule.parse(["0:nan web"])
