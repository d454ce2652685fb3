"""The iterators Megatron-LM wraps around its loaders."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any


def cyclic_iter(iterable: Iterable[Any]) -> Iterator[Any]:
    """Iterate ``iterable`` again and again (Megatron-LM's ``cyclic_iter`` for cyclic loaders)."""
    while True:
        yield from iterable


class RerunDataIterator:
    """An iterator that remembers its last items so a step can be replayed.

    ``rewind()`` makes the next ``next()`` calls return the remembered items again, in order,
    before reading new ones; ``advance()`` forgets them (the step succeeded). Megatron-LM uses
    this to re-run a step for determinism checks.
    """

    def __init__(self, iterable: Iterable[Any], capacity: int = 64) -> None:
        self.iterable = iterable
        self._source = iter(iterable)
        self._saved: deque[Any] = deque(maxlen=capacity)
        self._replay: deque[Any] = deque()

    def __iter__(self) -> RerunDataIterator:
        return self

    def __next__(self) -> Any:
        item = self._replay.popleft() if self._replay else next(self._source)
        self._saved.append(item)
        return item

    def rewind(self) -> None:
        """Replay the items read since the last ``advance()``."""
        self._replay = deque([*self._saved, *self._replay])
        self._saved.clear()

    def advance(self) -> None:
        """Forget the remembered items."""
        self._saved.clear()
