"""How many samples each split needs, with Megatron-LM's formulas (training.py at the seed
commit, e03878b5f).

train: ``train_samples``, else ``train_iters * global_batch_size``; with phase transitions
(``phase_transition_iterations``), only the samples of the phase that ``iteration`` is in.
valid: every evaluation point of the run, ``train_iters // eval_interval + 1``, less the points
before ``start_eval_at_iter``, times ``eval_iters`` batches of ``eval_global_batch_size``
(default: the global batch size); ``eval_iters`` batches alone with ``skip_train`` (which reads
no ``eval_interval``: 0 or None is fine there); None with ``full_validation`` (one whole epoch
is used instead).
test: ``eval_iters`` batches of the evaluation batch size.

Sample-based runs count their iterations as Megatron-LM's ``update_train_iters`` does: one per
global batch, each batch as large as the step batch-size schedule
(``--step-batch-size-schedule``, the seed commit's batch-size rampup) makes it at the samples
consumed so far.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from megaindex.errors import ConfigError

#: the suffixes a schedule's numbers may carry
_SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


def _schedule_number(text: str, entry: str) -> int:
    text = text.strip()
    scale = _SUFFIXES.get(text[-1:].upper(), 1)
    digits = text[:-1] if scale > 1 else text
    try:
        return int(float(digits) * scale)
    except ValueError:
        raise ConfigError(
            f"step batch-size schedule entry {entry!r}: {text!r} is not a number (with an "
            f"optional K, M, B or T suffix)"
        ) from None


@dataclass(frozen=True)
class StepBatchSizeSchedule:
    """Megatron-LM's ``--step-batch-size-schedule``: ``(threshold, global batch size)`` steps,
    thresholds in samples, ascending from 0."""

    steps: tuple[tuple[int, int], ...]

    @classmethod
    def parse(cls, text: str, seq_length: int | None = None) -> StepBatchSizeSchedule:
        """``"0:256 1B:512 2.5B:1024"``: thresholds in tokens when ``seq_length`` is given
        (divided by it, as Megatron-LM does), else in samples; entries split by spaces or
        commas."""
        steps = []
        for entry in text.replace(",", " ").split():
            threshold, colon, size = entry.partition(":")
            if not colon:
                raise ConfigError(
                    f"step batch-size schedule entry {entry!r}: expected THRESHOLD:BATCH_SIZE"
                )
            start = _schedule_number(threshold, entry)
            if seq_length is not None:
                start //= seq_length
            steps.append((start, _schedule_number(size, entry)))
        steps.sort(key=lambda step: step[0])
        return cls(tuple(steps))

    def __post_init__(self) -> None:
        if not self.steps or self.steps[0][0] != 0:
            raise ConfigError(
                f"a step batch-size schedule starts at threshold 0, found {list(self.steps)}"
            )
        for (before, _), (after, _) in zip(self.steps, self.steps[1:], strict=False):
            if after <= before:
                raise ConfigError(
                    f"step batch-size schedule thresholds must increase, found {before} then "
                    f"{after} (in samples)"
                )
        if any(size <= 0 for _, size in self.steps):
            raise ConfigError(f"step batch sizes must be positive, found {list(self.steps)}")

    def batch_size_at(self, consumed_samples: int) -> int:
        """The global batch size of the step after ``consumed_samples``."""
        size = self.steps[0][1]
        for threshold, step_size in self.steps:
            if consumed_samples < threshold:
                break
            size = step_size
        return size

    def iterations_for(self, train_samples: int) -> int:
        """Steps until ``train_samples`` are consumed (the last one may pass it)."""
        iterations = consumed = 0
        while consumed < train_samples:
            consumed += self.batch_size_at(consumed)
            iterations += 1
        return iterations


def train_iterations(
    global_batch_size: int,
    train_samples: int,
    schedule: StepBatchSizeSchedule | None = None,
) -> int:
    """Megatron-LM's ``update_train_iters`` for a sample-based run."""
    if schedule is not None:
        return schedule.iterations_for(train_samples)
    return train_samples // global_batch_size


def samples_in_phase(
    global_batch_size: int,
    train_samples: int | None,
    phase_transition_iterations: list[int],
    iteration: int,
) -> int:
    """The training samples of the phase that ``iteration`` is in: from the last transition at
    or before it to the next one, or to ``train_samples`` (which phases need)."""
    if train_samples is None:
        raise ConfigError("phase transitions need train_samples (the last phase's end)")
    bounds = [0, *(t * global_batch_size for t in phase_transition_iterations), train_samples]
    now = iteration * global_batch_size
    later = [bound for bound in bounds if bound > now]
    if not later:
        raise ConfigError(
            f"iteration {iteration} ({now} samples) is past the last phase, which ends at "
            f"train_samples {train_samples}"
        )
    return min(later) - max(bound for bound in bounds if bound <= now)


def get_train_valid_test_num_samples(
    global_batch_size: int,
    train_iters: int | None = None,
    train_samples: int | None = None,
    eval_interval: int | None = None,
    eval_iters: int = 0,
    eval_global_batch_size: int | None = None,
    full_validation: bool = False,
    *,
    skip_train: bool = False,
    start_eval_at_iter: int | None = None,
    step_batch_size_schedule: StepBatchSizeSchedule | None = None,
    phase_transition_iterations: list[int] | None = None,
    iteration: int = 0,
) -> tuple[int, int | None, int]:
    """``(train, valid, test)`` sample counts for ``BlendedMegatronDatasetBuilder``."""
    for name, value, least in (
        ("global_batch_size", global_batch_size, 1),
        ("train_iters", train_iters, 0),
        ("train_samples", train_samples, 0),
        ("eval_interval", eval_interval, 0),
        ("eval_iters", eval_iters, 0),
        ("eval_global_batch_size", eval_global_batch_size, 1),
        ("iteration", iteration, 0),
    ):
        if (value is not None or name == "global_batch_size") and not (
            isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= least
        ):
            raise ConfigError(f"{name} must be an integer >= {least}, got {value!r}")
    if train_iters is None:
        if train_samples is None:
            raise ConfigError("give train_iters or train_samples")
        train_iters = train_iterations(global_batch_size, train_samples, step_batch_size_schedule)
    train = train_samples if train_samples else train_iters * global_batch_size
    eval_batch = eval_global_batch_size or global_batch_size
    if full_validation:
        valid = None
    elif skip_train:
        valid = eval_iters * eval_batch
    elif eval_iters and eval_interval:
        points = train_iters // eval_interval + 1
        if start_eval_at_iter is not None:
            points = max(0, points - start_eval_at_iter // eval_interval)
        valid = points * eval_iters * eval_batch
    elif eval_iters:
        raise ConfigError(
            f"eval_iters {eval_iters} needs an eval_interval of at least 1 to count the "
            f"evaluation points of training, found {eval_interval!r}; give one, or skip_train "
            "(evaluation only, which needs none)"
        )
    else:
        valid = 0
    if phase_transition_iterations:
        train = samples_in_phase(
            global_batch_size, train_samples, phase_transition_iterations, iteration
        )
    return train, valid, eval_iters * eval_batch
