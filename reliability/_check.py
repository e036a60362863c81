"""One expectation of the reliability suite: what was tried, what should come back, what did."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Check"]


@dataclass
class Check:
    what: str
    expected: str
    got: str

    @property
    def ok(self) -> bool:
        return self.expected == self.got
