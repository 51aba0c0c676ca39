"""The trainer's CUDA stream of its own (`pipeline.trainer_stream`), and every point where
GPU work crosses between it and the producer's stream.

Without it (the CPU, or the option off) both stages queue on one stream and every method
here does nothing. With it:
- the producer marks each rollout's end with an event on its own stream (`mark_end`), and
  the trainer's update waits for that event only (`wait_for`), not for what the producer
  queued after it, so with `max_policy_lag = 1` the next rollout runs beside the update;
- everything the trainer runs on the GPU (update, weight copies, snapshot staging) runs
  inside `on()`, and whatever leaves the trainer (a released rollout lease, published
  weights) is finished on its stream first (`finish`);
- the producer tells the caching allocator that the trainer's tensors it loads are read on
  its stream (`read_here`), so their memory is not reused while those copies are queued.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext

import torch


class TrainerStream:
    def __init__(self, stream: torch.cuda.Stream | None = None) -> None:
        self.stream = stream

    @classmethod
    def for_device(cls, device: torch.device, own: bool) -> TrainerStream:
        """A stream of its own on `device` where the execution plan chose one (its
        `trainer_stream`, only ever on CUDA); else the shared one."""
        return cls(torch.cuda.Stream(device) if own else None)

    @property
    def active(self) -> bool:
        return self.stream is not None

    # The producer's side, on its thread's current stream.

    def mark_end(self) -> torch.cuda.Event | None:
        """An event at the end of the work queued so far (the rollout), for `wait_for`."""
        if self.stream is None:
            return None
        event = torch.cuda.Event()
        event.record()
        return event

    def read_here(self, tensors: Iterable[torch.Tensor]) -> None:
        """The trainer's `tensors` are read by copies queued on this thread's stream."""
        if self.stream is None:
            return
        current = torch.cuda.current_stream()
        for tensor in tensors:
            if tensor.is_cuda:
                tensor.record_stream(current)

    # The trainer's side.

    @contextmanager
    def on(self) -> Iterator[None]:
        """Queue the block's GPU work on the trainer's stream."""
        with torch.cuda.stream(self.stream) if self.stream is not None else nullcontext():
            yield

    def wait_for(self, ready: torch.cuda.Event | None) -> None:
        """Order the trainer's next work after the rollout that `ready` marks (None: after
        everything queued on the default stream, for a caller that marks nothing)."""
        if self.stream is None:
            return
        if ready is not None:
            self.stream.wait_event(ready)
        else:
            self.stream.wait_stream(torch.cuda.default_stream(self.stream.device))

    def finish(self) -> None:
        """Wait until the trainer's queued GPU work is done (before anything leaves it)."""
        if self.stream is not None:
            self.stream.synchronize()
