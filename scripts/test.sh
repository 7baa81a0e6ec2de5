#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: lint, then the unit tests and plugin
# conformance suites (in NIMBUS_TEST_WORKERS parallel processes, default 2: they mostly
# wait on real servers), then the multi-process integration tests one at a time (their
# bounds are ratios to timeouts, and two clusters on a small machine would skew them).
# Pass -m "not slow" for the quick subset. Both parts always run; the exit status is
# non-zero if either failed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check nimbus plugins tests integration testsupport benchmarks scripts examples
status=0
.venv/bin/pytest tests plugins/*/tests -n "${NIMBUS_TEST_WORKERS:-2}" -p no:cacheprovider \
    --durations=10 "$@" || status=$?
# Exit code 5 is "no test selected" (say, -m "not slow"): not a failure.
.venv/bin/pytest integration -p no:cacheprovider --durations=25 "$@" \
    || { code=$?; [ "$code" -eq 5 ] || status=$code; }
exit "$status"
