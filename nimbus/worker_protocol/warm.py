"""A warm worker's files and words: what its supervisor writes and the worker reads.

A supervisor starts a warm worker (``python -m nimbus.worker --warm <warm-dir>``;
nimbus/supervisor/warm_pool.py) with a :class:`~nimbus.worker_protocol.spec.WorkerSpec`
in ``<warm-dir>/warm.json`` (:data:`WARM_FILE`): the cluster's default worker
configuration, no topology's. When a slot takes it, the supervisor writes that slot's
``worker.json`` and then the line ``take <worker-dir>`` (:data:`TAKE`) on the lease pipe,
the one line the warm worker waits for (nimbus/worker/warm.py).
"""

from __future__ import annotations

#: The warm worker's spec, in its warm directory.
WARM_FILE = "warm.json"
#: The lease pipe's line that hands a warm worker its slot: ``take <worker-dir>``.
TAKE = "take"
