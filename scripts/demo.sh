#!/usr/bin/env bash
# Set up, then: ZooKeeper + 3 nimbuses + 2 supervisors.
# 1. Submit a sample topology (replication 2), kill -9 the leader and delete its
#    storm.local.dir, show the failover and the surviving topology.
# 2. Submit the word-count PySpark pipeline (examples/wordcount), feed it records, kill -9
#    the supervisor running it and its worker, watch it move to the other supervisor, and
#    check that the output holds every record exactly once.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
rm -rf dev-cluster
exec .venv/bin/nimbus-ha dev-cluster --nimbuses 3 --supervisors 2 --demo "$@"
