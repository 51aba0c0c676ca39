"""Snapshot staging: host copies that are exact, independent, reuse their buffers, and run
off the calling thread until `fence`."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from navrl_daemon.storage.staging import SnapshotStaging


def state() -> dict:
    return {
        "policy": {"w": torch.randn(4, 3), "b": torch.zeros(3)},
        "optim": {"state": {0: {"step": torch.tensor(5.0)}}, "groups": [{"betas": (0.9, 0.99)}]},
        "version": 7,
        "name": "x",
    }


def test_staged_copy_is_exact_and_independent_of_the_source() -> None:
    src = state()
    staged = SnapshotStaging(2).stage(src)
    staged.ready()
    assert torch.equal(staged.state["policy"]["w"], src["policy"]["w"])
    assert staged.state["optim"]["groups"][0]["betas"] == (0.9, 0.99)
    assert staged.state["version"] == 7 and staged.state["name"] == "x"
    before = staged.state["policy"]["w"].clone()
    src["policy"]["w"].add_(1.0)  # the trainer's next update
    assert torch.equal(staged.state["policy"]["w"], before)


def test_released_slots_are_reused_without_new_allocations() -> None:
    staging = SnapshotStaging(2)
    first = staging.stage(state())
    buffer = first.state["policy"]["w"]
    first.ready()  # the writer has written it
    first.release()
    first.release()  # twice is harmless
    second = staging.stage(state())
    assert second.state["policy"]["w"].data_ptr() == buffer.data_ptr()
    assert staging.slots_in_use == 1


def test_at_most_max_slots_are_held() -> None:
    staging = SnapshotStaging(2)
    a, b = staging.stage(state()), staging.stage(state())
    assert a.state["policy"]["w"].data_ptr() != b.state["policy"]["w"].data_ptr()
    with pytest.raises(RuntimeError, match="all 2 snapshot slots are in use"):
        staging.stage(state())
    a.release()
    staging.stage(state())  # a freed slot is taken again


def test_a_changed_shape_gets_a_new_buffer() -> None:
    staging = SnapshotStaging(1)
    first = staging.stage({"w": torch.zeros(3)})
    first.ready()
    first.release()
    staged = staging.stage({"w": torch.ones(5)})
    staged.ready()
    assert torch.equal(staged.state["w"], torch.ones(5))


def test_cpu_copies_run_on_the_copier_thread_and_fence_waits_for_them(monkeypatch) -> None:
    staging = SnapshotStaging(2)
    started, go = threading.Event(), threading.Event()
    threads: list[str] = []
    copyto = np.copyto

    def slow_copyto(dst, src, **kw):  # type: ignore[no-untyped-def]
        threads.append(threading.current_thread().name)
        started.set()
        assert go.wait(5)
        copyto(dst, src, **kw)

    monkeypatch.setattr(np, "copyto", slow_copyto)
    src = {"w": torch.arange(6.0)}
    staged = staging.stage(src)  # returns while the copy is held up
    assert started.wait(5)
    fenced = threading.Event()
    waiter = threading.Thread(target=lambda: (staging.fence(), fenced.set()))
    waiter.start()
    time.sleep(0.05)
    assert not fenced.is_set()  # the trainer's next update would wait here
    go.set()
    waiter.join(5)
    assert fenced.is_set()
    src["w"].add_(1.0)  # the next update, after the fence
    staged.ready()
    assert torch.equal(staged.state["w"], torch.arange(6.0))
    assert threads and all(name.startswith("snapshot-copy") for name in threads)


def test_every_dtype_is_copied_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(0)
    src = {
        "f32": torch.randn(7, 3, generator=g),
        "bf16": torch.randn(5, generator=g).to(torch.bfloat16),
        "nan": torch.tensor([float("nan"), -0.0, float("inf")]),
        "bool": torch.tensor([True, False]),
        "i64": torch.tensor(2**40),
        "strided": torch.randn(4, 6, generator=g)[:, ::2],
        "empty": torch.empty(0, 3),
        "grad": torch.randn(3, generator=g, requires_grad=True),
    }
    staged = SnapshotStaging(1).stage(src)
    staged.ready()
    for key, value in src.items():
        got = staged.state[key]
        assert got.dtype == value.dtype and got.shape == value.shape, key
        assert got.is_contiguous(), key
        size = value.element_size()
        assert torch.equal(
            got.reshape(-1).view(_as_int(size)),
            value.detach().contiguous().reshape(-1).view(_as_int(size)),
        ), key


def _as_int(size: int) -> torch.dtype:
    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]


def test_a_slot_released_mid_copy_goes_back_only_after_the_copy(monkeypatch) -> None:
    staging = SnapshotStaging(1)
    go = threading.Event()
    copyto = np.copyto
    monkeypatch.setattr(np, "copyto", lambda d, s, **kw: (go.wait(5), copyto(d, s, **kw)))
    staged = staging.stage({"w": torch.ones(3)})
    releaser = threading.Thread(target=staged.release)  # a dropped snapshot, mid-copy
    releaser.start()
    time.sleep(0.05)
    assert releaser.is_alive() and staging.slots_in_use == 1
    go.set()
    releaser.join(5)
    assert staging.slots_in_use == 0
    staging.stage({"w": torch.ones(3)})  # and the slot is taken again at once


def test_a_failed_copy_is_raised_by_ready_not_by_the_trainers_fence(monkeypatch) -> None:
    staging = SnapshotStaging(1)

    def broken(*_a, **_kw):  # type: ignore[no-untyped-def]
        raise OSError("no memory")

    monkeypatch.setattr(np, "copyto", broken)
    staged = staging.stage({"w": torch.ones(3)})
    with pytest.raises(OSError, match="no memory"):
        staged.ready()
    staging.fence()  # the writer reports it; training goes on


def _copier_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("snapshot-copy")]


def test_close_lets_a_started_copy_finish_then_the_copier_thread_ends(monkeypatch) -> None:
    before = set(_copier_threads())
    staging = SnapshotStaging(1)
    go = threading.Event()
    copyto = np.copyto
    monkeypatch.setattr(np, "copyto", lambda d, s, **kw: (go.wait(5), copyto(d, s, **kw)))
    staged = staging.stage({"w": torch.arange(4.0)})
    ours = set(_copier_threads()) - before
    assert len(ours) == 1
    staging.close(wait=False)  # returns with the copy still held up
    assert not staged._future.done()
    with pytest.raises(RuntimeError, match="closed"):
        staging.stage({"w": torch.zeros(1)})
    go.set()
    staged.ready()
    assert torch.equal(staged.state["w"], torch.arange(4.0))
    (thread,) = ours
    thread.join(5)
    assert not thread.is_alive()
