"""`pipeline.compress_rollouts`: PPO minibatches drawn from an LZ4-compressed copy of the
training batch, so the rollout buffer goes back to the producer before the epochs.

The write-ups' "full compression" scheme for memory-starved GPUs, made exact. Per update:

1. the [N, T] training batch (observations, actions, log-probs, values, advantages,
   targets) is copied to host memory and compressed per env (one segment = one env's T
   steps; the archive's codec, storage/archive.py) in a thread pool;
2. `release` is called: the trainer hands the rollout lease back, so the producer can
   collect the next rollout into it while the epochs run. One rollout buffer
   (`pipeline.lease_pool = 1`) then overlaps collection and training (`max_policy_lag
   = 1`) as two buffers do without compression;
3. every epoch the envs are shuffled into `ppo.minibatches` groups (ppo.env_groups); a
   minibatch decodes only its envs (in the pool), stacks them and moves them to the device.

Minibatches are groups of envs, not NavRL's uniform frames: the same data and the same
number of steps, but each minibatch holds whole env trajectories. `ppo.env_minibatches`
samples the same groups from the uncompressed batch; the two give bit-identical updates
(tests/storage/test_compressed_rollout.py). Memory: the compressed batch (measured ratio in
docs/archive.md) plus one decoded minibatch, instead of a second rollout buffer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from tensordict import TensorDictBase

from navrl_daemon.config import PPOConfig
from navrl_daemon.rl.ppo import env_groups
from navrl_daemon.storage.episode_store import EpisodeStore, as_tensordict

NO_BUDGET = 1 << 62  # one batch at a time: the store never evicts


@dataclass
class CompressionStats:
    """Of the newest update's batch."""

    raw_bytes: int = 0
    stored_bytes: int = 0
    compress_s: float = 0.0
    decode_s: float = 0.0


class CompressedMinibatches:
    """A `ppo.MinibatchSource` (see module doc). One instance per learner."""

    def __init__(self, workers: int = 2, level: int = 0) -> None:
        self.workers = workers
        self.level = level
        self.stats = CompressionStats()

    def report(self) -> dict[str, float]:
        """The newest update's compression, merged into its stats (progress lines, history):
        raw/stored ratio of the batch, seconds compressing it and decoding minibatches."""
        st = self.stats
        return {
            "compress_ratio": st.raw_bytes / st.stored_bytes if st.stored_bytes else 0.0,
            "compress_s": st.compress_s,
            "decode_s": st.decode_s,
        }

    def __call__(
        self,
        data: TensorDictBase,
        cfg: PPOConfig,
        generator: torch.Generator | None,
        device: torch.device,
        release: Callable[[], None] | None = None,
    ) -> Iterator[TensorDictBase]:
        num_envs, steps = data.batch_size[:2]
        t0 = time.perf_counter()
        store = EpisodeStore(NO_BUDGET, level=self.level, workers=self.workers, cache_bytes=0)
        try:
            store.add(data.to("cpu"))
            self.stats = CompressionStats(
                raw_bytes=int(data.bytes()),
                stored_bytes=store.stored_bytes,
                compress_s=time.perf_counter() - t0,
            )
            del data  # nothing below reads the rollout buffer
            if release is not None:
                release()
            for envs in env_groups(num_envs, cfg, generator, device):
                t1 = time.perf_counter()
                positions = envs.cpu().numpy()
                decoded = store.decode_positions(positions)
                stacked = {
                    spec.path: np.stack([decoded[p][spec.path] for p in positions.tolist()])
                    for spec in store.schema.keys
                }
                mb = as_tensordict(store.schema, stacked, [len(positions), steps])
                mb = mb.reshape(-1).to(device)
                self.stats.decode_s += time.perf_counter() - t1
                yield mb
        finally:
            store.close()
