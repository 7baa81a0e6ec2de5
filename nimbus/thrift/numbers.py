"""Numbers as Thrift carries them."""

from __future__ import annotations


def i32(value: float) -> int:
    """``value`` as a Thrift i32, clamped: numbers read from ZooKeeper (uptimes, ports)
    can be anything, and one out of range must not make the whole reply unwritable."""
    return max(-2147483648, min(2147483647, int(value)))
