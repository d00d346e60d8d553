"""The worker's queue: strict priority classes, round-robin between owners (connections)
inside a class, FIFO per owner, so a client's one request waits behind at most one of
another's. Thread-safe: the event loop puts, the inference thread gets."""

from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Generic, TypeVar

T = TypeVar("T")


class FairQueue(Generic[T]):
    """``put(priority, owner, item)``, lower priority first; ``get()``
    blocks until an item or :meth:`close` (then returns ``None``)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        # priority → owner → that owner's items (dict order is the round-robin order)
        self._classes: dict[int, dict[int, collections.deque[T]]] = {}
        self._closed = False

    def put(self, priority: int, owner: int, item: T) -> None:
        with self._cond:
            owners = self._classes.setdefault(priority, {})
            owners.setdefault(owner, collections.deque()).append(item)
            self._cond.notify()

    def close(self) -> None:
        """Wake the getter; every later :meth:`get` returns ``None``."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def get(self, block: bool = True, timeout: float | None = None) -> T | None:
        """The next item, or ``None`` once closed. Raises ``queue.Empty`` when there is none and
        ``block`` is false or ``timeout`` seconds passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    return None
                for priority in sorted(self._classes):
                    owners = self._classes[priority]
                    owner, items = next(iter(owners.items()))
                    item = items.popleft()
                    del owners[owner]              # to the back of the round
                    if items:
                        owners[owner] = items
                    if not owners:
                        del self._classes[priority]
                    return item
                left = None if deadline is None else deadline - time.monotonic()
                if not block or (left is not None and left <= 0):
                    raise queue.Empty
                self._cond.wait(left)

    def __len__(self) -> int:
        with self._cond:
            return sum(len(q) for owners in self._classes.values() for q in owners.values())
