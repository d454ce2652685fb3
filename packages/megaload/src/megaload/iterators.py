"""The iterators Megatron-LM wraps around its loaders."""

from __future__ import annotations

from collections import deque
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
    """An iterator that remembers the items read since the last ``advance()`` so a step can be
    replayed.

    ``rewind()`` makes the next ``next()`` calls return those items again, from the first, in
    order, before reading new ones; ``advance()`` forgets them (the step succeeded). Megatron-LM
    uses this to re-run a step for determinism checks. Every item of a step is kept, however
    many micro-batches it reads.
    """

    def __init__(self, iterable: Iterable[Any]) -> None:
        self.iterable = iterable
        self._source = iter(iterable)
        self._saved: list[Any] = []
        self._replay: deque[Any] = deque()

    def __iter__(self) -> RerunDataIterator:
        return self

    def __next__(self) -> Any:
        item = self._replay.popleft() if self._replay else next(self._source)
        self._saved.append(item)
        return item

    def rewind(self) -> None:
        """Replay the items read since the last ``advance()``, from the first."""
        self._replay = deque([*self._saved, *self._replay])
        self._saved.clear()

    def advance(self) -> None:
        """Forget the remembered items."""
        self._saved.clear()
