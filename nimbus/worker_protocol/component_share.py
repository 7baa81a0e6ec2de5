"""A pipeline worker's share of its topology's components.

A pipeline topology's ``build()`` names its components; ``worker-<i>`` of
``topology.workers`` runs those whose index in sorted name order is ``i`` modulo the
number of workers (nimbus/worker/pipeline.py). Its supervisor computes the same share to
decide whether a rebalance that moves a worker to another index or count changes what it
runs, or whether it may run on (nimbus/supervisor/ending.py).
"""

from __future__ import annotations


def assigned(names: list[str], worker_index: int, num_workers: int) -> list[str]:
    """The components ``worker-<worker_index>`` of ``num_workers`` runs: index in sorted
    order ``i mod N == worker_index``."""
    return [name for i, name in enumerate(sorted(names)) if i % num_workers == worker_index]
