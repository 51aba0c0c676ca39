"""`LogStream` on its own: lines to its stream until a write fails, then to the file `run`
named, once its directory exists; never an exception to the caller."""

from __future__ import annotations

import io
import json
from pathlib import Path

from navrl_daemon.ops.log_stream import LogStream


class Breaks(io.StringIO):
    """A stream whose reader goes away after `good` writes."""

    def __init__(self, good: int) -> None:
        super().__init__()
        self.good = good

    def write(self, text: str) -> int:
        if self.good == 0:
            raise BrokenPipeError(32, "Broken pipe")
        self.good -= 1
        return super().write(text)


def test_lines_go_on_in_the_file_once_the_stream_is_lost(tmp_path: Path) -> None:
    lines = Breaks(good=1)
    stream = LogStream(lines)
    state = tmp_path / "state"
    stream.continue_in(state / "daemon.log")
    assert stream.write("one\n") == 4 and lines.getvalue() == "one\n"
    assert stream.write("two\n") == 4  # lost: no state dir yet, dropped
    assert stream.lost == "BrokenPipeError: [Errno 32] Broken pipe"
    assert stream.dropped == 1 and not state.exists()
    state.mkdir()
    stream.write("three\n")
    stream.flush()
    note, rest = (state / "daemon.log").read_text().split("\n", 1)
    assert json.loads(note)["lines_dropped"] == 1
    assert json.loads(note)["error"] == stream.lost
    assert rest == "three\n"
    assert lines.getvalue() == "one\n" and not stream.isatty()


def test_without_a_file_lines_are_dropped_and_counted() -> None:
    stream = LogStream(Breaks(good=0))
    for _ in range(3):
        stream.write("x\n")
    assert stream.dropped == 3
