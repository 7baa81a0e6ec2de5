"""The dashboard over HTTPS in a real headless chromium that presents a client
certificate, against a TLS cluster with the SimpleACLAuthorizer (separate nimbus and UI
processes). Chromium takes certificates from an NSS database only: the test makes one
in a HOME of its own with certutil and pk12util (Debian's libnss3-tools), and the
profile's auto_select_certificate setting picks the certificate without a dialog."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml
from helpers import observer
from tls_certs import DAEMON, USER, CertificateAuthority, Identity
from waiting import wait_for

from nimbus.dev.cluster import LocalCluster
from nimbus.dev.zookeeper import free_port
from nimbus.distribution.archive import pack_directory
from nimbus.thrift.client import NimbusClient

pytestmark = [pytest.mark.slow, pytest.mark.integration]
SIMPLE_ACL = "org.apache.storm.security.auth.authorizer.SimpleACLAuthorizer"


def nss_home(directory: Path, user: Identity) -> Path:
    """A HOME whose NSS database (what chromium reads on Linux) trusts the cluster's CA
    and holds ``user``'s certificate and key."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import (
        NoEncryption,
        load_pem_private_key,
        pkcs12,
    )

    if not shutil.which("certutil") or not shutil.which("pk12util"):
        pytest.fail("certutil and pk12util are needed: apt-get install libnss3-tools")
    nss = directory / ".pki" / "nssdb"
    nss.mkdir(parents=True)
    db = f"sql:{nss}"
    subprocess.run(["certutil", "-N", "-d", db, "--empty-password"], check=True)
    subprocess.run(["certutil", "-A", "-d", db, "-n", "cluster CA", "-t", "C,,", "-i",
                    str(user.ca)], check=True)
    bundle = directory / "user.p12"
    bundle.write_bytes(pkcs12.serialize_key_and_certificates(
        b"user", load_pem_private_key(user.key.read_bytes(), None),
        x509.load_pem_x509_certificate(user.cert.read_bytes()), None, NoEncryption()))
    subprocess.run(["pk12util", "-i", str(bundle), "-d", db, "-W", ""], check=True,
                   capture_output=True)
    return directory


def chromium_profile(directory: Path, origin: str) -> Path:
    """A profile that presents its certificate to ``origin`` without asking (the
    AutoSelectCertificateForUrls policy, as the user's own content setting)."""
    default = directory / "Default"
    default.mkdir(parents=True)
    (default / "Preferences").write_text(json.dumps({"profile": {"content_settings": {
        "exceptions": {"auto_select_certificate": {f"{origin},*": {
            "last_modified": "13300000000000000", "setting": {"filters": [{}]}}}}}}}))
    return directory


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui-https")
    ca = CertificateAuthority(tmp / "ca")
    ids = {name: ca.issue(name, DAEMON if name in ("cluster", "ui") else USER)
           for name in ("cluster", "ui", "alice", "bob")}
    cluster = LocalCluster(tmp / "cluster", nimbuses=1, supervisors=0, conf={
        **ids["cluster"].conf(), "nimbus.authorizer": SIMPLE_ACL,
        "nimbus.admins": ["ops", "ui"]})
    ui = log = None
    try:
        cluster.start()
        directory = tmp / "sleeper"
        directory.mkdir()
        (directory / "topology.yaml").write_text('command: ["sleep", "3600"]\n')
        bundle = pack_directory(directory)
        topologies = {}
        for owner in ("alice", "bob"):  # each submits with a certificate of its own
            as_owner = NimbusClient(cluster.client_conf(**ids[owner].conf()), deadline_s=60)
            topologies[owner] = as_owner.submit(f"{owner}s", bundle, {})
        port = free_port()
        config = tmp / "ui.yaml"
        config.write_text(yaml.safe_dump({**cluster.conf_values, **ids["ui"].conf(),
                                          "ui.host": "127.0.0.1", "ui.port": port}))
        log = (tmp / "ui.log").open("w")
        ui = subprocess.Popen([sys.executable, "-m", "nimbus.cli", "ui", "--config",
                               str(config)], stdout=log, stderr=subprocess.STDOUT)
        url = f"https://127.0.0.1:{port}"
        alice = ids["alice"]

        def serving() -> bool:
            assert ui.poll() is None, (tmp / "ui.log").read_text()
            return requests.get(url + "/api/v1/cluster/summary", timeout=5,
                                cert=(str(alice.cert), str(alice.key)),
                                verify=str(alice.ca)).status_code == 200
        wait_for(serving, 60, "the UI over HTTPS", interval_s=0.2)
        yield {"cluster": cluster, "ids": ids, "url": url, "tmp": tmp,
               "topologies": topologies, "state": observer(cluster)}
    finally:
        if ui is not None:
            ui.send_signal(signal.SIGTERM)
            ui.wait(timeout=30)
        if log is not None:
            log.close()
        cluster.stop()


@pytest.fixture(scope="module")
def browser(env):
    """Chromium signed in as alice: her certificate in its NSS database."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver_path:
        pytest.fail("chromium and chromium-driver are needed: run scripts/setup.sh")
    home = nss_home(env["tmp"] / "alice-home", env["ids"]["alice"])
    profile = chromium_profile(env["tmp"] / "alice-profile", env["url"])
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--disable-gpu", f"--user-data-dir={profile}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path,
                                              env={**os.environ, "HOME": str(home)}),
                              options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def css(driver, selector: str):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def text_of(driver, selector: str) -> str:
    found = css(driver, selector)
    return found[0].text if found else ""


def test_the_dashboard_over_https_acts_for_the_certificates_user(env, browser):
    from selenium.webdriver.support.ui import WebDriverWait

    alices, bobs = env["topologies"]["alice"], env["topologies"]["bob"]
    browser.get(env["url"] + "/")
    wait_for(lambda: text_of(browser, "#user") == "signed in as alice", 15,
             "the page to name the certificate's user")
    wait_for(lambda: css(browser, f'tr[data-topology="{bobs}"] button'), 10, "bobs' row")
    # bob's topology: its summary, without its numbers, and no enabled button for alice
    bob_buttons = css(browser, f'tr[data-topology="{bobs}"] button')
    assert [b.is_enabled() for b in bob_buttons] == [False, False, False, False]
    assert {b.get_attribute("title") for b in bob_buttons} == {
        "you may not change this topology"}
    assert text_of(browser, f'tr[data-topology="{bobs}"] td:nth-child(5)') == "—"
    assert "ACTIVE" in text_of(browser, f'tr[data-topology="{bobs}"] .status')
    # her own: deactivate goes through, for her
    button = wait_for(lambda: [b for b in css(
        browser, f'button[data-action="deactivate"][data-topology="{alices}"]')
        if b.is_enabled()], 10, "alice's enabled deactivate button")[0]
    button.click()
    alert = WebDriverWait(browser, 5).until(lambda d: d.switch_to.alert)
    assert alert.text == "Deactivate alices?"
    alert.accept()
    wait_for(lambda: env["state"].storm_base(alices).status == "INACTIVE", 30,
             "INACTIVE in ZooKeeper")
    wait_for(lambda: "INACTIVE" in text_of(browser, f'tr[data-topology="{alices}"] .status'),
             5, "INACTIVE in the page")
    assert env["state"].storm_base(bobs).status == "ACTIVE"
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
