"""The metrics registry: every metric of design §3 is exported with its type, the methods
the stages call move the right samples, channels and lease pools are read at scrape time,
and `promtool check metrics` accepts the exposition."""

from __future__ import annotations

import math
import subprocess
import time
from pathlib import Path

import anyio
import prometheus_client
import pytest
import torch
from ops_assets import METRICS, require_tool
from prometheus_client.parser import text_string_to_metric_families

from navrl_daemon.ops.metrics import POLICY_LAG_BUCKETS, SECONDS_BUCKETS, STATES, Metrics
from navrl_daemon.runtime.channels import Channel, Overflow
from navrl_daemon.runtime.leases import LeasePool

STAGE_PHASES = [("producer", "collect"), ("trainer", "update")]
LOSSES = {
    "actor_loss": -0.02,
    "critic_loss": 0.5,
    "entropy_loss": -0.001,
    "policy_entropy": 1.0,
    "actor_grad_norm": 1.5,
    "critic_grad_norm": 3.0,
    "feature_extractor_grad_norm": 0.75,
    "kl": 0.004,
    "explained_var": 0.25,
    "minibatch_updates": 12,
    "nonfinite_updates": 1,
    "kl_stopped_steps": 3,
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def make_metrics(device: str = "cpu") -> Metrics:
    return Metrics(
        version="0.1.0", torch_version="2.13.0", device=device, stage_phases=STAGE_PHASES
    )


def families(metrics: Metrics) -> dict[str, prometheus_client.Metric]:
    """Exported families by their exposition name (counters with their `_total`)."""
    parsed = text_string_to_metric_families(metrics.render().decode())
    return {f.name + ("_total" if f.type == "counter" else ""): f for f in parsed}


def value(metrics: Metrics, sample: str, **labels: str) -> float:
    """The one sample named `sample` whose labels include `labels`."""
    found = [
        s.value
        for f in families(metrics).values()
        for s in f.samples
        if s.name == sample and labels.items() <= s.labels.items()
    ]
    assert len(found) == 1, f"{sample}{labels}: {len(found)} samples"
    return found[0]


def test_every_metric_of_the_design_is_exported_with_its_type() -> None:
    exported = {name: f.type for name, f in families(make_metrics()).items()}
    expected = {name: kind for name, kind in METRICS.items() if name != "up"}  # Prometheus'
    assert {n: exported.get(n) for n in expected} == expected
    ours = {n for n in exported if n.startswith("navrl_")}
    assert ours <= expected.keys(), f"not in ops_assets.METRICS: {ours - expected.keys()}"
    assert not [n for n in exported if n.endswith("_created")]


def test_dashboard_series_exist_before_the_first_event() -> None:
    m = make_metrics()
    assert value(m, "navrl_frames_total") == 0
    for term in ("actor", "critic", "entropy"):
        assert math.isnan(value(m, "navrl_loss", term=term))  # NaN: no update yet, not 0
    for group in ("actor", "critic", "feature_extractor"):
        assert math.isnan(value(m, "navrl_grad_norm", group=group))
    assert math.isnan(value(m, "navrl_policy_kl"))
    assert math.isnan(value(m, "navrl_update_statistic", name="policy_entropy"))
    assert value(m, "navrl_kl_stopped_steps_total") == 0
    for kind in ("raw", "stored"):
        assert value(m, "navrl_checkpoint_bytes", kind=kind) == 0
        assert value(m, "navrl_archive_bytes_total", kind=kind) == 0
    for kind in ("allocated", "reserved"):
        assert value(m, "navrl_gpu_memory_bytes", kind=kind) == 0  # a CPU run
    assert math.isnan(value(m, "navrl_episode_reach_goal_ratio"))
    assert math.isnan(value(m, "navrl_eval_return"))
    assert math.isnan(value(m, "navrl_eval_reach_goal_low_ratio"))
    assert value(m, "navrl_last_iteration_timestamp_seconds") == 0
    assert value(m, "navrl_checkpoint_last_success_timestamp_seconds") == 0
    for stage, phase in STAGE_PHASES:
        assert value(m, "navrl_stage_seconds_count", stage=stage, phase=phase) == 0
        assert value(m, "navrl_stage_busy_ratio", stage=stage) == 0
    assert {s: value(m, "navrl_daemon_state", state=s) for s in STATES} == {
        "starting": 1,
        "running": 0,
        "draining": 0,
        "stopped": 0,
        "finished": 0,
    }
    assert value(m, "navrl_build_info", version="0.1.0", torch="2.13.0", device="cpu") == 1
    assert value(m, "process_start_time_seconds") > 0
    assert "python_info" in families(m)


def test_iteration_moves_counters_gauges_and_the_lag_histogram() -> None:
    m = make_metrics()
    m.iteration(frames_delta=64, policy_version=1, policy_lag=0, losses=LOSSES, now=1000.0)
    m.iteration(frames_delta=64, policy_version=2, policy_lag=3, losses=LOSSES, now=1001.5)

    assert value(m, "navrl_frames_total") == 128
    assert value(m, "navrl_iterations_total") == 2
    assert value(m, "navrl_policy_version") == 2
    assert value(m, "navrl_last_iteration_timestamp_seconds") == 1001.5
    assert value(m, "navrl_nonfinite_updates_total") == 2
    assert value(m, "navrl_loss", term="actor") == LOSSES["actor_loss"]
    assert value(m, "navrl_loss", term="critic") == LOSSES["critic_loss"]
    assert value(m, "navrl_loss", term="entropy") == LOSSES["entropy_loss"]
    assert value(m, "navrl_update_statistic", name="policy_entropy") == 1.0
    assert value(m, "navrl_update_statistic", name="minibatch_updates") == 12
    assert value(m, "navrl_grad_norm", group="actor") == LOSSES["actor_grad_norm"]
    assert value(m, "navrl_grad_norm", group="critic") == LOSSES["critic_grad_norm"]
    assert value(m, "navrl_grad_norm", group="feature_extractor") == 0.75
    assert value(m, "navrl_policy_kl") == LOSSES["kl"]
    assert value(m, "navrl_kl_stopped_steps_total") == 6
    assert value(m, "navrl_explained_variance") == LOSSES["explained_var"]
    # Lag 0 and lag 3: cumulative buckets 0 → 1, 1 → 1, 2 → 1, 4 → 2, 8 → 2.
    buckets = {
        le: value(m, "navrl_policy_lag_bucket", le=str(float(le))) for le in POLICY_LAG_BUCKETS
    }
    assert buckets == {0: 1, 1: 1, 2: 1, 4: 2, 8: 2}
    assert value(m, "navrl_policy_lag_sum") == 3


def test_iteration_keeps_series_missing_from_the_losses() -> None:
    m = make_metrics()
    m.iteration(frames_delta=8, policy_version=1, policy_lag=0, losses=LOSSES)
    m.iteration(frames_delta=8, policy_version=2, policy_lag=0, losses={"actor_loss": 0.75})
    assert value(m, "navrl_loss", term="actor") == 0.75
    assert value(m, "navrl_loss", term="critic") == LOSSES["critic_loss"]
    assert value(m, "navrl_nonfinite_updates_total") == 1
    assert abs(value(m, "navrl_last_iteration_timestamp_seconds") - time.time()) < 60


def test_episodes_evaluation_and_throughput() -> None:
    m = make_metrics()
    window = {"episodes": 5, "reach_goal": 0.4, "collision": 0.2, "return": 12.5}
    m.episodes({**window, "episode_len": 180.0, "truncated": 0.4, "out_of_bounds": 0.1})
    m.episodes({})  # nothing finished in the next window: the last means stay
    assert value(m, "navrl_episode_reach_goal_ratio") == 0.4
    assert value(m, "navrl_episode_collision_ratio") == 0.2
    assert value(m, "navrl_episode_return") == 12.5
    assert value(m, "navrl_episode_length_steps") == 180.0
    assert value(m, "navrl_episode_out_of_bounds_ratio") == 0.1

    result = {"episodes": 4, "reach_goal": 0.75, "collision": 0.25, "return": 30.0}
    m.evaluation({**result, "episode_len": 250.0, "out_of_bounds": 0.0, "unfinished": 0})
    assert value(m, "navrl_eval_reach_goal_ratio") == 0.75
    assert value(m, "navrl_eval_collision_ratio") == 0.25
    assert value(m, "navrl_eval_return") == 30.0
    assert value(m, "navrl_eval_episode_length_steps") == 250.0
    assert value(m, "navrl_eval_out_of_bounds_ratio") == 0.0
    # Wilson's 95 % interval of 3 in 4: 0.3006 to 0.9544 (the formula evaluated on its own).
    assert value(m, "navrl_eval_reach_goal_low_ratio") == pytest.approx(0.3006, abs=1e-4)
    assert value(m, "navrl_eval_reach_goal_high_ratio") == pytest.approx(0.9544, abs=1e-4)
    assert value(m, "navrl_evaluations_total") == 1
    m.evaluation({"reach_goal": 0.5})  # no episode count: no interval, not the last one's
    assert math.isnan(value(m, "navrl_eval_reach_goal_high_ratio"))
    assert value(m, "navrl_evaluations_total") == 2

    m.rollback()
    assert value(m, "navrl_rollbacks_total") == 1


def test_stage_time_and_busy_ratio() -> None:
    m = make_metrics()
    for seconds in (0.003, 0.003, 0.2, 120.0):
        m.stage_time("trainer", "update", seconds)
    m.stage_time("checkpoint_writer", "write", 0.5)  # a pair not declared up front
    m.stage_busy("trainer", 0.8)

    def bucket(le: float) -> float:
        return value(m, "navrl_stage_seconds_bucket", stage="trainer", phase="update", le=str(le))

    # A CPU update of 120 s is told from one of 60: the buckets go on to 20 min.
    assert [bucket(le) for le in (0.001, 0.005, 0.25, 60.0, 120.0)] == [0, 2, 3, 3, 4]
    assert value(m, "navrl_stage_seconds_bucket", stage="trainer", le="+Inf") == 4
    assert value(m, "navrl_stage_seconds_count", stage="checkpoint_writer", phase="write") == 1
    assert value(m, "navrl_stage_seconds_count", stage="producer", phase="collect") == 0
    assert value(m, "navrl_stage_busy_ratio", stage="trainer") == 0.8
    assert SECONDS_BUCKETS[0] == 0.001 and SECONDS_BUCKETS[-1] >= 600


def test_frames_per_second_is_the_latest_iteration_s() -> None:
    """Set by every iteration, not only by a summary (every 10 iterations of ~2 min on a
    CPU): it moves with training. The first iteration, which also timed start-up, sets
    none."""
    now = [100.0]
    m = Metrics(version="0", torch_version="0", device="cpu", clock=lambda: now[0])
    step = {"frames_delta": 32768, "policy_lag": 0, "losses": {}}
    m.iteration(policy_version=1, **step)
    assert value(m, "navrl_frames_per_second") == 0
    now[0] += 128.0
    m.iteration(policy_version=2, **step)
    assert value(m, "navrl_frames_per_second") == 256.0
    now[0] += 64.0
    m.iteration(policy_version=3, **step)
    assert value(m, "navrl_frames_per_second") == 512.0


def test_state_is_one_hot_over_all_states() -> None:
    m = make_metrics()
    for current in ("running", "draining", "stopped", "finished"):
        m.set_state(current)
        assert {s: value(m, "navrl_daemon_state", state=s) for s in STATES} == {
            s: float(s == current) for s in STATES
        }
    with pytest.raises(ValueError, match="paused"):
        m.set_state("paused")


def test_checkpoint_missed_intervals_count_whole_intervals_without_a_checkpoint() -> None:
    """The metric behind NavrlCheckpointsMissed: every write failing (a read-only or
    replaced checkpoints dir, a full disk) makes it climb while training goes on."""
    m = make_metrics()

    def iterate(*versions: int) -> None:
        for version in versions:
            m.iteration(frames_delta=64, policy_version=version, policy_lag=0, losses={})

    m.checkpoint_schedule(interval=2, iteration=10)  # resumed from checkpoint 10
    iterate(11, 12, 13)
    assert value(m, "navrl_checkpoint_missed_intervals") == 0  # 12's write may be in flight
    iterate(14)
    assert value(m, "navrl_checkpoint_missed_intervals") == 1
    iterate(15, 16, 17, 18)
    assert value(m, "navrl_checkpoint_missed_intervals") == 3
    m.checkpoint_written(0.1, 100, 50, iteration=18)
    assert value(m, "navrl_checkpoint_missed_intervals") == 0
    iterate(19, 20, 21)
    assert value(m, "navrl_checkpoint_missed_intervals") == 0
    m.write_failed("eval_results")
    assert value(m, "navrl_write_failures_total", file="eval_results") == 1
    assert value(m, "navrl_write_failures_total", file="export") == 0


def test_checkpoint_archive_and_prefetch() -> None:
    m = make_metrics()
    m.checkpoint_written(1.2, raw_bytes=4_000_000, stored_bytes=1_500_000, now=2000.0)
    m.checkpoint_stall(0.004)
    m.checkpoint_failed()
    m.archive_written(1000, 400)
    m.archive_written(1000, 300, segments=2)
    m.archive_dropped(3)
    m.prefetch_wait(0.02)
    m.prefetch_batch()

    assert value(m, "navrl_checkpoint_write_seconds_bucket", le="2.5") == 1
    assert value(m, "navrl_checkpoint_write_seconds_bucket", le="1.0") == 0
    assert value(m, "navrl_checkpoint_stall_seconds_count") == 1
    assert value(m, "navrl_checkpoint_bytes", kind="raw") == 4_000_000
    assert value(m, "navrl_checkpoint_bytes", kind="stored") == 1_500_000
    assert value(m, "navrl_checkpoint_last_success_timestamp_seconds") == 2000.0
    assert value(m, "navrl_checkpoint_failures_total") == 1
    assert value(m, "navrl_archive_bytes_total", kind="raw") == 2000
    assert value(m, "navrl_archive_bytes_total", kind="stored") == 700
    assert value(m, "navrl_archive_segments_total") == 3
    assert value(m, "navrl_archive_dropped_total") == 3
    assert value(m, "navrl_prefetch_wait_seconds_bucket", le="0.025") == 1
    assert value(m, "navrl_prefetch_batches_total") == 1


@pytest.mark.anyio
async def test_channels_and_lease_pools_are_read_at_scrape_time() -> None:
    m = make_metrics()
    rollouts: Channel[int] = Channel("rollouts", 1, Overflow.BLOCK)
    archive: Channel[int] = Channel("archive", 2, Overflow.DROP_NEWEST)
    pool = LeasePool([0], name="rollouts")
    m.watch_channel(rollouts)
    m.watch_channel(archive)
    m.watch_pool(pool)
    with pytest.raises(ValueError, match="already watched"):
        m.watch_channel(Channel("rollouts", 1))

    assert value(m, "navrl_queue_capacity", queue="rollouts") == 1
    assert value(m, "navrl_queue_capacity", queue="archive") == 2
    assert value(m, "navrl_lease_pool_free", pool="rollouts") == 1

    async with archive.sender() as to_archive:
        assert [await to_archive.send(i) for i in range(3)] == [True, True, False]
    assert value(m, "navrl_queue_depth", queue="archive") == 2
    assert value(m, "navrl_queue_dropped_total", queue="archive") == 1

    # A full block channel holds the sender until the receiver takes an item; a taken
    # buffer holds the next acquire until it is released.
    sender, receiver = rollouts.sender(), rollouts.receiver()
    lease = await pool.acquire()
    assert value(m, "navrl_lease_pool_free", pool="rollouts") == 0
    async with anyio.create_task_group() as tg:
        await sender.send(1)
        tg.start_soon(sender.send, 2)
        tg.start_soon(pool.acquire)
        await anyio.sleep(0.05)
        assert value(m, "navrl_queue_depth", queue="rollouts") == 1
        assert value(m, "navrl_queue_blocked_seconds_total", queue="rollouts") == 0
        assert await receiver.receive() == 1
        lease.release()
    assert value(m, "navrl_queue_blocked_seconds_total", queue="rollouts") >= 0.04
    assert value(m, "navrl_queue_dropped_total", queue="rollouts") == 0
    assert value(m, "navrl_lease_wait_seconds_total", pool="rollouts") >= 0.04
    assert value(m, "navrl_lease_pool_free", pool="rollouts") == 0


def test_promtool_accepts_the_exposition() -> None:
    promtool = require_tool("promtool")
    m = make_metrics()
    m.watch_channel(Channel("rollouts", 2))
    m.watch_pool(LeasePool([0, 1], name="rollouts"))
    m.iteration(frames_delta=64, policy_version=1, policy_lag=1, losses=LOSSES)
    m.episodes({"reach_goal": 0.5, "collision": 0.1, "return": 3.0, "episode_len": 40.0})
    m.evaluation({"reach_goal": 0.5, "collision": 0.1, "return": 3.0, "episode_len": 40.0})
    m.stage_time("trainer", "update", 0.3)
    m.checkpoint_written(0.5, 100, 50)
    m.set_state("running")
    checked = subprocess.run(
        [promtool, "check", "metrics"],
        input=m.render(),
        capture_output=True,
        timeout=30,
    )
    complaints = (checked.stdout + checked.stderr).decode()
    assert checked.returncode == 0 and not complaints.strip(), complaints


def test_gpu_memory_is_read_from_the_daemons_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    # No GPU here: stand in for torch.cuda's three calls (the device check runs on one).
    reads: list[str] = []

    def allocated(device: str) -> int:
        reads.append(device)
        return 1 << 20

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_allocated", allocated)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 4 << 20)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (6 << 30, 8 << 30))
    on_gpu, on_cpu = make_metrics("cuda:1"), make_metrics("cpu")
    assert value(on_gpu, "navrl_gpu_memory_bytes", kind="allocated") == 1 << 20
    assert value(on_gpu, "navrl_gpu_memory_bytes", kind="reserved") == 4 << 20
    assert value(on_gpu, "navrl_gpu_memory_bytes", kind="device_used") == 2 << 30
    assert value(on_gpu, "navrl_gpu_memory_bytes", kind="device_total") == 8 << 30
    assert set(reads) == {"cuda:1"}  # the daemon's device, not the current one
    for kind in ("allocated", "reserved", "device_used", "device_total"):
        assert value(on_cpu, "navrl_gpu_memory_bytes", kind=kind) == 0


def test_state_dir_free_space_is_read_at_scrape_time(tmp_path: Path) -> None:
    import os

    m = make_metrics()
    assert b"\nnavrl_state_dir_free_bytes " not in m.render()  # no state dir yet: no sample
    m.watch_state_dir(str(tmp_path))
    st = os.statvfs(tmp_path)
    free = value(m, "navrl_state_dir_free_bytes")
    assert abs(free - st.f_bavail * st.f_frsize) < 64 << 20  # what the disk has, give or take


def test_evaluation_time_and_interval() -> None:
    m = make_metrics()
    assert value(m, "navrl_last_evaluation_timestamp_seconds") == 0
    assert value(m, "navrl_eval_interval_iterations") == 0
    m.evaluation({"reach_goal": 0.5}, now=1234.0)
    assert value(m, "navrl_last_evaluation_timestamp_seconds") == 1234.0
    on = Metrics(version="t", torch_version="t", device="cpu", eval_interval=10)
    assert value(on, "navrl_eval_interval_iterations") == 10


def test_each_metrics_has_its_own_registry_and_leaves_the_global_one_alone() -> None:
    first, second = make_metrics(), make_metrics()
    first.iteration(frames_delta=10, policy_version=1, policy_lag=0, losses={})
    assert value(first, "navrl_frames_total") == 10
    assert value(second, "navrl_frames_total") == 0
    global_names = {f.name for f in prometheus_client.REGISTRY.collect()}
    assert not [n for n in global_names if n.startswith("navrl_")]
