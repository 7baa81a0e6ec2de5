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


def changed_components(previous: list[str], names: list[str], num_workers: int) -> str:
    """Why a pipeline worker of ``num_workers`` whose code builds ``names`` must not start
    any query when the slot's previous worker declared ``previous`` (its code's
    components), or "" when it may.

    The shares of all workers follow from the sorted names: when they change (a component
    added, removed or renamed), a component may move from one worker to another, and the
    other worker may still run it on the old code (a rolling switch, or a supervisor that
    has not stopped its old worker yet): two queries on one checkpoint. One worker runs
    everything and a slot runs one process at a time, so a single worker is never
    refused; nor is a worker whose slot's previous components are unknown (``[]``)."""
    before, after = sorted(set(previous)), sorted(set(names))
    if num_workers <= 1 or not before or before == after:
        return ""
    return (f"the new code's components {after} differ from the running code's {before}: "
            f"with {num_workers} workers a component would move to another worker while "
            "the old one still runs it; rebalance to 1 worker first, or deactivate, "
            "upgrade, then activate")
