"""Secrets in configuration: which keys hold them, and how they are kept out of output.

A key holds a secret when its name says so, at its end (``...password``,
``...secret.key``, ``...payload``, ``...token``) or anywhere in it for the credential
words of :data:`SECRET_WORDS` and :data:`SECRET_PHRASES` (``...account.key.<account>...``,
``...connection.string``, ``...sas``); such values are replaced by
:data:`REDACTED` wherever configuration leaves the process: ``getNimbusConf``,
``getTopologyConf``, CLI output and error messages. :class:`SecretLogFilter` also masks
the values themselves in log records, since a library may print them in a message.

A process that installs the filter (:func:`install_log_redaction`, done by every daemon
and command) also sends what would bypass its log handlers through them: an exception
that escapes a thread or the main thread, and Python warnings. A ``...payload`` value is
Storm's ``user:password``: its password is masked on its own too.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import traceback
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

REDACTED = "********"
# Suffixes of Storm-style keys whose values are credentials: the common names (AWS's
# secret access key, API keys, Azure's account keys, private keys, passphrases) and
# ZooKeeper's superACL (a digest of the super user's password).
SECRET_SUFFIXES = ("password", "passwd", "secret", "secret.key", "secret_key", "secretkey",
                   "secret_access_key", "secret.access.key", "payload", "token", "tokens",
                   "credentials", "api.key", "api_key", "apikey", "account.key",
                   "account_key", "private.key", "private_key", "passphrase", "superacl")

# Keys a plugin marked as secret (its config_defaults gave a Secret), whatever their name.
_MARKED: set[str] = set()


class Secret:
    """A default that marks its key as a credential, for plugins whose settings have names
    redaction would not recognise (docs/hooks.md, ``config_defaults``)::

        return {"nimbus.codedistributor.azure.account.key": Secret(None)}
    """

    def __init__(self, default: Any = None):
        self.default = default

    def __repr__(self) -> str:
        return "Secret(...)"


def mark_secret(key: str) -> None:
    """Treat ``key`` as a credential from now on (in this process)."""
    _MARKED.add(str(key))


# Words of a key's name (split at ".", "_" and "-") that make it a credential wherever
# they stand, not only at its end: Hadoop and Spark put the secret's name in the middle
# (spark.hadoop.fs.azure.account.key.<account>.blob.core.windows.net,
# fs.s3a.bucket.<bucket>.secret.key) and tenants pass such keys in topology.spark.conf.
SECRET_WORDS = frozenset({
    "password", "passwd", "secret", "secretkey", "token", "tokens", "credential",
    "credentials", "passphrase", "superacl", "apikey", "sas", "keyfile"})
SECRET_PHRASES = (("api", "key"), ("account", "key"), ("private", "key"),
                  ("access", "key"), ("session", "key"), ("connection", "string"),
                  ("shared", "key"))
_WORD_SPLIT = re.compile(r"[._\-]+")


def is_secret_key(key: str) -> bool:
    """True when ``key`` names a credential (e.g. ``nimbus.codedistributor.s3.secret.key``,
    ``spark.hadoop.fs.azure.account.key.acct.blob.core.windows.net``) or a plugin marked
    it as one."""
    text = str(key)
    lowered = text.lower()
    if lowered.endswith(SECRET_SUFFIXES) or text in _MARKED:
        return True
    words = [w for w in _WORD_SPLIT.split(lowered) if w]
    if SECRET_WORDS.intersection(words):
        return True
    return any(tuple(words[i:i + len(p)]) == p
               for p in SECRET_PHRASES for i in range(len(words) - len(p) + 1))


def redact(conf: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``conf`` with every secret value replaced (in nested mappings and lists
    of them too)."""
    return {key: REDACTED if is_secret_key(key) and value not in (None, "")
            else _redact_nested(value) for key, value in conf.items()}


def _redact_nested(value: Any) -> Any:
    if isinstance(value, Mapping):
        return redact(value)
    if isinstance(value, (list, tuple)):
        return [_redact_nested(v) for v in value]
    return value


def redact_value(key: str, value: Any) -> Any:
    """``value``, or :data:`REDACTED` when ``key`` holds a secret (for error messages)."""
    return REDACTED if is_secret_key(key) and value not in (None, "") else value


def secret_values(conf: Mapping[str, Any]) -> set[str]:
    """The non-trivial secret strings in ``conf`` (nested mappings and lists too): every
    secret value of 4 characters or more (a number as it prints), and the password part
    of a ``user:password`` payload."""
    found: set[str] = set()
    for key, value in conf.items():
        if is_secret_key(key) and isinstance(value, (str, int, float)) \
                and not isinstance(value, bool):
            text = str(value)
            parts = [text]
            if str(key).lower().endswith("payload") and ":" in text:
                parts.append(text.partition(":")[2])
            found.update(part for part in parts if len(part) >= 4)
        for nested in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(nested, Mapping):
                found |= secret_values(nested)
    return found


class SecretLogFilter(logging.Filter):
    """Masks known secret values in every log record that passes through a handler."""

    def __init__(self, secrets: Iterable[str]):
        super().__init__()
        # Longest first, so a secret that contains another is masked whole.
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._secrets:
            return True
        message = record.getMessage()
        masked = message
        for secret in self._secrets:
            masked = masked.replace(secret, REDACTED)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and record.exc_info[1] is not None:
            text = logging.Formatter().formatException(record.exc_info)
            for secret in self._secrets:
                text = text.replace(secret, REDACTED)
            record.exc_text, record.exc_info = text, None
        elif record.exc_text:
            for secret in self._secrets:
                record.exc_text = record.exc_text.replace(secret, REDACTED)
        if record.stack_info:
            for secret in self._secrets:
                record.stack_info = record.stack_info.replace(secret, REDACTED)
        return True


_known_secrets: set[str] = set()


def mask(text: str) -> str:
    """``text`` with every secret value of a configuration seen by this process masked."""
    for secret in sorted(_known_secrets, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def install_log_redaction(conf: Mapping[str, Any]) -> None:
    """Mask ``conf``'s secret values in every log handler and in :func:`mask`, and send
    uncaught exceptions and warnings through those handlers (see the module docstring)."""
    _known_secrets.update(secret_values(conf))
    log_filter = SecretLogFilter(_known_secrets)
    for handler in logging.getLogger().handlers:
        for old in [f for f in handler.filters if isinstance(f, SecretLogFilter)]:
            handler.removeFilter(old)
        handler.addFilter(log_filter)
    logging.captureWarnings(True)
    threading.excepthook = _uncaught_in_thread
    sys.excepthook = _uncaught


_uncaught_log = logging.getLogger("nimbus.uncaught")
ExcInfo = tuple[type[BaseException], BaseException | None, TracebackType | None]


def _report_uncaught(message: str, exc_info: ExcInfo) -> None:
    if logging.getLogger().handlers:
        _uncaught_log.error(message, exc_info=exc_info)  # masked by the handlers' filter
        return
    # No handler to mask it: print it masked, as Python would have printed it.
    text = "".join(traceback.format_exception(exc_info[0], exc_info[1], exc_info[2]))
    sys.stderr.write(mask(f"{message}\n{text}"))


def _uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if issubclass(args.exc_type, SystemExit):
        return
    name = args.thread.name if args.thread is not None else "(unknown)"
    _report_uncaught(f"uncaught exception in thread {name}",
                     (args.exc_type, args.exc_value, args.exc_traceback))


def _uncaught(exc_type: type[BaseException], exc: BaseException,
              tb: TracebackType | None) -> None:
    if issubclass(exc_type, KeyboardInterrupt):
        sys.__excepthook__(exc_type, exc, tb)
        return
    _report_uncaught("uncaught exception", (exc_type, exc, tb))
