#!/usr/bin/env bash
# Set up, then: ZooKeeper + 3 nimbuses, submit a sample topology (replication 2), kill -9
# the leader and delete its storm.local.dir, show the failover and the surviving topology.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
rm -rf dev-cluster
exec .venv/bin/nimbus-ha dev-cluster --nimbuses 3 --demo "$@"
