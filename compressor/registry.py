"""One shape for the registries filled by explicit registration (formats, model kinds, decoder
families): entries by name, in registration order, each name once."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """`what` names the entries in the programming error a second registration raises."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise RuntimeError(f"{self.what} {name!r} registered twice")   # a programming error
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> None:
        """Forget `name` (tests that register a toy entry)."""
        self._entries.pop(name, None)

    def get(self, name: str) -> T | None:
        return self._entries.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[T]:
        return iter(tuple(self._entries.values()))

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)
