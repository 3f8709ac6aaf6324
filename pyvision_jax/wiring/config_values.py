"""Config values checked and converted where a config becomes objects: tuples of integers
or strings, with an error naming the field."""

from __future__ import annotations

from collections.abc import Sequence


def int_tuple(value: Sequence[int], field: str) -> tuple[int, ...]:
    """A config list of integers (a tuple in the config file) as a tuple, with a clear error."""
    if isinstance(value, str) or not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        raise ValueError(f"{field} must be a tuple of integers, got {value!r}")
    return tuple(value)


def str_tuple(value: Sequence[str], field: str) -> tuple[str, ...]:
    """A config list of strings as a tuple, with a clear error."""
    if isinstance(value, str) or not all(isinstance(x, str) for x in value):
        raise ValueError(f"{field} must be a tuple of strings, got {value!r}")
    return tuple(value)
