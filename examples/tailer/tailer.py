"""Copy the lines appended to $TAILER_INPUT to $TAILER_OUTPUT, resuming after a restart.

The offset of the next unread byte is kept in ``$NIMBUS_HA_STATE_DIR/offset``. Each round
appends the new complete lines to the output, flushes them to disk, and only then
records the new offset (atomically, by rename). A crash between the two repeats those
lines after the restart: delivery is **at-least-once** (a line is never lost, but may be
copied twice). A line is copied only once its newline has been written.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

POLL_SECS = 0.2


def main() -> None:
    source = Path(os.environ["TAILER_INPUT"])
    target = Path(os.environ["TAILER_OUTPUT"])
    offset_file = Path(os.environ["NIMBUS_HA_STATE_DIR"]) / "offset"
    target.parent.mkdir(parents=True, exist_ok=True)
    offset = int(offset_file.read_text()) if offset_file.exists() else 0
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    print(f"tailer: {source} -> {target} from offset {offset}", flush=True)
    while not stopping:
        try:
            with source.open("rb") as f:
                f.seek(offset)
                chunk = f.read()
        except FileNotFoundError:
            chunk = b""
        complete = chunk[: chunk.rfind(b"\n") + 1]
        if complete:
            with target.open("ab") as out:
                out.write(complete)
                out.flush()
                os.fsync(out.fileno())
            offset += len(complete)
            tmp = offset_file.with_suffix(".tmp")
            tmp.write_text(str(offset))
            os.replace(tmp, offset_file)
        else:
            time.sleep(POLL_SECS)


if __name__ == "__main__":
    main()
