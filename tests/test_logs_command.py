"""``nimbus-ha logs``'s own logic (nimbus/logs.py): its options, and following a slot's log
across rotations by each file's identity, against a stand-in logviewer whose files rotate
between two looks. The real thing, against real supervisors, is
integration/test_worker_logs.py."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest

from nimbus.config import load_config
from nimbus.logs import LogsCommand, LogsOptions, Slot, compile_grep, parse_since
from nimbus.web.logviewer_client import LogviewerError

TOPOLOGY = "chatty-1-100"


@pytest.mark.parametrize("text, seconds", [("30s", 30), ("10m", 600), ("2h", 7200),
                                           ("1d", 86400), ("90", 90), ("1.5m", 90)])
def test_since_takes_a_duration(text, seconds):
    assert parse_since(text) == seconds


@pytest.mark.parametrize("text", ["", "yesterday", "-5m", "0", "10 minutes", "5w"])
def test_since_refuses_anything_else(text):
    with pytest.raises(ValueError, match="--since"):
        parse_since(text)


def test_grep_is_a_python_regular_expression():
    assert compile_grep(r"ERROR \d+").search("x ERROR 42")
    assert compile_grep(None) is None
    with pytest.raises(ValueError, match="not a regular expression"):
        compile_grep("([")


class RotatingViewer:
    """A logviewer of one slot whose worker.log rotates like the pump's (keeping
    ``backups`` older files); each file has an identity that follows it."""

    host, port = "127.0.0.1", 8000

    def __init__(self, backups: int = 2):
        self.backups = backups
        self.files: list[tuple[int, bytearray]] = [(1, bytearray())]  # newest first
        self.next_id = 2

    def write(self, text: str) -> None:
        self.files[0][1].extend(text.encode())

    def rotate(self) -> None:
        self.files.insert(0, (self.next_id, bytearray()))
        self.next_id += 1
        del self.files[self.backups + 1:]

    def list_files(self, topology_id: str, port: int | None = None,
                   since_secs: float | None = None) -> list[dict]:
        return [{"file": f"{topology_id}/6700/{self._name(g)}", "port": 6700,
                 "name": self._name(g), "generation": g, "size": len(data),
                 "id": str(file_id), "workers": [0]}
                for g, (file_id, data) in enumerate(self.files)]

    def stream(self, path: str, start: int = 0, file_id: str | None = None
               ) -> Iterator[bytes]:
        generation = self._generation(path.rsplit("/", 1)[1])
        found_id, data = self.files[generation]
        if file_id is not None and str(found_id) != file_id:
            raise LogviewerError(409, "it was rotated")
        yield bytes(data[start:])

    @staticmethod
    def _name(generation: int) -> str:
        return "worker.log" if generation == 0 else f"worker.log.{generation}"

    @staticmethod
    def _generation(name: str) -> int:
        return 0 if name == "worker.log" else int(name.rsplit(".", 1)[1])


def _command(viewer: RotatingViewer) -> tuple[LogsCommand, Slot, io.BytesIO, list[str]]:
    out, warnings = io.BytesIO(), []
    command = LogsCommand(load_config(overrides={}), "chatty", LogsOptions(follow=True), out,
                          warnings.append)
    slot = Slot(viewer, TOPOLOGY, 6700, label="127.0.0.1:6700")  # type: ignore[arg-type]
    command._show_initial(slot, sorted(viewer.list_files(TOPOLOGY),
                                       key=lambda e: -e["generation"]))
    return command, slot, out, warnings


def test_following_reads_each_rotated_file_to_its_end_then_the_newer_ones():
    viewer = RotatingViewer(backups=3)
    viewer.write("one\ntwo\n")
    command, slot, out, warnings = _command(viewer)
    viewer.write("three\n")
    viewer.rotate()
    viewer.write("four\n")
    viewer.rotate()
    viewer.write("five\nsix")          # a line not ended yet: held back
    command._poll(slot)
    assert out.getvalue().decode().splitlines() == ["one", "two", "three", "four", "five"]
    viewer.write("\nseven\n")
    command._poll(slot)
    assert out.getvalue().decode().splitlines()[-2:] == ["six", "seven"]
    assert warnings == []


def test_a_file_rotated_away_unread_is_said_and_the_rest_shown():
    viewer = RotatingViewer(backups=1)
    viewer.write("one\n")
    command, slot, out, warnings = _command(viewer)
    viewer.write("lost\n")
    for text in ("gone\n", "kept\n", "newest\n"):
        viewer.rotate()
        viewer.write(text)
    command._poll(slot)
    assert out.getvalue().decode().splitlines() == ["one", "kept", "newest"]
    assert warnings == ["warning: [127.0.0.1:6700] some of its log was rotated away "
                        "before it could be read"]


def test_a_rotation_between_the_listing_and_the_download_finds_the_file_again():
    viewer = RotatingViewer(backups=2)
    viewer.write("one\n")
    command, slot, out, warnings = _command(viewer)
    viewer.write("two\n")
    listing = viewer.list_files

    def rotated_after_listing(*args, **kwargs):
        answer = listing(*args, **kwargs)
        if not getattr(rotated_after_listing, "done", False):
            rotated_after_listing.done = True
            viewer.rotate()
            viewer.write("three\n")
        return answer

    viewer.list_files = rotated_after_listing  # type: ignore[method-assign]
    command._poll(slot)
    command._poll(slot)
    assert out.getvalue().decode().splitlines() == ["one", "two", "three"]
    assert warnings == []
