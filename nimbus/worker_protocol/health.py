"""What a process topology's worker says of its ``health:`` check in each beat.

``{"beat": {..., "health": <word>}}`` (nimbus/worker/process.py): :data:`NONE` when its
``topology.yaml`` declares no check, :data:`PENDING` until the check first finds the
command healthy, :data:`PASSED` from then on (nimbus/worker/health.py). Its supervisor
counts a worker of a new code version as up from its first beat saying :data:`NONE` or
:data:`PASSED` (nimbus/supervisor/status_input.py); a pipeline's worker says none of
them.
"""

NONE, PENDING, PASSED = "none", "pending", "passed"
WORDS = (NONE, PENDING, PASSED)
