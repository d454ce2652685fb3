"""The iterators Megatron-LM wraps around its loaders."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from megaload.errors import NoDataError


def cyclic_iter(iterable: Iterable[Any]) -> Iterator[Any]:
    """Iterate ``iterable`` again and again (Megatron-LM's ``cyclic_iter`` for cyclic loaders).
    A pass that yields nothing raises :class:`~megaload.errors.NoDataError`: the next would
    yield nothing either, and the caller would wait forever."""
    while True:
        empty = True
        for item in iterable:
            empty = False
            yield item
        if empty:
            raise NoDataError(
                f"cyclic_iter: a pass over {type(iterable).__name__} yielded nothing: the "
                "dataset is empty or fully consumed (for validation, check eval_iters and the "
                "validation split)"
            )


class RerunDataIterator:
    """An iterator that remembers the items of a step so the step can be replayed.

    ``rewind()`` makes the next ``next()`` calls return the items read since the last
    ``advance()`` again, from the first, in order, before reading new ones; ``advance()``
    forgets them (the step succeeded). Every item of a step is kept, however many
    micro-batches it reads. Megatron-LM uses this to re-run a step for determinism checks, and
    keeps items only while its rerun state machine is on: ``saving=False`` (or setting
    ``saving`` later) keeps none, so a run that never calls ``advance()`` does not hold every
    batch. ``state_dict()``/``load_state_dict()`` carry what Megatron-LM checkpoints.
    """

    def __init__(self, iterable: Iterable[Any], saving: bool = True) -> None:
        self.iterable = iterable
        self.saving = saving
        self._source = iter(iterable)
        self._saved: list[Any] = []
        self._replay_position: int | None = None  # where a replay stands in _saved

    def __iter__(self) -> RerunDataIterator:
        return self

    def __next__(self) -> Any:
        position = self._replay_position
        if position is not None and position < len(self._saved):
            self._replay_position = position + 1
            return self._saved[position]
        item = next(self._source)
        if self.saving:
            self._saved.append(item)
            if position is not None:
                self._replay_position = position + 1
        return item

    def rewind(self) -> None:
        """Replay the items read since the last ``advance()``, from the first."""
        self._replay_position = 0

    def advance(self) -> None:
        """Forget the remembered items."""
        self._saved = []
        self._replay_position = None

    def state_dict(self) -> dict[str, Any]:
        """The remembered items and where a replay stands (Megatron-LM's keys)."""
        return {
            "saved_microbatches": self._saved,
            "replaying": self._replay_position is not None,
            "replay_pos": self._replay_position or 0,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict()``'s result."""
        self._saved = list(state["saved_microbatches"])
        self._replay_position = int(state["replay_pos"]) if state["replaying"] else None
