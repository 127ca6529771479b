"""An in-process publish/subscribe broker with MQTT topic matching, delivering in rounds.

Messages published while round t is delivered are delivered in round t + 1, so one round
is one hop: the virtual clock of the simulated mesh. Subscriptions are kept in a topic
trie, so a publish costs a walk down its topic's levels, not a scan of every filter.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# (topic, payload, round): payloads are wire bytes, or whatever in-process agents publish.
Handler = Callable[[str, Any, float], None]


@dataclass
class _Level:
    children: dict[str, _Level] = field(default_factory=dict)
    handlers: list[Handler] = field(default_factory=list)  # filters ending here
    rest: list[Handler] = field(default_factory=list)  # filters ending here with '#'


class VirtualBroker:
    """Topic-matching broker; `deliver_round` delivers what was published before it."""

    def __init__(self) -> None:
        self._root = _Level()
        self._pending: list[tuple[str, Any]] = []
        self._delayed: list[tuple[int, str, Any]] = []  # (due round, topic, payload)
        self.shuffle: random.Random | None = None  # set: deliver each round in random order
        self.round = 0
        self.published = 0
        self.undeliverable = 0
        self._matches: dict[str, list[Handler]] = {}  # a mesh reuses the same topics

    def subscribe(self, topic_filter: str, handler: Handler) -> None:
        parts = topic_filter.split("/")
        if "#" in parts[:-1] or any("#" in p and p != "#" for p in parts) or any(
                "+" in p and p != "+" for p in parts):
            raise ValueError(f"invalid topic filter {topic_filter!r}")
        self._matches.clear()
        level = self._root
        for part in parts:
            if part == "#":
                level.rest.append(handler)
                return
            level = level.children.setdefault(part, _Level())
        level.handlers.append(handler)

    def publish(self, topic: str, payload: Any, delay: int = 0) -> None:
        """Queue a message for the next round, or `delay` rounds later."""
        if "+" in topic or "#" in topic:
            raise ValueError(f"cannot publish to a wildcard topic {topic!r}")
        if delay > 0:
            self._delayed.append((self.round + 1 + delay, topic, payload))
        else:
            self._pending.append((topic, payload))
        self.published += 1

    def match(self, topic: str) -> list[Handler]:
        """Handlers of every filter matching `topic`."""
        cached = self._matches.get(topic)
        if cached is None:
            cached = self._matches[topic] = self._walk(topic)
        return cached

    def _walk(self, topic: str) -> list[Handler]:
        found: list[Handler] = []
        levels = [self._root]
        for part in topic.split("/"):
            nxt = []
            for level in levels:
                found.extend(level.rest)
                for key in (part, "+"):
                    child = level.children.get(key)
                    if child is not None:
                        nxt.append(child)
            levels = nxt
        for level in levels:
            found.extend(level.handlers)
            found.extend(level.rest)
        return found

    @property
    def idle(self) -> bool:
        return not self._pending and not self._delayed

    def deliver_round(self) -> int:
        """Deliver everything due this round; returns how many messages went out."""
        batch, self._pending = self._pending, []
        self.round += 1
        if self._delayed:
            due = [(t, p) for r, t, p in self._delayed if r <= self.round]
            self._delayed = [d for d in self._delayed if d[0] > self.round]
            batch.extend(due)
        if self.shuffle is not None:
            self.shuffle.shuffle(batch)
        matches, now = self._matches, float(self.round)
        for topic, payload in batch:
            handlers = matches.get(topic) or self.match(topic)
            if not handlers:
                self.undeliverable += 1
            for handler in handlers:
                handler(topic, payload, now)
        return len(batch)
