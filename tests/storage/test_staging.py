"""Snapshot staging: host copies that are exact, independent, and reuse their buffers."""

from __future__ import annotations

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
    staging.stage({"w": torch.zeros(3)}).release()
    staged = staging.stage({"w": torch.ones(5)})
    assert torch.equal(staged.state["w"], torch.ones(5))
