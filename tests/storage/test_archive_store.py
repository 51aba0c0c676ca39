"""EpisodeStore (in-memory, byte budget, FIFO) and the decoded-segment LRU cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from navrl_daemon.storage.codec import KeyCodec
from navrl_daemon.storage.episode_store import DecodedCache, EpisodeStore
from navrl_daemon.storage.segment import DecodedSegment, SegmentLayout


def tagged_rollout(iteration: int, num_envs: int = 4, steps: int = 6) -> TensorDict:
    """Values that say where they come from: iteration * 1e4 + env * 100 + step."""
    env = torch.arange(num_envs).view(-1, 1)
    step = torch.arange(steps).view(1, -1)
    tag = (iteration * 10_000 + env * 100 + step).to(torch.float64)
    noise = torch.rand(num_envs, steps, 32, generator=torch.Generator().manual_seed(iteration))
    return TensorDict(
        {
            "obs": {"tag": tag.unsqueeze(-1), "lidar": noise},
            "done": step.expand(num_envs, steps).unsqueeze(-1) == steps - 1,
        },
        batch_size=[num_envs, steps],
    )


def test_store_keeps_the_newest_rollouts_within_its_budget() -> None:
    unbounded = EpisodeStore(budget_bytes=1 << 30)
    sizes = []
    for i in range(7):
        before = unbounded.stored_bytes
        unbounded.add(tagged_rollout(i), iteration=i)
        sizes.append(unbounded.stored_bytes - before)
    store = EpisodeStore(budget_bytes=sum(sizes[4:]), workers=2, cache_bytes=1 << 20)
    for i in range(7):
        store.add(tagged_rollout(i), iteration=i)
        assert store.stored_bytes <= store.budget_bytes
    assert store.segments == 3 * 4 and store.evicted == 4 * 4
    tags = store.gather(np.arange(store.frames)).get(("obs", "tag")).squeeze(-1)
    # Everything left comes from the three newest rollouts, in order, nothing else.
    want = torch.cat([tagged_rollout(i)["obs", "tag"].reshape(-1) for i in (4, 5, 6)])
    assert torch.equal(tags, want)


def test_store_samples_round_trip_every_key_exactly() -> None:
    store = EpisodeStore(budget_bytes=1 << 30, default_filter="delta+shuffle")
    source = [tagged_rollout(i) for i in range(3)]
    for i, rollout in enumerate(source):
        store.add(rollout, iteration=i)
    batch = store.sample(200, np.random.default_rng(1))
    flat = torch.cat([r.reshape(-1) for r in source])
    index = batch["obs", "tag"].squeeze(-1).long()
    i, rest = index // 10_000, index % 10_000
    position = i * 24 + (rest // 100) * 6 + rest % 100
    assert torch.equal(batch["obs", "lidar"], flat["obs", "lidar"][position])
    assert torch.equal(batch["done"], flat["done"][position])


def test_store_refuses_a_rollout_of_another_layout() -> None:
    store = EpisodeStore(budget_bytes=1 << 30)
    store.add(tagged_rollout(0))
    other = tagged_rollout(1)
    other["obs", "lidar"] = torch.zeros(4, 6, 16)
    with pytest.raises(ValueError, match="differ from the store's first rollout"):
        store.add(other)
    assert store.segments == 4


def test_windows_are_consecutive_steps_of_one_segment() -> None:
    store = EpisodeStore(budget_bytes=1 << 30, mode="frame")
    for i in range(2):
        store.add(tagged_rollout(i, steps=5), iteration=i)
    windows = store.windows(50, 4, np.random.default_rng(2))
    tags = windows["obs", "tag"].squeeze(-1)
    assert tags.shape == (50, 4)
    assert torch.equal(tags - tags[:, :1], torch.arange(4.0).expand(50, 4))
    with pytest.raises(ValueError, match="no segment has 6 steps"):
        store.windows(1, 6, np.random.default_rng(0))


def test_decoded_cache_evicts_least_recently_used_past_its_bytes() -> None:
    def segment(steps: int) -> DecodedSegment:  # 800 bytes per step
        layout = SegmentLayout(["x"], [KeyCodec(np.dtype(np.float64), (100,))])
        return DecodedSegment(np.zeros(800 * steps, dtype=np.uint8), steps, layout)

    cache = DecodedCache(max_bytes=3 * 800)
    item = segment(1)
    for key in range(3):
        cache.put(key, item)
    assert cache.get(0) is item  # 0 is now the most recent
    cache.put(3, item)
    assert cache.get(1) is None and cache.get(0) is item and cache.get(3) is item
    assert cache.bytes == 3 * 800 and len(cache) == 3
    cache.put(9, segment(4))  # larger than the whole cache: not kept
    assert cache.get(9) is None
