"""Substring search in a worker log, answered in Storm logviewer's JSON shape.

One file (``/api/v1/search``)::

    {"isDaemon": "no", "searchString": s, "startByteOffset": n,
     "matches": [{"byteOffset", "beforeString", "afterString", "matchString",
                  "logviewerURL"}],
     "nextByteOffset": n}            # only when more matches may follow

Across a topology's files (``/api/v1/deepSearch/<topology-id>``), per slot::

    {"fileOffset": i, "searchString": s,
     "matches": [<one file's answer above> + {"fileName": "<id>/<port>/<file>",
                                              "port": "<port>"}]}

The search string is bytes (UTF-8), matched as they are; 128 bytes of context are given
on either side, decoded with replacement characters where they cut a character.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from nimbus.supervisor.logviewer.files import LogFile, LogFileError, LogRoot

CONTEXT_BYTES = 128
CHUNK_BYTES = 1024 * 1024
MAX_SEARCH_BYTES = 1024   # Storm's GREP_MAX_SEARCH_SIZE
DEFAULT_MATCHES = 10
MAX_MATCHES = 1000

#: (file path, byte offset of a match) -> the URL of the log page centred on it.
PageURL = Callable[[str, int], str]


def check_search(search: str | None) -> bytes:
    """The search string as bytes; ValueError unless it has 1 to 1024 UTF-8 bytes."""
    needle = (search or "").encode("utf-8", "surrogatepass")
    if not 0 < len(needle) <= MAX_SEARCH_BYTES:
        raise ValueError(f"search-string must have 1 to {MAX_SEARCH_BYTES} UTF-8 bytes")
    return needle


def search_file(read: Callable[[int, int], bytes], size: int, path: str, needle: bytes,
                num_matches: int, start: int, page_url: PageURL) -> dict[str, Any]:
    """Storm's answer for the first ``num_matches`` matches of ``needle`` at or after
    byte ``start`` of a file of ``size`` bytes that ``read(offset, length)`` reads."""
    if start > size:
        raise ValueError(f"start-byte-offset {start} is past the end of the file "
                         f"({size} bytes)")
    matches: list[dict[str, Any]] = []
    position = start
    while position < size and len(matches) < num_matches:
        # Each chunk overlaps the next by a needle less one byte: no match is missed.
        chunk = read(position, CHUNK_BYTES + len(needle) - 1)
        if not chunk:
            break
        found = chunk.find(needle)
        while found >= 0 and found < CHUNK_BYTES and len(matches) < num_matches:
            offset = position + found
            before_start = max(0, offset - CONTEXT_BYTES)
            matches.append({
                "byteOffset": offset,
                "beforeString": read(before_start, offset - before_start)
                .decode("utf-8", "replace"),
                "afterString": read(offset + len(needle), CONTEXT_BYTES)
                .decode("utf-8", "replace"),
                "matchString": needle.decode("utf-8", "replace"),
                "logviewerURL": page_url(path, offset)})
            found = chunk.find(needle, found + 1)
        position += CHUNK_BYTES
    answer: dict[str, Any] = {"isDaemon": "no", "searchString": needle.decode("utf-8",
                                                                              "replace"),
                              "startByteOffset": start, "matches": matches}
    if len(matches) >= num_matches:
        following = matches[-1]["byteOffset"] + len(needle)
        if following < size:
            answer["nextByteOffset"] = following
    return answer


def deep_search(root: LogRoot, files: Sequence[LogFile], needle: bytes, num_matches: int,
                file_offset: int, start: int, page_url: PageURL) -> dict[str, Any]:
    """Storm's answer for one slot: its ``files`` (newest first) from ``file_offset``
    on, the first from byte ``start``, until ``num_matches`` matches."""
    matches: list[dict[str, Any]] = []
    count = 0
    index = file_offset
    for index in range(file_offset, len(files)):
        log_file = files[index]
        try:
            opened = root.open(log_file.topology_id, log_file.port, log_file.name)
        except LogFileError:
            start = 0
            continue  # rotated away meanwhile
        try:
            answer = search_file(opened.read, opened.size, log_file.path, needle,
                                 num_matches - count, min(start, opened.size), page_url)
        finally:
            opened.close()
        start = 0
        found = len(answer["matches"])
        if found:
            matches.append({**answer, "fileName": log_file.path,
                            "port": str(log_file.port)})
            count += found
        if count >= num_matches:
            break
    else:
        index = len(files)
    return {"fileOffset": index, "searchString": needle.decode("utf-8", "replace"),
            "matches": matches}
