"""Code distributor that keeps topology code in HDFS, through ``pyarrow.fs``.

The layout, manifest and verification are the core's ``ManifestStoreDistributor``; this
module supplies the settings and the connection: ``pyarrow.fs.HadoopFileSystem`` (namenode,
user, Kerberos ticket cache, replication) behind fsspec's Arrow wrapper. A namenode of
``file:///dir`` uses ``pyarrow.fs.LocalFileSystem`` instead: the same pyarrow calls on a
local directory, for tests and for a single host without HDFS.

``prepare`` creates the root directory (``namenode`` + ``path``); every later upload and
download checks that it is still there before it writes or reads a file, so that a
namenode that is down, or a ``file://`` directory that is gone (an unmounted disk), fails
with an error naming ``nimbus.codedistributor.hdfs.namenode`` instead of creating the root
again on whatever is there now.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from nimbus.plugin_api import (
    ManifestStoreDistributor,
    StoreCodeError,
    TransferMeter,
    hookimpl,
)

PREFIX = "nimbus.codedistributor.hdfs."


class HDFSCodeDistributor(ManifestStoreDistributor):
    """Topology code in HDFS; see the module docstring."""

    name = "hdfs"
    PREFIX = PREFIX

    @hookimpl
    def config_defaults(self) -> dict[str, Any]:
        return {
            # "default" (fs.defaultFS of core-site.xml), "hdfs://host:port" or "file:///dir"
            PREFIX + "namenode": "default",
            PREFIX + "path": "/nimbus-ha/code",
            PREFIX + "user": "",                     # "" = the login user
            PREFIX + "kerberos.ticket.cache": "",    # path of a ticket cache, "" = none
            PREFIX + "replication": 3,               # HDFS replication of every file
            PREFIX + "buffer.size": 0,
        }

    def _local(self) -> bool:
        return self.setting("namenode").startswith("file://")

    def connect(self, conf: dict[str, Any]) -> tuple[Any, str]:
        import pyarrow.fs as pafs
        from fsspec.implementations.arrow import ArrowFSWrapper

        path = "/" + self.setting("path").strip("/")
        namenode = self.setting("namenode")
        try:
            if self._local():
                base = urlparse(namenode).path.rstrip("/")
                if not base:
                    raise StoreCodeError(f"{PREFIX}namenode {namenode!r} names no directory")
                arrow_fs = pafs.LocalFileSystem()
                root = base + path
            else:
                host, port = "default", 0
                if namenode != "default":
                    parsed = urlparse(namenode)
                    if parsed.scheme != "hdfs" or not parsed.hostname:
                        raise StoreCodeError(f"{PREFIX}namenode must be 'default', "
                                             f"'hdfs://host:port' or 'file:///dir', "
                                             f"not {namenode!r}")
                    host, port = parsed.hostname, parsed.port or 8020
                arrow_fs = pafs.HadoopFileSystem(
                    host, port, user=self.setting("user") or None,
                    replication=self.setting("replication"),
                    buffer_size=self.setting("buffer.size"),
                    kerb_ticket=self.setting("kerberos.ticket.cache") or None)
                root = path
            fs = ArrowFSWrapper(arrow_fs)
            fs.makedirs(root, exist_ok=True)
            fs.ls(root)  # fail fast: reachable, permitted
        except StoreCodeError:
            raise
        except Exception as exc:
            raise self.explain(exc, "connect") from None
        return fs, root

    def _check_root(self, key: str) -> None:
        """The root that ``prepare`` created is still there (before ``key`` is written or
        read): raise a StoreCodeError naming the settings otherwise."""
        try:
            present = self.fs.isdir(self.root)
        except Exception as exc:
            raise self.explain(exc, key) from None
        if not present:
            raise StoreCodeError(
                f"{key}: {self.root} is gone from {self.setting('namenode')}: check "
                f"{PREFIX}namenode (is HDFS up, the directory mounted?) and {PREFIX}path")

    def _store_file(self, local: Path, key: str, meter: TransferMeter) -> tuple[int, str]:
        self._check_root(key)
        return super()._store_file(local, key, meter)

    def _fetch_file(self, key: str, target: Path, size: int,
                    meter: TransferMeter) -> tuple[int, str]:
        self._check_root(key)
        return super()._fetch_file(key, target, size, meter)

    def replication(self) -> int:
        # A local directory holds one copy. For HDFS it is the replication the files were
        # written with, which HDFS maintains; pyarrow cannot read the live block count.
        return 1 if self._local() else self.setting("replication")

    def explain(self, exc: BaseException, what: str) -> StoreCodeError:
        text = f"{type(exc).__name__}: {exc}"
        namenode = self.setting("namenode")
        if "libhdfs" in text or "HADOOP_HOME" in text or "JAVA_HOME" in text \
                or "CLASSPATH" in text:
            hint = ("pyarrow cannot load HDFS's client: set HADOOP_HOME, JAVA_HOME and "
                    "CLASSPATH=$(hadoop classpath --glob)")
        elif isinstance(exc, PermissionError) or "Permission denied" in text:
            user = self.setting("user") or os.environ.get("USER", "the login user")
            hint = (f"HDFS refused {user} at {namenode}: check {PREFIX}user, "
                    f"{PREFIX}kerberos.ticket.cache and the permissions of {PREFIX}path")
        elif what == "connect":
            hint = f"cannot use HDFS at {namenode}: check {PREFIX}namenode and {PREFIX}path"
        else:
            hint = (f"HDFS error during {what} at {namenode}: check {PREFIX}namenode (is "
                    f"HDFS up?) and {PREFIX}path")
        return StoreCodeError(f"{hint} ({text})")
