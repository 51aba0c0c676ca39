"""HDF5Prefetcher stage: real files, real worker processes, a real channel and lease pool.
Batches arrive in the seeded order with the right contents, backpressure holds while the
trainer keeps its leases, shutdown stops the workers, a bad file fails the stage with a
DataError and leaves no worker; an offline BC loop fed by the stage learns."""

from __future__ import annotations

from pathlib import Path

import anyio
import numpy as np
import pytest
import torch

from navrl_daemon.config import OfflineConfig, PrefetchConfig, load_config
from navrl_daemon.errors import ConfigError, DataError
from navrl_daemon.offline.bc import ImageJointPolicy, bc_step, beta_bc_loss, mse_bc_loss
from navrl_daemon.offline.dataset_synth import SynthSpec, write_synth
from navrl_daemon.offline.prefetch import BatchSchedule
from navrl_daemon.offline.prefetcher import HDF5Prefetcher
from navrl_daemon.rl.policy import NavRLPolicy
from navrl_daemon.rl.training import Training
from navrl_daemon.runtime.channels import Channel, Overflow
from navrl_daemon.runtime.supervisor import Shutdown
from navrl_daemon.storage.archive import ArchiveWriter, Schema, archive_name, encode_segments
from navrl_daemon.storage.episode_store import rollout_arrays
from tests.conftest import TINY
from tests.offline.test_datasets import direct_images
from tests.offline.test_prefetch import children

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("stage") / "train.h5"
    write_synth(path, SynthSpec(samples=800, height=20, width=20, seed=2))
    return path


def make_stage(dataset: Path, **prefetch: object) -> tuple[HDF5Prefetcher, Channel, Shutdown]:
    cfg = PrefetchConfig(
        paths=[str(dataset.parent / "*.h5")], depth=2, workers=2, image_size=16, batch_size=32,
        seed=9, **prefetch,
    )  # fmt: skip
    channel: Channel = Channel("batches", cfg.depth, Overflow.BLOCK)
    shutdown = Shutdown()
    stage = HDF5Prefetcher(cfg, OfflineConfig(), channel.sender(), shutdown=shutdown)
    return stage, channel, shutdown


@pytest.mark.anyio
async def test_batches_in_seeded_order_with_backpressure_then_shutdown(dataset: Path) -> None:
    before = children()
    stage, channel, shutdown = make_stage(dataset)
    receiver = channel.receiver()
    schedule = BatchSchedule(800, 32, seed=9)
    async with anyio.create_task_group() as tg:
        tg.start_soon(stage.run)
        held = []
        for k in range(5):  # every slot: depth 2 + workers 2 + 1
            lease = await receiver.receive()
            batch = lease.meta["batch"]
            assert lease.meta["seq"] == k
            np.testing.assert_array_equal(batch["index"].numpy(), schedule.indices(k))
            row = direct_images(dataset, int(batch["index"][3]), 16)
            assert torch.equal(batch["images"][3], row)
            held.append(lease)
        # The trainer holds every slot: nothing is read or sent until it gives one back.
        await anyio.sleep(1.0)
        assert stage.sent == 5 and channel.stats.depth == 0
        first = held[0].meta["batch"]  # and a held slot is not read into again
        assert torch.equal(first["images"][3], direct_images(dataset, int(first["index"][3]), 16))
        for lease in held:
            lease.release()
        lease = await receiver.receive()
        assert lease.meta["seq"] == 5
        lease.release()
        shutdown.request("test", 10.0)
    async for lease in receiver:  # drained after the sender closed
        lease.release()
    assert children() <= before


@pytest.mark.anyio
async def test_bad_file_fails_the_stage_and_leaves_no_worker(tmp_path: Path) -> None:
    bad = tmp_path / "bad.h5"
    write_synth(bad, SynthSpec(samples=20, height=8, width=8))
    bad.write_bytes(bad.read_bytes()[:5000])
    before = children()
    stage, _, _ = make_stage(bad)
    with pytest.raises(DataError, match=f"{bad}: cannot open"):
        await stage.run()
    assert children() <= before


@pytest.mark.anyio
async def test_offline_bc_fed_by_the_stage_learns(dataset: Path) -> None:
    stage, channel, _ = make_stage(dataset)
    receiver = channel.receiver()
    torch.manual_seed(0)
    losses = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(stage.run)
        await stage.ready.wait()
        mean, std = (torch.from_numpy(a) for a in stage.action_stats)  # type: ignore[union-attr]
        policy = ImageJointPolicy(16, 4, mean, std)
        optimizer = torch.optim.Adam(policy.parameters(), lr=2e-3)
        for _ in range(150):  # offline.steps
            with await receiver.receive() as lease:
                batch = lease.meta["batch"]
                stats = bc_step(lambda b=batch: mse_bc_loss(policy, b), list(policy.parameters()),
                                optimizer, 5.0)  # fmt: skip
            losses.append(stats["bc_loss"])
        receiver.close()  # the trainer is done: the stage ends on its own
    assert np.mean(losses[-20:]) < 0.3 * np.mean(losses[:5])


def test_offline_objectives_need_data_and_ppo_plus_bc_needs_archives() -> None:
    with pytest.raises(ConfigError, match=r"prefetch\.paths: .* needs at least one"):
        load_config(overrides=["offline.objective=bc"])
    with pytest.raises(ConfigError, match=r'prefetch\.layout: .* needs "archive"'):
        load_config(overrides=["offline.objective=ppo+bc", 'prefetch.paths=["a.h5"]'])
    cfg = load_config(overrides=['prefetch.paths=["a.h5", "b/*.h5"]', "prefetch.depth=3"])
    assert cfg.prefetch.paths == ["a.h5", "b/*.h5"] and cfg.offline.objective == "none"
    cfg = load_config(overrides=["offline.objective=bc", 'prefetch.paths=["a.h5"]'])
    assert cfg.offline.objective == "bc"


@pytest.mark.anyio
async def test_bc_of_the_navigation_policy_from_rollout_archives(tmp_path: Path) -> None:
    """Rollouts of a policy with a recognisable behaviour, archived, cloned into a fresh
    NavRL policy through the stage's "archive" layout: the NLL falls and the clone's Beta
    mean closes in on the collecting policy's."""
    training = Training.build(load_config(None, TINY), "cpu")
    collector = training.policy
    with torch.no_grad():  # a recognisable behaviour: axis 0 near 0.8, axis 1 narrow
        collector.beta_head.alpha_layer.bias[:2] = torch.tensor([3.0, 4.0])
        collector.beta_head.beta_layer.bias[:2] = torch.tensor([-3.0, 4.0])
    archive_rollouts(training, tmp_path / archive_name(0))

    stage, channel, _ = make_stage(tmp_path / archive_name(0), layout="archive")
    receiver = channel.receiver()
    torch.manual_seed(0)
    policy = NavRLPolicy()
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
    key = ("agents", "action_normalized")
    losses, errors = [], []
    async with anyio.create_task_group() as tg:
        tg.start_soon(stage.run)
        for _ in range(200):
            with await receiver.receive() as lease:
                batch = lease.meta["batch"]
                with torch.no_grad():  # distance to the collecting policy's own means
                    mean = policy.distribution(policy.observe(batch)).mean
                    target = collector.distribution(collector.observe(batch)).mean
                errors.append(float((mean - target).abs().mean()))
                stats = bc_step(lambda b=batch: beta_bc_loss(policy, b, key),
                                list(policy.parameters()), optimizer, 5.0)  # fmt: skip
                losses.append(stats["bc_loss"])
        receiver.close()
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.3
    assert np.mean(errors[-10:]) < 0.4 * errors[0]  # errors[0]: before the first step


def archive_rollouts(training: Training, path: Path, rollouts: int = 4) -> Path:
    """`rollouts` rollouts of `training`'s collector, archived as the daemon's archiver
    writes them."""
    writer = None
    for i in range(rollouts):
        training.collector.collect(training.buffer)
        arrays = rollout_arrays(training.buffer, copy=True)
        if writer is None:
            schema = Schema.for_rollout(arrays)
            writer = ArchiveWriter(path, schema)
        n = next(iter(arrays.values())).shape[0]
        writer.append(encode_segments(schema, arrays, range(n), iteration=i, policy_version=i))
    assert writer is not None
    writer.close()
    return path
