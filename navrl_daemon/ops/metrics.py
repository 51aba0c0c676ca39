"""Every Prometheus metric of design §3, behind plain methods so no stage imports
prometheus_client.

One `Metrics` owns one `CollectorRegistry` (a fresh one unless injected), so tests can
build as many as they like and nothing lands in the client's global registry. Series a
dashboard or an alert reads exist from the start (counters at 0, every `term`, `kind` and
`state`; "last value" gauges read NaN until their first value, never a misleading 0), so
PromQL has data before the first event. Labels are bounded: stage, phase,
queue, pool, term, group, name (the update's statistics), kind, state; never an iteration
or a path.

Queue and lease-pool series are read from the registered objects at scrape time, and GPU
memory from torch.cuda, so the hot paths only ever touch counters and gauges. Scrapes run
in the HTTP server's thread; the client's metrics are thread-safe, and the channel and
pool reads are plain attribute reads.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from navrl_daemon.ops.intervals import interval_of
from navrl_daemon.ops.statistics import grad_norms, loss_terms, other_statistics
from navrl_daemon.rl.ppo import STAT_NAMES

# "finished": run.total_frames reached (the daemon keeps serving for metrics.final_scrape_s
# so Prometheus sees it, and the down alert can tell a finished run from a crash).
STATES = ("starting", "running", "draining", "stopped", "finished")
# Durations from 1 ms (a channel hop) to 20 min: a NavRL-scale update on a small CPU takes
# minutes, and a quantile can only read up to the largest bucket.
SECONDS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
    600, 1200,
)  # fmt: skip
POLICY_LAG_BUCKETS = (0, 1, 2, 4, 8)
# The `file` label of navrl_write_failures_total: eval/results.jsonl, history.jsonl,
# export/*.pt.
WRITTEN_FILES = ("eval_results", "history", "export")

# The update's statistics exported before the first update (NaN): PPO's, and "bc_loss",
# the behaviour-cloning loss of an offline objective (x bc_coef under "ppo+bc"). Any other
# the update returns is exported from its first value on, by its name (ops/statistics.py).
EXPECTED_STATISTICS = (*STAT_NAMES, "bc_loss")
# Counted, not gauged: steps the update left out.
_COUNTED = ("kl_stopped_steps", "nonfinite_updates")
# Episode stats (env STAT_KEYS) → (training metric, evaluation metric, what it says).
_EPISODE_STATS = {
    "reach_goal": ("reach_goal_ratio", "reach_goal_ratio", "share that reached the goal"),
    "collision": ("collision_ratio", "collision_ratio", "share that collided"),
    "return": ("return", "return", "mean return"),
    "episode_len": ("length_steps", "episode_length_steps", "mean length in steps"),
    "out_of_bounds": ("out_of_bounds_ratio", "out_of_bounds_ratio", "share out of the height band"),
}


class WatchedChannel(Protocol):
    """What the queue collector reads: runtime.channels.Channel."""

    @property
    def stats(self) -> ChannelStatsLike: ...


class ChannelStatsLike(Protocol):
    name: str
    capacity: int
    depth: int
    dropped: int
    blocked_seconds: float


class ArchiveUsageLike(Protocol):
    files: int
    bytes: int


class WatchedPool(Protocol):
    """What the lease collector reads: runtime.leases.LeasePool."""

    name: str

    @property
    def free(self) -> int: ...

    @property
    def waiting_seconds(self) -> float: ...


class Metrics:
    def __init__(
        self,
        *,
        version: str,
        torch_version: str,
        device: str,
        stage_phases: Iterable[tuple[str, str]] = (),
        eval_interval: int = 0,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`stage_phases`: the (stage, phase) pairs to export before their first timing;
        `eval_interval`: eval.interval (0: no evaluations are expected). `clock` times the
        ages (monotonic: a step of the wall clock changes no age)."""
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._clock = clock
        self._started = clock()
        self._last_iteration_at: float | None = None
        self._last_checkpoint_at: float | None = None

        self._training_metrics(r)
        self._pipeline_metrics(r)
        self._storage_metrics(r)
        self._evaluation_metrics(r, eval_interval)
        self._process_metrics(r, version, torch_version, device)
        self._nothing_yet(stage_phases)
        self.set_state("starting")

    def _training_metrics(self, r: CollectorRegistry) -> None:
        """Frames, iterations, throughput, the update's losses and statistics, episodes."""
        self.frames_total = Counter("navrl_frames", "Environment frames trained on.", registry=r)
        self.iterations_total = Counter(
            "navrl_iterations", "Training iterations (PPO updates) completed.", registry=r
        )
        self.frames_per_second = Gauge(
            "navrl_frames_per_second",
            "Training throughput over the latest iteration, in frames per second.",
            registry=r,
        )
        self.policy_version = Gauge(
            "navrl_policy_version", "Version of the policy the trainer last published.", registry=r
        )
        self.policy_lag = Histogram(
            "navrl_policy_lag",
            "Policy versions between the policy that collected a rollout and the one trained "
            "on it.",
            buckets=POLICY_LAG_BUCKETS,
            registry=r,
        )
        self.episode = {
            key: Gauge(
                f"navrl_episode_{name}",
                f"Training episodes finished in the last summary window: {what}; NaN before "
                "the first.",
                registry=r,
            )
            for key, (name, _, what) in _EPISODE_STATS.items()
        }
        self.loss = Gauge(
            "navrl_loss",
            "Mean loss term (PPO's, or bc: behaviour cloning) of the last update or offline "
            "step; NaN before the first.",
            ["term"],
            registry=r,
        )
        self.grad_norm = Gauge(
            "navrl_grad_norm",
            "Mean gradient norm (before clipping) of the last update, per parameter group; NaN "
            "before the first.",
            ["group"],
            registry=r,
        )
        self.explained_variance = Gauge(
            "navrl_explained_variance",
            "Explained variance of the value targets by the critic in the last update (1 is "
            "perfect, 0 no better than their mean); NaN before the first.",
            registry=r,
        )
        self.policy_kl = Gauge(
            "navrl_policy_kl",
            "KL from the rollout's policy, mean over the last update's applied minibatch "
            "steps, each measured before its step; NaN before the first.",
            registry=r,
        )
        # Statistics with a series of their own, kept for the dashboards that read them.
        self._own_series = {"explained_var": self.explained_variance, "kl": self.policy_kl}
        self.update_statistic = Gauge(
            "navrl_update_statistic",
            "Every other statistic of the last update, by the name the update gives it "
            "(the policy's entropy, value moves, learning rate, ...); NaN before the first.",
            ["name"],
            registry=r,
        )
        self.kl_stopped_steps_total = Counter(
            "navrl_kl_stopped_steps",
            "Minibatch steps left out by the KL early stop (ppo.target_kl).",
            registry=r,
        )
        self.nonfinite_updates_total = Counter(
            "navrl_nonfinite_updates",
            "PPO minibatch updates skipped because a loss or gradient norm was not finite.",
            registry=r,
        )
        self.rollbacks_total = Counter(
            "navrl_rollbacks", "Times the trainer went back to an earlier checkpoint.", registry=r
        )
        self.last_iteration_timestamp = Gauge(
            "navrl_last_iteration_timestamp_seconds",
            "Unix time the last training iteration completed; 0 before the first.",
            registry=r,
        )
        Gauge(
            "navrl_last_iteration_age_seconds",
            "Seconds since the last training iteration completed (since the daemon started, "
            "before the first), on the monotonic clock: a wall-clock step changes nothing.",
            registry=r,
        ).set_function(lambda: self._age(self._last_iteration_at))

    def _pipeline_metrics(self, r: CollectorRegistry) -> None:
        """Stage phases and busy shares, the daemon's state."""
        self.stage_seconds = Histogram(
            "navrl_stage_seconds",
            "Duration of one phase of a pipeline stage, in seconds.",
            ["stage", "phase"],
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.stage_busy_ratio = Gauge(
            "navrl_stage_busy_ratio",
            "Fraction of wall time a stage spent working (not waiting) in the last window.",
            ["stage"],
            registry=r,
        )
        self.daemon_state = Gauge(
            "navrl_daemon_state",
            "Lifecycle state of the daemon: 1 for the current state, 0 for the others.",
            ["state"],
            registry=r,
        )
        self.queues = _QueueCollector()
        r.register(self.queues)

    def _storage_metrics(self, r: CollectorRegistry) -> None:
        """Checkpoints, the rollout archive, the offline prefetch."""
        self.checkpoint_write_seconds = Histogram(
            "navrl_checkpoint_write_seconds",
            "Time to write one checkpoint file, in seconds.",
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.checkpoint_stall_seconds = Histogram(
            "navrl_checkpoint_stall_seconds",
            "Time training was held up to take a checkpoint snapshot, in seconds.",
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.checkpoint_last_success_timestamp = Gauge(
            "navrl_checkpoint_last_success_timestamp_seconds",
            "Unix time the last checkpoint was written; 0 before the first of this process.",
            registry=r,
        )
        Gauge(
            "navrl_checkpoint_age_seconds",
            "Seconds since this process last wrote a checkpoint (since it started, before "
            "the first), on the monotonic clock: a wall-clock step changes nothing.",
            registry=r,
        ).set_function(lambda: self._age(self._last_checkpoint_at))
        self.checkpoint_bytes = Gauge(
            "navrl_checkpoint_bytes",
            "Size of the last checkpoint in bytes, before (raw) and after (stored) compression.",
            ["kind"],
            registry=r,
        )
        self.checkpoint_failures_total = Counter(
            "navrl_checkpoint_failures", "Checkpoint writes that failed.", registry=r
        )
        self.mirror_failures_total = Counter(
            "navrl_mirror_failures",
            "Writes of the resume point to checkpoint.mirror that failed.",
            registry=r,
        )
        self.mirror_last_success_timestamp = Gauge(
            "navrl_mirror_last_success_timestamp_seconds",
            "Unix time the resume point was last mirrored; 0 before the first of this process.",
            registry=r,
        )
        self.checkpoint_missed_intervals = Gauge(
            "navrl_checkpoint_missed_intervals",
            "Checkpoint intervals that passed without their checkpoint since the newest one "
            "this run wrote (or resumed from); 0 while checkpoints land on schedule.",
            registry=r,
        )
        self._checkpoint_interval = 0
        self._checkpointed_iteration = 0
        self.write_failures_total = Counter(
            "navrl_write_failures",
            "Writes of a state-dir file other than checkpoints and the archive that failed "
            "(a failed row is retried with the next one; the export is not).",
            ["file"],
            registry=r,
        )
        for name in WRITTEN_FILES:
            self.write_failures_total.labels(file=name)
        self.archive_bytes_total = Counter(
            "navrl_archive_bytes",
            "Rollout bytes archived, before (raw) and after (stored) compression.",
            ["kind"],
            registry=r,
        )
        self.archive_segments_total = Counter(
            "navrl_archive_segments", "Rollout archive segments written.", registry=r
        )
        self.archive_dropped_total = Counter(
            "navrl_archive_dropped",
            "Rollouts the archiver dropped because it did not keep up.",
            registry=r,
        )
        self.archive_disk_bytes = Gauge(
            "navrl_archive_disk_bytes",
            "Bytes of the rollout archive files in the state dir now.",
            registry=r,
        )
        self.archive_files = Gauge(
            "navrl_archive_files", "Rollout archive files in the state dir now.", registry=r
        )
        self.archive_rotated_files_total = Counter(
            "navrl_archive_rotated_files",
            'Oldest archive files deleted to make room (archive.on_full = "rotate").',
            registry=r,
        )
        self.archive_rotated_bytes_total = Counter(
            "navrl_archive_rotated_bytes",
            'Bytes of the archive files deleted to make room (archive.on_full = "rotate").',
            registry=r,
        )
        self.prefetch_wait_seconds = Histogram(
            "navrl_prefetch_wait_seconds",
            "Time the trainer waited for the next offline batch, in seconds.",
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.prefetch_batches_total = Counter(
            "navrl_prefetch_batches", "Offline batches delivered by the prefetcher.", registry=r
        )

    def _evaluation_metrics(self, r: CollectorRegistry, eval_interval: int) -> None:
        """The last evaluation, its cadence, the curriculum and density levels."""
        self.eval = {
            key: Gauge(
                f"navrl_eval_{name}",
                f"Episodes of the last evaluation: {what}; NaN before the first.",
                registry=r,
            )
            for key, (_, name, what) in _EPISODE_STATS.items()
        }
        self.eval_reach_goal_bounds = {
            bound: Gauge(
                f"navrl_eval_reach_goal_{bound}_ratio",
                f"{what} end of the 95 % interval (Wilson's) of the last evaluation's "
                "reach_goal share, from its episode count: where the policy's own share may "
                "be; NaN before the first.",
                registry=r,
            )
            for bound, what in (("low", "Lower"), ("high", "Upper"))
        }
        self.evaluations_total = Counter("navrl_evaluations", "Evaluations completed.", registry=r)
        self.last_evaluation_timestamp = Gauge(
            "navrl_last_evaluation_timestamp_seconds",
            "Unix time the last evaluation finished; 0 before the first of this process.",
            registry=r,
        )
        Gauge(
            "navrl_eval_interval_iterations",
            "eval.interval: iterations between evaluations (0: evaluation is off).",
            registry=r,
        ).set(eval_interval)
        self.curriculum_stage_gauge = Gauge(
            "navrl_curriculum_stage",
            "Index of the env.curriculum stage the training env is at (0 without one).",
            registry=r,
        )
        self.level_share_gauge = Gauge(
            "navrl_env_level_share",
            "Share of the training envs at each env.navigation.map_levels density level, by "
            "its pillar count (rank 0's envs; absent without map_levels).",
            ["pillars"],
            registry=r,
        )

    def _process_metrics(
        self, r: CollectorRegistry, version: str, torch_version: str, device: str
    ) -> None:
        """The process, its platform, GPU memory, the state dir's disk, the build."""
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        r.register(_GpuMemoryCollector(device))
        self.disk = _StateDirDiskCollector()
        r.register(self.disk)
        Gauge(
            "navrl_build_info",
            "Always 1; the labels say which daemon, torch and device this is.",
            ["version", "torch", "device"],
            registry=r,
        ).labels(version=version, torch=torch_version, device=device).set(1)

    def _nothing_yet(self, stage_phases: Iterable[tuple[str, str]]) -> None:
        """Every gauge that has no value yet reads NaN, and every labelled series is exported
        before its first sample."""
        # "Nothing yet" must not read as a value: no episode is not "every episode failed".
        nothing_yet = [
            *self.episode.values(),
            *self.eval.values(),
            *self.eval_reach_goal_bounds.values(),
        ]
        for gauge in nothing_yet:
            gauge.set(math.nan)
        self._update_gauges(dict.fromkeys(EXPECTED_STATISTICS, math.nan))
        for kind in ("raw", "stored"):
            self.checkpoint_bytes.labels(kind=kind)
            self.archive_bytes_total.labels(kind=kind)
        for stage, phase in stage_phases:
            self.stage_seconds.labels(stage=stage, phase=phase)
            self.stage_busy_ratio.labels(stage=stage)

    # training

    def iteration(
        self,
        *,
        frames_delta: int,
        policy_version: int,
        policy_lag: int,
        losses: dict[str, float],
        now: float | None = None,
    ) -> None:
        """One completed training iteration; `losses`: the update's named statistics, as
        `Learner.update` returns them, each exported by its name (statistics missing from
        it leave their series as they were). `now` is Unix time."""
        self.iterations_total.inc()
        self.frames_total.inc(frames_delta)
        self.policy_version.set(policy_version)
        self.policy_lag.observe(policy_lag)
        self._update_gauges({k: v for k, v in losses.items() if k not in _COUNTED})
        self.kl_stopped_steps_total.inc(losses.get("kl_stopped_steps", 0))
        self.nonfinite_updates_total.inc(losses.get("nonfinite_updates", 0))
        self.last_iteration_timestamp.set(time.time() if now is None else now)
        if self._checkpoint_interval:
            behind = (policy_version - self._checkpointed_iteration) // self._checkpoint_interval
            self.checkpoint_missed_intervals.set(max(0, behind - 1))  # one may be in flight
        at = self._clock()
        if self._last_iteration_at is not None and at > self._last_iteration_at:
            # Iteration to iteration; the first one also timed start-up, so it sets none.
            self.frames_per_second.set(frames_delta / (at - self._last_iteration_at))
        self._last_iteration_at = at

    def _update_gauges(self, stats: dict[str, float]) -> None:
        """The update's statistics by name: loss terms as navrl_loss{term}, gradient norms
        as navrl_grad_norm{group}, the rest under their own series or
        navrl_update_statistic{name}."""
        for term, value in loss_terms(stats).items():
            self.loss.labels(term=term).set(value)
        for group, value in grad_norms(stats).items():
            self.grad_norm.labels(group=group).set(value)
        for name, value in other_statistics(stats).items():
            own = self._own_series.get(name)
            (own or self.update_statistic.labels(name=name)).set(value)

    def episodes(self, stats: dict[str, float]) -> None:
        """Means of the training episodes finished in a window (`EpisodeStats.take()`);
        an empty dict (none finished) leaves the last values."""
        _set_means(self.episode, stats)

    def rollback(self) -> None:
        self.rollbacks_total.inc()

    # pipeline

    def stage_time(self, stage: str, phase: str, seconds: float) -> None:
        self.stage_seconds.labels(stage=stage, phase=phase).observe(seconds)

    def stage_busy(self, stage: str, ratio: float) -> None:
        self.stage_busy_ratio.labels(stage=stage).set(ratio)

    def set_state(self, state: str) -> None:
        """One of STATES (a `supervisor.State` will do)."""
        if state not in STATES:
            raise ValueError(f"unknown daemon state {state!r}; expected one of {STATES}")
        for name in STATES:
            self.daemon_state.labels(state=name).set(1 if name == state else 0)

    def watch_channel(self, channel: WatchedChannel) -> None:
        """Export the channel's depth, capacity, blocked time and drops, read at scrape time."""
        self.queues.add_channel(channel)

    def watch_pool(self, pool: WatchedPool) -> None:
        """Export the lease pool's free buffers and acquire wait, read at scrape time."""
        self.queues.add_pool(pool)

    # checkpoints, archive, prefetch

    def checkpoint_schedule(self, interval: int, iteration: int) -> None:
        """Checkpoints are due every `interval` iterations (0: none); the run starts from
        a checkpoint of `iteration` (0: a new run)."""
        self._checkpoint_interval = interval
        self._checkpointed_iteration = iteration

    def checkpoint_written(
        self,
        seconds: float,
        raw_bytes: int,
        stored_bytes: int,
        iteration: int | None = None,
        now: float | None = None,
    ) -> None:
        if iteration is not None:
            self._checkpointed_iteration = max(self._checkpointed_iteration, iteration)
            self.checkpoint_missed_intervals.set(0)
        self.checkpoint_write_seconds.observe(seconds)
        self.checkpoint_size(raw_bytes, stored_bytes)
        self.checkpoint_last_success_timestamp.set(time.time() if now is None else now)
        self._last_checkpoint_at = self._clock()

    def checkpoint_size(self, raw_bytes: int, stored_bytes: int) -> None:
        """The newest checkpoint's size before and after compression."""
        self.checkpoint_bytes.labels(kind="raw").set(raw_bytes)
        self.checkpoint_bytes.labels(kind="stored").set(stored_bytes)

    def resumed_from(self, raw_bytes: int, stored_bytes: int, created: float) -> None:
        """Until this run writes one, the checkpoint it resumed from is the newest: its size
        and time (no 0/0 compression ratio, no empty last-checkpoint panel)."""
        self.checkpoint_size(raw_bytes, stored_bytes)
        self.checkpoint_last_success_timestamp.set(created)

    def checkpoint_stall(self, seconds: float) -> None:
        self.checkpoint_stall_seconds.observe(seconds)

    def checkpoint_failed(self) -> None:
        self.checkpoint_failures_total.inc()

    def mirror_written(self, when: float | None = None) -> None:
        """A point written now, or (`when`: a resume) the mirror's current one then."""
        self.mirror_last_success_timestamp.set(time.time() if when is None else when)

    def mirror_failed(self) -> None:
        self.mirror_failures_total.inc()

    def write_failed(self, file: str) -> None:
        """`file`: one of WRITTEN_FILES."""
        self.write_failures_total.labels(file=file).inc()

    def archive_written(self, raw_bytes: int, stored_bytes: int, segments: int = 1) -> None:
        self.archive_bytes_total.labels(kind="raw").inc(raw_bytes)
        self.archive_bytes_total.labels(kind="stored").inc(stored_bytes)
        self.archive_segments_total.inc(segments)

    def archive_dropped(self, count: int = 1) -> None:
        self.archive_dropped_total.inc(count)

    def archive_rotated(self, files: int, nbytes: int) -> None:
        self.archive_rotated_files_total.inc(files)
        self.archive_rotated_bytes_total.inc(nbytes)

    def archive_usage(self, usage: ArchiveUsageLike) -> None:
        """The archive directory's files and bytes (storage.archive_retention.ArchiveUsage)."""
        self.archive_files.set(usage.files)
        self.archive_disk_bytes.set(usage.bytes)

    def prefetch_wait(self, seconds: float) -> None:
        self.prefetch_wait_seconds.observe(seconds)

    def prefetch_batch(self, count: int = 1) -> None:
        self.prefetch_batches_total.inc(count)

    # evaluation

    def evaluation(self, result: dict[str, float], now: float | None = None) -> None:
        """One finished evaluation (`rl.evaluate.evaluate`'s result)."""
        _set_means(self.eval, result)
        interval = interval_of(result.get("reach_goal"), result.get("episodes"))
        for gauge, bound in zip(
            self.eval_reach_goal_bounds.values(), interval or (math.nan, math.nan), strict=True
        ):
            gauge.set(bound)
        self.evaluations_total.inc()
        self.last_evaluation_timestamp.set(time.time() if now is None else now)

    def watch_state_dir(self, path: str) -> None:
        """Export the free space of the state dir's file system, read at scrape time."""
        self.disk.path = path

    def curriculum_stage(self, stage: int) -> None:
        self.curriculum_stage_gauge.set(stage)

    def level_shares(self, pillars: list[int], shares: list[float]) -> None:
        for count, share in zip(pillars, shares, strict=True):
            self.level_share_gauge.labels(pillars=str(count)).set(share)

    def _age(self, since: float | None) -> float:
        return self._clock() - (self._started if since is None else since)

    # exposition

    def render(self) -> bytes:
        """The registry in the Prometheus text format (`CONTENT_TYPE_LATEST`)."""
        return generate_latest(_WithoutCreated(self.registry))


def _set_means(gauges: dict[str, Gauge], stats: dict[str, float]) -> None:
    for key, gauge in gauges.items():
        if key in stats:
            gauge.set(stats[key])


class _QueueCollector(Collector):
    """Channel and lease-pool series, read from the objects themselves at scrape time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channels: dict[str, WatchedChannel] = {}
        self._pools: dict[str, WatchedPool] = {}

    def add_channel(self, channel: WatchedChannel) -> None:
        name = channel.stats.name
        with self._lock:
            if name in self._channels:
                raise ValueError(f"a channel named {name!r} is already watched")
            self._channels[name] = channel

    def add_pool(self, pool: WatchedPool) -> None:
        with self._lock:
            if pool.name in self._pools:
                raise ValueError(f"a lease pool named {pool.name!r} is already watched")
            self._pools[pool.name] = pool

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        depth, capacity, blocked, dropped, free, wait = families = self._families()
        with self._lock:
            channels, pools = list(self._channels.values()), list(self._pools.values())
        for channel in channels:
            stats = channel.stats
            depth.add_metric([stats.name], stats.depth)
            capacity.add_metric([stats.name], stats.capacity)
            blocked.add_metric([stats.name], stats.blocked_seconds)
            dropped.add_metric([stats.name], stats.dropped)
        for pool in pools:
            free.add_metric([pool.name], pool.free)
            wait.add_metric([pool.name], pool.waiting_seconds)
        return iter(families)

    @staticmethod
    def _families() -> tuple[Metric, ...]:
        queue, pool = ["queue"], ["pool"]
        return (
            GaugeMetricFamily("navrl_queue_depth", "Items waiting in a channel.", labels=queue),
            GaugeMetricFamily(
                "navrl_queue_capacity",
                "Items a channel holds before its overflow policy applies.",
                labels=queue,
            ),
            CounterMetricFamily(
                "navrl_queue_blocked_seconds",
                "Time senders spent waiting on a full channel, in seconds.",
                labels=queue,
            ),
            CounterMetricFamily(
                "navrl_queue_dropped",
                "Items a channel dropped under its overflow policy.",
                labels=queue,
            ),
            GaugeMetricFamily(
                "navrl_lease_pool_free", "Rollout buffers free in a lease pool.", labels=pool
            ),
            CounterMetricFamily(
                "navrl_lease_wait_seconds",
                "Time spent waiting for a free buffer of a lease pool, in seconds.",
                labels=pool,
            ),
        )


class _GpuMemoryCollector(Collector):
    """torch.cuda's allocated and reserved bytes on the daemon's device, and the device's
    own used and total bytes (every process on it: cudaMemGetInfo); 0 when it is not a
    CUDA device or CUDA is not initialised yet."""

    KINDS = ("allocated", "reserved", "device_used", "device_total")

    def __init__(self, device: str) -> None:
        self.device = device

    def describe(self) -> Iterator[Metric]:
        return iter([self._family()])

    def collect(self) -> Iterator[Metric]:
        values = dict.fromkeys(self.KINDS, 0)
        # Never import torch or initialise CUDA from a scrape: the first takes seconds and
        # the second would create a CUDA context in the HTTP thread of a CPU run.
        torch = sys.modules.get("torch")
        if self.device.startswith("cuda") and torch is not None and torch.cuda.is_initialized():
            try:
                free, total = torch.cuda.mem_get_info(self.device)
                values.update(
                    allocated=torch.cuda.memory_allocated(self.device),
                    reserved=torch.cuda.memory_reserved(self.device),
                    device_used=total - free,
                    device_total=total,
                )
            except RuntimeError:
                values = dict.fromkeys(self.KINDS, 0)  # the device went away; the log says why
        family = self._family()
        for kind, value in values.items():
            family.add_metric([kind], value)
        return iter([family])

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "navrl_gpu_memory_bytes",
            "GPU memory of the daemon's device: held by torch tensors (allocated) and by "
            "torch's caching allocator (reserved), used by every process on the device "
            "(device_used) and its size (device_total), in bytes.",
            labels=["kind"],
        )


class _StateDirDiskCollector(Collector):
    """Free bytes on the state dir's file system (what a non-root process may still write,
    as the archiver's free-space guard counts it), read with statvfs at scrape time; no
    sample until the state dir is known."""

    def __init__(self) -> None:
        self.path: str | None = None

    def describe(self) -> Iterator[Metric]:
        return iter([self._family()])

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        if self.path is not None:
            try:
                st = os.statvfs(self.path)
            except OSError:
                pass  # the dir went away: no sample, and the log of the failing write says why
            else:
                family.add_metric([], st.f_bavail * st.f_frsize)
        return iter([family])

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "navrl_state_dir_free_bytes",
            "Free bytes on the file system of the state dir (checkpoints, archive, history).",
        )


class _WithoutCreated(Collector):
    """The registry minus the `*_created` samples: the text format has no place for them, so
    they would show up as extra gauges (navrl_frames_created, ...) that nothing reads."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self.registry.collect():
            created = metric.name + "_created"
            metric.samples = [s for s in metric.samples if s.name != created]
            yield metric
