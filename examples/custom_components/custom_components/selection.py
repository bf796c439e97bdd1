"""A selection policy: round robin over the clients in name order, k at a time, so that every
client takes part equally often (no randomness at all)."""
from pydantic import Field

from node.selection import SelectionContext, Selector, SelectorOptions


class RoundRobin(Selector):
    STATE = ("next_index",)  # where the rotation stands: saved with a checkpoint

    class Options(SelectorOptions):
        start: int = Field(0, ge=0, description="the position (in name order) the first round starts at")

    def __init__(self, options=None):
        super().__init__(options)
        self.next_index = self.options.start

    def select(self, pool, k, context: SelectionContext) -> list[str]:
        names = sorted(pool)
        if k >= len(names):
            return names
        chosen = [names[(self.next_index + i) % len(names)] for i in range(k)]
        self.next_index = (self.next_index + k) % len(names)
        return sorted(chosen)
