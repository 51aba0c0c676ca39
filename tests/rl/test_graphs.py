"""The one capture-with-fallback that collection, evaluation and the update share: a step
captured (through the CPU's `traced_capture`, the contract of a CUDA graph) and counted,
or, where the capture fails, the failure raised or remembered and the step run eagerly."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import pytest
import torch

from navrl_daemon.rl.graphs import WARMUP_RUNS, StepCapture, traced_capture

FAILURE = "test step capture failed, stepping op by op"


class Counter:
    """A step fit for capture: adds a draw of its generator to a tensor, in place."""

    def __init__(self) -> None:
        self.generator = torch.Generator().manual_seed(0)
        self.total = torch.zeros(4)
        self.runs = 0  # Python runs of the step (a replay runs none)

        def step() -> None:  # a closure, as the captured steps are (make_fx traces no self)
            self.runs += 1
            self.total.add_(torch.rand(4, generator=self.generator))

        self.step = step

    def expected(self, steps: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(0)
        return sum((torch.rand(4, generator=g) for _ in range(steps)), torch.zeros(4))


class FailingCapture:
    """Runs the warm-up as a real capture does, then fails as CUDA does at the capture."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, step, *, warmup_runs, generators):
        self.calls += 1
        for _ in range(warmup_runs):
            step()
        raise RuntimeError("operation not permitted when stream is capturing")


def test_a_capture_is_replayed_and_counted() -> None:
    counter = Counter()
    capture = StepCapture(traced_capture, fallback=True, failure=FAILURE)
    replay = capture(counter.step, generators=[counter.generator])
    assert replay is not None
    assert counter.runs == WARMUP_RUNS  # the warm-up runs, the last of them traced
    for _ in range(5):
        replay()
    assert counter.runs == WARMUP_RUNS  # replays run no Python
    assert torch.equal(counter.total, counter.expected(WARMUP_RUNS + 5))  # the eager draws
    assert capture.captures == 1 and capture.capture_error is None
    capture(counter.step, generators=[counter.generator])  # something it held changed
    assert capture.captures == 2


def test_a_failed_capture_is_remembered_warned_once_and_the_step_goes_on_eagerly() -> None:
    counter, failing = Counter(), FailingCapture()
    capture = StepCapture(failing, fallback=True, failure=FAILURE)
    with pytest.warns(RuntimeWarning, match=f"^{FAILURE}: RuntimeError: operation not permitted"):
        replay = capture(counter.step, generators=[counter.generator])
    assert replay is None
    assert capture.capture_error == "RuntimeError: operation not permitted when stream is capturing"
    assert capture.captures == 0
    for _ in range(5):  # the caller goes on with its eager step
        counter.step()
    assert torch.equal(counter.total, counter.expected(WARMUP_RUNS + 5))
    with warnings_as_errors():  # no second try, no second warning
        assert capture(counter.step, generators=[counter.generator]) is None
    assert failing.calls == 1 and counter.runs == WARMUP_RUNS + 5


def test_a_failed_capture_raises_without_fallback() -> None:
    counter = Counter()
    capture = StepCapture(FailingCapture(), fallback=False, failure=FAILURE)
    with pytest.raises(RuntimeError, match="not permitted"), warnings_as_errors():
        capture(counter.step)
    assert capture.capture_error is None and capture.captures == 0


def test_a_failure_without_words_is_remembered_silently() -> None:
    """The update's capture: its failure is logged by the trainer, not warned about."""
    capture = StepCapture(FailingCapture(), fallback=True)
    with warnings_as_errors():
        assert capture(Counter().step) is None
    assert capture.capture_error is not None


@contextlib.contextmanager
def warnings_as_errors() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield
