"""Storm UI's human-readable durations ("1d 2h 3m 4s")."""

from __future__ import annotations


def pretty_uptime(seconds: int | float) -> str:
    """``seconds`` as Storm's UIHelpers.prettyUptimeSec does: largest unit first, the
    units above the largest non-zero one left out (``"5m 58s"``, ``"0s"``)."""
    secs = max(0, int(seconds))
    days, rest = divmod(secs, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m")]
    out: list[str] = []
    for value, unit in parts:
        if value or out:
            out.append(f"{value}{unit}")
    out.append(f"{secs}s")
    return " ".join(out)
