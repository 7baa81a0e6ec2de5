#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: lint, fast tests, plugin conformance
# suites, and the multi-process integration tests. Pass -m "not slow" for the quick subset.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check nimbus plugins tests integration examples
.venv/bin/pytest tests plugins/*/tests integration -p no:cacheprovider --durations=25 "$@"
