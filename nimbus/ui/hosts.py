"""Which host names the UI answers to: the Host header, against DNS rebinding.

A page on rebind.example can make its name resolve to 127.0.0.1 once it is loaded. Its
scripts then reach a loopback UI as their own origin: their ``Origin`` header matches
their ``Host`` header (both rebind.example), so the UI's cross-origin check lets their
POSTs through. The Host header still says rebind.example, so the UI answers only
requests whose Host is one of ``ui.allowed.hosts`` (default: localhost, 127.0.0.1,
[::1]) or the address ``ui.host`` binds, and gives 421 Misdirected Request to any other.

An entry without a port matches the Host with no port or with the UI's port; an entry
``name:port`` matches that port only; ``*`` matches every Host (the check is off).
Names compare without case and without a trailing dot.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from nimbus.config import Config, ConfigError
from nimbus.ui.app import error_response

KEY = "ui.allowed.hosts"
ANY = "*"
WILDCARD_BINDS = ("", "0.0.0.0", "::")
_HOST = re.compile(r"(?P<name>[a-z0-9_](?:[a-z0-9_.-]*)|\[[0-9a-f:.]+\])(?::(?P<port>[0-9]{1,5}))?",
                   re.IGNORECASE)


def _parse(text: str) -> tuple[str, int | None] | None:
    """(normalised name, port or None) of ``host`` or ``host:port``; None if malformed."""
    match = _HOST.fullmatch(text.strip())
    if match is None:
        return None
    port = int(match["port"]) if match["port"] else None
    if port is not None and not 0 < port < 65536:
        return None
    name = match["name"].lower()
    if not name.startswith("["):
        name = name.rstrip(".")
    return (name, port) if name else None


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def allowed_entries(conf: Config, bind_host: str) -> list[tuple[str, int | None]] | None:
    """The (name, port or None) pairs of ``ui.allowed.hosts`` plus ``bind_host``'s, or
    None for ``*``. A ConfigError names a malformed or empty list."""
    values = conf[KEY]
    if not values:
        raise ConfigError(f"{KEY} is empty: the UI would refuse every request; list the "
                          "host names it is reached by")
    if ANY in values:
        return None
    entries: list[tuple[str, int | None]] = []
    for value in values:
        parsed = _parse(str(value))
        if parsed is None:
            raise ConfigError(f"{KEY}: {value!r} is not a host name, [IPv6 address] or "
                              f"'{ANY}', optionally with :port")
        if parsed not in entries:
            entries.append(parsed)
    if bind_host not in WILDCARD_BINDS:
        own = _parse(_bracketed(bind_host))
        if own is not None and own not in entries:
            entries.append(own)
    return entries


def accepted_hosts(entries: Iterable[tuple[str, int | None]], port: int) -> list[str]:
    """Every Host header value the entries accept, with the UI on ``port``."""
    accepted: list[str] = []
    for name, entry_port in entries:
        forms = [name, f"{name}:{port}"] if entry_port is None else [f"{name}:{entry_port}"]
        accepted.extend(form for form in forms if form not in accepted)
    return accepted


class HostCheck:
    """WSGI middleware: ``app`` for requests whose Host is in ``accepted`` (see
    :func:`accepted_hosts`), 421 with a JSON error for any other."""

    def __init__(self, app: Callable[..., Any], accepted: list[str]):
        self.app = app
        self._accepted = frozenset(accepted)
        self._listed = ", ".join(accepted)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        host = environ.get("HTTP_HOST")
        parsed = _parse(host) if host is not None else None
        if parsed is not None and self._normal(parsed) in self._accepted:
            return self.app(environ, start_response)
        if host is None:
            message = (f"the request has no Host header; this UI answers to {self._listed}: "
                       "send one of these")
        else:
            message = (f"this UI does not answer to the host name {host!r} (the Host "
                       f"header); it answers to {self._listed}: add the name you use to "
                       f"{KEY}")
        return error_response(421, "Misdirected Request", message)(environ, start_response)

    @staticmethod
    def _normal(parsed: tuple[str, int | None]) -> str:
        name, port = parsed
        return name if port is None else f"{name}:{port}"
