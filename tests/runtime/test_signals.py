"""runtime/signals.py: a stop while starting is never lost, even where Python swallows the
exception it raises (CI, 2026-11-28: a SIGTERM landed in a weakref callback of the import
machinery, "Exception ignored in: <function _get_module_lock.<locals>.cb>", and the daemon
went on to train)."""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time
import weakref

import anyio
import pytest

from navrl_daemon.runtime.signals import Phase, StopRequested, StopSignals


class Anything:
    pass


def test_a_stop_swallowed_while_starting_is_raised_again_before_the_event_loop(
    capsys: pytest.CaptureFixture[str],
) -> None:
    signals = StopSignals().install()
    try:
        # A weakref callback, as in the import machinery: Python prints "Exception ignored
        # in ..." for what the handler raises there, and goes on.
        thing = Anything()
        _ref = weakref.ref(thing, lambda _: os.kill(os.getpid(), signal.SIGTERM))
        del thing
        assert signals.received == ["SIGTERM"]
        with pytest.raises(StopRequested) as stop, signals.queued():
            pytest.fail("the event loop must not start after a stop")
        assert stop.value.signal_name == "SIGTERM" and signals.phase is Phase.STARTING
    finally:
        signals.restore()
    assert "Traceback" not in capsys.readouterr().err  # no "Exception ignored in ..."


MODULE = "tests.runtime.signal_during_import"


def test_a_stop_inside_an_import_is_raised_after_it_not_inside_it() -> None:
    """Raised inside an import, the stop would unwind through whatever C code runs the
    import (torch's C++ start-up calls back into Python: rc 134, `terminate called after
    throwing pybind11::error_already_set`). It is raised once the import is done."""
    sys.modules.pop(MODULE, None)
    signals = StopSignals().install()
    try:
        with pytest.raises(StopRequested) as stop:
            importlib.import_module(MODULE)  # sends SIGTERM to itself, runs on 0.5 s
            time.sleep(5)  # the repeat lands here, outside the import
            pytest.fail("the stop was lost")
        assert stop.value.signal_name == "SIGTERM"
        assert sys.modules[MODULE].completed  # an exception inside would have undone it
        assert signals.received == ["SIGTERM"]  # the repeat is not a second stop
    finally:
        signals.restore()
        sys.modules.pop(MODULE, None)


def test_other_unraisable_exceptions_still_reach_the_previous_hook() -> None:
    seen: list[BaseException] = []
    previous = sys.unraisablehook
    sys.unraisablehook = lambda u: seen.append(u.exc_value)
    signals = StopSignals().install()
    try:
        thing = Anything()
        _ref = weakref.ref(thing, lambda _: 1 / 0)
        del thing
    finally:
        signals.restore()
        assert sys.unraisablehook != signals._unraisable
        sys.unraisablehook = previous
    assert [type(e) for e in seen] == [ZeroDivisionError]


def test_without_a_stop_queued_is_entered_and_queues_later_ones() -> None:
    signals = StopSignals().install()
    try:
        with signals.queued():
            assert signals.phase is Phase.QUEUED
            os.kill(os.getpid(), signal.SIGHUP)
            assert anyio.run(signals.next) == "SIGHUP"
        assert signals.phase is Phase.FINISHED
    finally:
        signals.restore()


def test_a_stop_signal_while_main_reports_a_stop_is_ignored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stop raised during start-up ends `main` with 0 and one line; a second signal then
    (another SIGTERM, or the repeat of one that arrived inside an import) must not raise
    out of that line: exit 1 with a traceback, seen once in 94 start-up signals."""
    from navrl_daemon import cli, config

    def stopped_during_start_up(*_: object) -> None:
        raise StopRequested("SIGTERM")

    lines: list[str] = []

    def report(signal_name: str, logging_ready: bool) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # lands while the stop is being reported
        lines.append(signal_name)

    cli.build_parser()  # the commands' modules import `load_config`: the real one, not ours
    monkeypatch.setattr(config, "load_config", stopped_during_start_up)
    monkeypatch.setattr(cli, "_stopped", report)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        assert cli.main(["config", "show"]) == 0
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert lines == ["SIGTERM"]
