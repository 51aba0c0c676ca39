"""The trainer's stream hand-offs (runtime/streams.py), on their calls: CPU builds have no
CUDA streams, and the CUDA tests of tests/stages/test_trainer_stream.py run them on a GPU."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import pytest
import torch

from navrl_daemon.runtime.streams import TrainerStream


class FakeStream:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls
        self.device = torch.device("cpu")

    def wait_event(self, event: object) -> None:
        self.calls.append(f"wait_event {event}")

    def wait_stream(self, stream: object) -> None:
        self.calls.append(f"wait_stream {stream}")

    def synchronize(self) -> None:
        self.calls.append("synchronize")


class FakeEvent:
    def __init__(self) -> None:
        self.recorded = False

    def record(self) -> None:
        self.recorded = True


class FakeTensor:
    def __init__(self, name: str, is_cuda: bool, calls: list[str]) -> None:
        self.name, self.is_cuda, self.calls = name, is_cuda, calls

    def record_stream(self, stream: object) -> None:
        self.calls.append(f"record_stream {self.name} on {stream}")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []

    @contextmanager
    def on(stream: Any):  # type: ignore[no-untyped-def]
        calls.append("enter")
        yield
        calls.append("exit")

    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "producer's")
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: "default")
    return calls


def test_without_a_stream_of_its_own_every_hand_off_is_nothing(calls: list[str]) -> None:
    shared = TrainerStream.for_device(torch.device("cpu"), own=False)
    assert not shared.active
    assert shared.mark_end() is None
    shared.wait_for(None)
    shared.read_here([FakeTensor("w", True, calls)])  # type: ignore[list-item]
    with shared.on():
        pass
    shared.finish()
    assert calls == []


def test_with_a_stream_of_its_own(calls: list[str]) -> None:
    own = TrainerStream(FakeStream(calls))  # type: ignore[arg-type]
    assert own.active
    event = own.mark_end()
    assert isinstance(event, FakeEvent) and event.recorded  # on the producer's stream
    with own.on():
        own.wait_for(event)  # type: ignore[arg-type]
        own.wait_for(None)  # a caller that marks nothing: everything queued before
    own.finish()
    tensors = [FakeTensor("gpu", True, calls), FakeTensor("cpu", False, calls)]
    own.read_here(tensors)  # type: ignore[arg-type]
    assert calls == [
        "enter",
        f"wait_event {event}",
        "wait_stream default",
        "exit",
        "synchronize",
        "record_stream gpu on producer's",
    ]
