"""conf/prometheus-alerts.yaml: Prometheus's own promtool checks the file and runs the
unit tests of every rule (tests/prometheus/alerts_test.yaml); every metric a rule names
is exported, and every exported metric is documented in docs/metrics.md."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from nimbus.metrics import NimbusMetrics, SupervisorMetrics, exported_metric_names
from nimbus.state.cluster_snapshot import ClusterSnapshot

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "conf" / "prometheus-alerts.yaml"
RULE_TESTS = REPO / "tests" / "prometheus" / "alerts_test.yaml"
METRICS_DOC = REPO / "docs" / "metrics.md"
ALERTS = {"NimbusHaNoLeader", "NimbusHaTwoLeaders", "NimbusHaReplicationBelowMinimum",
          "NimbusHaPipelineStalled", "NimbusHaWorkerCrashLoop", "NimbusHaSupervisorLost",
          "NimbusHaDutyCycleLate", "NimbusHaCodeSyncFailing"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool is missing: scripts/setup.sh installs Debian's prometheus")
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=120,
                          cwd=RULE_TESTS.parent)


def _rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"]
            for rule in group["rules"]]


def _exported() -> set[str]:
    nimbus = NimbusMetrics("localfs", is_leader=lambda: False, snapshot=ClusterSnapshot)
    supervisor = SupervisorMetrics(list, dict)
    return exported_metric_names(nimbus.registry) | exported_metric_names(
        supervisor.registry)


def test_promtool_accepts_the_rules():
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_every_rule_passes_its_unit_tests():
    result = promtool("test", "rules", RULE_TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr
    tested = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    assert tested == ALERTS == {rule["alert"] for rule in _rules()}


def test_rules_name_only_exported_metrics():
    used = {name for rule in _rules()
            for name in re.findall(r"\b((?:nimbus|supervisor)_[a-z_]+)\b", rule["expr"])}
    exported = _exported()
    assert used and used <= exported, f"not exported: {sorted(used - exported)}"


def test_every_exported_metric_is_documented():
    doc = METRICS_DOC.read_text()
    families = {re.sub(r"_(total|bucket|sum|count|created)$", "", name)
                for name in _exported()}
    missing = sorted(f for f in families if f"`{f}" not in doc)
    assert missing == [], f"not in docs/metrics.md: {missing}"
