"""How a supervisor copies one file of topology code from a nimbus.

The transport is Thrift (``nimbus.thrift.client.fetch_file``), a layer above the
supervisor: the supervisor does not import it but is given it by its composition root
(nimbus/daemons/supervisor.py), bound with the process's security (its client
certificate: ``nimbus.thrift.client.file_fetcher``), and hands it on to the code cache
(its fetches from the nimbuses) and to the code distributor (a plugin that downloads
through the nimbuses, ``DistributorContext.fetch_file``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class FetchFile(Protocol):
    """Copies ``remote_path`` (``<topology-id>/<file>``) from the nimbus at ``peer``
    (``host:port``) to ``dest`` and returns the sha256 of the bytes written; raises
    when the nimbus cannot be reached or has no such file. ``timeout_s`` bounds each
    connect and read."""

    def __call__(self, peer: str, remote_path: str, dest: Path,
                 timeout_s: float = ...) -> str: ...
