"""A week unattended: clocks and counters.

Wall clock vs monotonic clock: NTP may step `time.time()` by hours on a machine that runs
for weeks. Ages, stalls and the watchdog must not notice; here `time.time` is faked to
jump while the monotonic clock goes on as it does.

Counters: a week at 300k frames/s is ~1.8e11 frames and, at NavRL's 1024 envs x 32 steps
per iteration, ~5.5e6 iterations; every field that counts them keeps them exact.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from pathlib import Path

import anyio
import numpy as np
import pytest
import torch

from navrl_daemon.config import load_config
from navrl_daemon.ops.http import Health
from navrl_daemon.ops.metrics import Metrics
from navrl_daemon.pipeline.telemetry import Telemetry
from navrl_daemon.runtime.sd_notify import ProgressWatchdog, SystemdNotifier
from navrl_daemon.storage.archive import (
    ArchiveFile,
    ArchiveWriter,
    Schema,
    archive_files,
    archive_name,
    encode_segments,
)
from navrl_daemon.storage.checkpoint import CheckpointDir, encode_checkpoint, parse_header
from navrl_daemon.storage.history import HISTORY_FILE
from tests.conftest import TINY

WEEK_S = 7 * 24 * 3600
WEEK_FRAMES = 300_000 * WEEK_S  # 181_440_000_000
WEEK_ITERATIONS = WEEK_FRAMES // (1024 * 32)  # NavRL's 1024 envs x 32 steps: ~5.5e6
STEP_S = 3 * 3600.0  # an NTP step of three hours


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=[-STEP_S, STEP_S], ids=["back", "ahead"])
def wall_step(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """Call the returned function to step the wall clock; monotonic time is untouched."""
    real = time.time

    def step() -> None:
        monkeypatch.setattr(time, "time", lambda: real() + request.param)

    return step


# ---------------------------------------------------------------------------- clocks


def test_metric_ages_ignore_a_wall_clock_step(wall_step) -> None:
    m = Metrics(version="0", torch_version=torch.__version__, device="cpu")
    m.iteration(frames_delta=2048, policy_version=1, policy_lag=0, losses={})
    m.checkpoint_written(0.1, 100, 50)
    wall_step()
    for name in ("navrl_last_iteration_age_seconds", "navrl_checkpoint_age_seconds"):
        age = m.registry.get_sample_value(name)
        assert age is not None and 0 <= age < 5, (name, age)


def test_history_checkpoint_age_ignores_a_wall_clock_step(tmp_path: Path, wall_step) -> None:
    telemetry = Telemetry(load_config(None, [*TINY, "metrics.enabled=false"]), "cpu")
    try:
        telemetry.run_starts(tmp_path, 0, 0)
        telemetry.checkpoint_written(0.1, 100, 50, 0)
        wall_step()
        telemetry.summary(
            {"iteration": 5, "frames": 320, "frames_per_second": 100.0, "busy": {}, "phases": {}}
        )
    finally:
        telemetry.close()
    row = json.loads((tmp_path / HISTORY_FILE).read_text().splitlines()[-1])
    assert 0 <= row["checkpoint_age_s"] < 5, row


def test_health_ignores_a_wall_clock_step(wall_step) -> None:
    health = Health(stall_after_s=60.0)
    health.set_state("running")
    health.iteration_done()
    wall_step()
    status, body = health.check()
    assert status == 200 and 0 <= body["last_iteration_age_s"] < 5, body


@pytest.mark.anyio
async def test_the_watchdog_pings_through_a_wall_clock_step(tmp_path: Path, wall_step) -> None:
    manager = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # systemd's end
    manager.bind(str(tmp_path / "notify.sock"))
    manager.setblocking(False)
    notifier = SystemdNotifier(
        {"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "100000"}
    )
    watchdog = ProgressWatchdog(notifier)
    pings = [0, 0]  # before and after the step
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(watchdog.run)
            for i in range(40):  # 0.4 s of training, the wall clock steps half-way
                if i == 20:
                    wall_step()
                watchdog.progress()
                await anyio.sleep(0.01)
                with contextlib.suppress(BlockingIOError):
                    while manager.recv(64) == b"WATCHDOG=1":
                        pings[i >= 20] += 1
            tg.cancel_scope.cancel()
    finally:
        notifier.close()
        manager.close()
    assert pings[0] >= 2 and pings[1] >= 2, pings


# ---------------------------------------------------------------------------- counters


def test_a_week_of_frames_is_exact_in_the_prometheus_counters() -> None:
    m = Metrics(version="0", torch_version=torch.__version__, device="cpu")
    m.frames_total.inc(WEEK_FRAMES - 2048)  # a week's frames so far, then one more iteration
    m.iteration(frames_delta=2048, policy_version=WEEK_ITERATIONS, policy_lag=0, losses={})
    assert m.registry.get_sample_value("navrl_frames_total") == WEEK_FRAMES
    assert m.registry.get_sample_value("navrl_policy_version") == WEEK_ITERATIONS
    assert float(WEEK_FRAMES * 1000) < 2**53  # even a thousand weeks stay exact


def test_checkpoint_headers_and_names_hold_a_week_and_far_beyond(tmp_path: Path) -> None:
    directory = CheckpointDir(tmp_path)
    for iteration, frames in [(WEEK_ITERATIONS, WEEK_FRAMES), (10**10, 2**62)]:
        data = encode_checkpoint(
            {"w": torch.zeros(2)}, iteration=iteration, frames=frames, policy_version=iteration
        )
        header = parse_header(data)
        assert (header.iteration, header.frames, header.policy_version) == (
            iteration,
            frames,
            iteration,
        )
        directory.write(data, iteration)
    # Past ckpt-999999999 the names grow a digit; files still sort by iteration.
    assert [p.name for p in directory.files()] == ["ckpt-005537109.nrc", "ckpt-10000000000.nrc"]


def test_archive_index_fields_hold_a_week_and_far_beyond(tmp_path: Path) -> None:
    arrays = {"x": np.arange(16, dtype=np.float32).reshape(1, 4, 4)}
    schema = Schema.for_rollout(arrays)
    big = 2**40  # iterations and policy versions far past a week's 5.5e6
    writer = ArchiveWriter(tmp_path / archive_name(1_000_000), schema)  # a 7-digit sequence
    writer.append(encode_segments(schema, arrays, [0], iteration=big, policy_version=big + 1))
    writer.close()
    (path,) = archive_files(tmp_path)
    with ArchiveFile.open(path) as f:
        assert f.rows["iteration"].dtype == np.int64 and int(f.rows["iteration"][0]) == big
        assert int(f.rows["policy_version"][0]) == big + 1
        assert f.rows["raw_bytes"].dtype == np.int64 and f.rows["offset"].dtype == np.uint64


def test_adams_float32_step_stops_at_2_24_and_the_update_does_not_change() -> None:
    """torch keeps Adam's step count as a float32 tensor: past 2**24 steps (262,144 NavRL
    iterations of 4 epochs x 16 minibatches, hours into a week) it stops counting. The
    bias corrections 1 - beta**step are exactly 1 long before, so the update is the
    same as with an exact count: nothing to fix, but nothing may read that count."""
    steps = torch.tensor(2.0**24, dtype=torch.float32)
    assert steps + 1 == steps  # the counter is stuck
    updates = []
    for step in (2.0**24, 2.0**40):
        p = torch.nn.Parameter(torch.ones(3))
        opt = torch.optim.Adam([p], lr=1e-3)
        p.grad = torch.tensor([0.5, -1.0, 2.0])
        opt.step()  # creates the state
        state = opt.state[p]
        state["step"] = torch.tensor(step, dtype=torch.float64 if step > 2**24 else torch.float32)
        before = p.detach().clone()
        opt.step()
        updates.append(p.detach() - before)
    assert torch.equal(updates[0], updates[1])
