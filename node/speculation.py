"""Results computed before their message arrived (Actor.speculate), held until its delivery's
work takes them. A host's worker fills its idle time this way; the store bounds what that costs
in memory, and makes room by dropping results of rounds older than the newest it holds (their
messages may never come: the device went away, or the round closed first)."""
from __future__ import annotations

from typing import Any, Hashable

DEFAULT_CAPACITY = 16  # about 100 MB of results for a 1.66 M-parameter model


class SpeculativeResults:
    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        if capacity < 1:
            raise ValueError(f"a store of speculative results needs room for at least one (capacity {capacity})")
        self.capacity = capacity
        self._held: dict[Hashable, tuple[int, Any]] = {}
        self.taken = 0
        self.dropped = 0

    def stats(self) -> dict[str, int]:
        return {"used": self.taken, "dropped": self.dropped}

    def __len__(self) -> int:
        return len(self._held)

    def has_room(self, round_: int) -> bool:
        """Whether a result of round `round_` fits, after dropping those of rounds older than the
        newest (held or asked for)."""
        if len(self._held) < self.capacity:
            return True
        newest = max(round_, max(r for r, _ in self._held.values()))
        stale = [key for key, (r, _) in self._held.items() if r < newest]
        for key in stale:
            del self._held[key]
        self.dropped += len(stale)
        return len(self._held) < self.capacity

    def put(self, key: Hashable, round_: int, value: Any) -> None:
        self._held[key] = (round_, value)

    def take(self, key: Hashable) -> Any | None:
        """The result prepared under `key`, removed from the store; None if there is none."""
        held = self._held.pop(key, None)
        if held is None:
            return None
        self.taken += 1
        return held[1]
