#!/usr/bin/env bash
# Set up a fresh machine: Debian's ZooKeeper server (+ java) and Thrift compiler, and a
# virtualenv in .venv
# with nimbus-ha, its default code distributor and the test tools.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
# Apache Thrift's compiler: the wire-compatibility test generates an independent client.
command -v thrift >/dev/null 2>&1 || need_apt+=(thrift-compiler)
# Headless browser for the dashboard tests (integration/test_ui.py, via Selenium).
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
command -v pk12util >/dev/null 2>&1 || need_apt+=(libnss3-tools)  # client certificates for chromium
# iptables: the partition lab (integration/partition/) drops packets inside its namespaces.
command -v iptables >/dev/null 2>&1 || need_apt+=(iptables)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
# A real Prometheus and promtool: the alert rules (tests/test_alert_rules.py,
# integration/test_alerts.py). Debian's package does not start a server by itself here.
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
# slf4j's simple binding: the lab's ZooKeeper logs negotiated timeouts and session expiries.
[ -f /usr/share/java/slf4j-simple.jar ] || need_apt+=(libslf4j-java)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test]" -e plugins/nimbus-ha-localfs \
    -e "plugins/nimbus-ha-s3[test]" -e plugins/nimbus-ha-torrent -e plugins/nimbus-ha-hdfs \
    -e plugins/nimbus-ha-shareddir
echo "set up: $(.venv/bin/nimbus-ha --version)"
