"""What a nimbus-ha process logs: its own loggers at the chosen level, other libraries'
at WARNING unless ``nimbus.log.levels`` says otherwise, as text or as JSON lines.

Cloud SDKs and HTTP clients log every request at INFO (Azure's SDK about 90 lines per
start); kazoo logs every reconnect. They are kept to WARNING and above, so that the log
says what the daemon does. ``nimbus.log.levels`` (``{logger name: level}``) sets any
logger's level, a library's included (``{"azure": "INFO"}``), the most specific name
winning. ``nimbus.log.format: json`` writes one JSON object per line (``time``,
``level``, ``thread``, ``logger``, ``message``, and ``exception`` when there is one) for
log shippers; secrets are masked in both formats by the same filter
(:func:`nimbus.redaction.install_log_redaction`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import datetime, timezone

TEXT_FORMAT = "%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s"
#: Logger names that are nimbus-ha's own (the core, and its plugins' packages); the
#: package of the code distributor in use joins them (:func:`treat_as_own`).
OWN = ("nimbus", "nimbus_ha")
_own_packages: set[str] = set()


def treat_as_own(module: str) -> None:
    """Log ``module``'s package like nimbus-ha's own: a plugin's, whatever its name."""
    _own_packages.add(module.split(".", 1)[0])


class LibraryLevels(logging.Filter):
    """A handler filter: a record of another library passes only at WARNING and above,
    unless a configured level for its logger (or a parent) says otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.levels: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        configured = None
        for logger, level in self.levels.items():
            if (name == logger or name.startswith(logger + ".")) and (
                    configured is None or len(logger) > len(configured[0])):
                configured = (logger, level)
        if configured is not None:
            return record.levelno >= configured[1]
        top = name.split(".", 1)[0]
        if top.startswith(OWN) or top in _own_packages or name == "root":
            return True
        return record.levelno >= logging.WARNING


class JsonLines(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": datetime.fromtimestamp(record.created, timezone.utc)
                 .isoformat(timespec="milliseconds"),
                 "level": record.levelname, "thread": record.threadName,
                 "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


_filter = LibraryLevels()


def install(level: str) -> None:
    """Log at ``level`` to stderr, other libraries at WARNING (see the module doc)."""
    logging.basicConfig(level=level, format=TEXT_FORMAT)
    for handler in logging.getLogger().handlers:
        if _filter not in handler.filters:
            handler.addFilter(_filter)


def apply(levels: Mapping[str, str], fmt: str) -> None:
    """Apply ``nimbus.log.levels`` and ``nimbus.log.format`` (once the configuration is
    loaded). Raises ValueError for an unknown level or format."""
    parsed = {}
    for logger, level in levels.items():
        value = logging.getLevelName(str(level).upper())
        if not isinstance(value, int):
            raise ValueError(f"nimbus.log.levels: {level!r} (for {logger!r}) is not a level: "
                             "use DEBUG, INFO, WARNING, ERROR or CRITICAL")
        parsed[str(logger)] = value
        # The logger must let the record reach the handler's filter.
        target = logging.getLogger(str(logger))
        if target.getEffectiveLevel() > value:
            target.setLevel(value)
    _filter.levels = parsed
    if fmt not in ("text", "json"):
        raise ValueError(f"nimbus.log.format must be text or json, got {fmt!r}")
    for handler in logging.getLogger().handlers:
        handler.setFormatter(JsonLines() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
