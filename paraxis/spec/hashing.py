"""A frozen dataclass hashed once per instance: a layout search hashes the model and the
precision in every cached price it asks for (some 10^5 times a search), each hash a tuple of
every field. The class sets `__hash__ = hash_once` and `__getstate__ = state_unhashed` in its
body (a dataclass keeps a `__hash__` its own body defines). Equality stays the dataclass's."""

from __future__ import annotations

import dataclasses
from typing import Any

_CACHED = "_hash"


def hash_once(self: Any) -> int:
    """The hash of the fields, as the dataclass's own, computed on first use."""
    cached = self.__dict__.get(_CACHED)
    if cached is None:
        cached = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
        object.__setattr__(self, _CACHED, cached)  # frozen: past __setattr__
    return cached


def state_unhashed(self: Any) -> dict[str, Any]:
    """The fields to pickle, without the cached hash: a string's hash differs in another
    process (PYTHONHASHSEED)."""
    return {k: v for k, v in self.__dict__.items() if k != _CACHED}
