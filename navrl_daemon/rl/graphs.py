"""Capture a step function once, replay it many times: a CUDA graph, or its CPU stand-in.

A capture records the kernels a function launches, on the tensors it touches, without
running them; each replay runs them again on the same tensors (on CUDA, the same
addresses). So a function fit for capture keeps whatever lives from one replay to the next
in tensors it updates in place, reads nothing on the host, and takes no Python branch that
a later replay would have to take differently. Its random draws come from generators
registered with the graph, which advance at every replay as if the ops ran eagerly, so a
replay draws what the eager call would have drawn.

`traced_capture` keeps that contract on the CPU (torch.fx: a replay runs the recorded aten
ops on the same tensors and generators, with every Python branch frozen as traced). Tests
use it to run the very function a GPU would capture, where there is no GPU.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

Replay = Callable[[], None]

# Warm-up runs before a capture (CUDA's lazy initialisation: cuBLAS/cuDNN workspaces,
# autograd's stream bookkeeping, the caching allocator's first blocks).
WARMUP_RUNS = 3


class Capture(Protocol):
    """Runs `step` `warmup_runs` times for real, then captures it (without running it)."""

    def __call__(
        self,
        step: Callable[[], None],
        *,
        warmup_runs: int,
        generators: Sequence[torch.Generator],
    ) -> Replay: ...


def capture_graph(
    warmup: Callable[[], None],
    prepare: Callable[[], None],
    step: Callable[[], None],
    device: torch.device,
    *,
    warmup_runs: int = WARMUP_RUNS,
    generators: Sequence[torch.Generator] = (),
) -> Replay:
    """`step` captured as a CUDA graph (PyTorch's whole-network capture recipe); returns
    its replay. `warmup` runs first, `warmup_runs` times, on a side stream (lazy CUDA
    initialisation must not happen during capture), `prepare` just before the capture.
    `generators` (CUDA generators `step` draws from) are registered with the graph."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup_runs):
            warmup()
    torch.cuda.current_stream(device).wait_stream(side)
    prepare()
    graph = torch.cuda.CUDAGraph()
    for generator in generators:
        graph.register_generator_state(generator)
    # The warm-up's stream again: library handles (cuBLAS) are cached per stream, so none is
    # created mid-capture. thread_local: other threads (the producer, the trainer, the
    # evaluator) may use CUDA meanwhile. capture_begin/end rather than `torch.cuda.graph`,
    # whose entry synchronizes the whole device: invalid while another thread's capture is
    # open, and a wait on every other thread's work.
    with torch.cuda.stream(side):
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            step()
        finally:
            graph.capture_end()
    torch.cuda.current_stream(device).wait_stream(side)
    return graph.replay


def cuda_capture(device: torch.device) -> Capture:
    """The `Capture` of a CUDA device: warm-up runs and capture on one side stream."""

    def capture(
        step: Callable[[], None], *, warmup_runs: int, generators: Sequence[torch.Generator]
    ) -> Replay:
        return capture_graph(
            step, lambda: None, step, device, warmup_runs=warmup_runs, generators=generators
        )

    return capture


class StepCapture:
    """A step's captures, and what happens when one fails: the one place collection,
    evaluation and the update capture through.

    Each call warms the step up (`warmup_runs` real runs) and captures it through `capture`,
    counting the captures made. Where a capture fails, without `fallback` the error is
    raised; with it, it is remembered in `capture_error` ("Type: message"), warned about
    once in the caller's words (`failure`; None: no warning, the caller reports it), and no
    capture is tried again: the caller goes on with its eager step, whose warm-up ran.
    """

    def __init__(
        self,
        capture: Capture,
        *,
        fallback: bool,
        failure: str | None = None,
        warmup_runs: int = WARMUP_RUNS,
    ) -> None:
        self.capture = capture
        self.fallback = fallback
        self.failure = failure
        self.warmup_runs = warmup_runs
        self.capture_error: str | None = None
        self.captures = 0

    def __call__(
        self, step: Callable[[], None], generators: Sequence[torch.Generator] = ()
    ) -> Replay | None:
        """The replay of `step` (its random draws from `generators`), or None where the
        capture failed under `fallback`, now or before."""
        if self.capture_error is not None:
            return None
        try:
            replay = self.capture(step, warmup_runs=self.warmup_runs, generators=generators)
        except Exception as err:
            if not self.fallback:
                raise
            self.capture_error = f"{type(err).__name__}: {err}"
            if self.failure is not None:
                message = f"{self.failure}: {self.capture_error}"
                warnings.warn(message, RuntimeWarning, stacklevel=2)
            return None
        self.captures += 1
        return replay


def traced_capture(
    step: Callable[[], None], *, warmup_runs: int, generators: Sequence[torch.Generator] = ()
) -> Replay:
    """The `Capture` contract on any device, through torch.fx: `warmup_runs` real runs, the
    last of them traced, and a replay that runs the recorded aten ops on the same tensors
    and generators. As in a CUDA graph, every Python branch (and any value read on the
    host) stays as it was when traced: a step that needed another branch later replays
    wrong. `generators` need no registration here: the ops hold them."""
    from torch.fx.experimental.proxy_tensor import make_fx

    if warmup_runs < 1:
        raise ValueError("traced_capture traces its last warm-up run: warmup_runs >= 1")
    for _ in range(warmup_runs - 1):
        step()
    return make_fx(step)()


class SameObjects:
    """Objects compared by identity (torchrl envs and TensorDicts define their own `==`):
    part of the key that says whether a captured graph still fits what it was made for."""

    def __init__(self, *objects: object) -> None:
        self.objects = objects

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, SameObjects)
            and len(self.objects) == len(other.objects)
            and all(a is b for a, b in zip(self.objects, other.objects, strict=True))
        )

    def __hash__(self) -> int:
        return hash(tuple(id(o) for o in self.objects))
