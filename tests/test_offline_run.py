"""Offline objectives through the real daemon: `run` with `offline.objective = "bc"` on a
synthetic dataset ends at `offline.steps` with exit 0, a checkpoint and an export, and the
exported policy clones the dataset's known policy; bad data stops it with exit 65 before
any training, leaving no process behind; SIGTERM writes a final checkpoint and a restart
continues exactly where the interrupted run was; "ppo+bc" trains PPO with a logged BC
term from rollout archives, and "bc" from archives trains and evaluates the NavRL policy.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import time
import uuid
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from navrl_daemon.config import load_config
from navrl_daemon.offline.bc import ImageJointPolicy, mse_bc_loss
from navrl_daemon.offline.dataset_synth import SynthSpec, write_synth
from navrl_daemon.offline.datasets import ImageReader, MultimodalDataset
from navrl_daemon.offline.trainer import StepRecord
from navrl_daemon.offline.wiring import OfflineProgress
from navrl_daemon.pipeline.telemetry import Telemetry
from navrl_daemon.rl.training import Training
from navrl_daemon.storage.archive import archive_name
from navrl_daemon.storage.checkpoint import load_checkpoint
from navrl_daemon.testing import forked
from tests.conftest import TINY
from tests.offline.test_prefetcher import archive_rollouts

SIZE = 16  # prefetch.image_size


def offline_args(data: Path | str, *extra: str) -> list[str]:
    return [
        "run.device=cpu",
        "metrics.port=0",
        "eval.interval=0",
        "offline.objective=bc",
        f'prefetch.paths=["{data}"]',
        f"prefetch.image_size={SIZE}",
        "prefetch.batch_size=32",
        "prefetch.depth=2",
        "prefetch.workers=2",
        "offline.lr=2e-3",
        "log.summary_interval=25",
        *extra,
    ]


class Run:
    """A `navrl-daemon run` process (navrl_daemon/testing/forked.py), tagged so that every
    process it starts (prefetch workers, resource tracker) can be found afterwards by the tag in its
    environment."""

    def __init__(self, state: Path, *args: str) -> None:
        self.tag = f"NAVRL_TEST_TAG_{uuid.uuid4().hex}"
        self.proc = forked.start(
            ["run", "--state-dir", str(state), *args],
            env={self.tag: "1"},
            stderr=subprocess.PIPE,
            text=True,
        )
        self.events: list[dict] = []

    def wait_for(self, event: str, count: int = 1) -> None:
        assert self.proc.stderr is not None
        seen = 0
        for line in self.proc.stderr:
            if line.startswith("{"):
                self.events.append(json.loads(line))
                seen += self.events[-1]["event"] == event
                if seen == count:
                    return
        raise AssertionError(f"daemon ended before {event!r}: {self.events[-5:]}")

    def finish(self, timeout: float = 120) -> tuple[int, str]:
        assert self.proc.stderr is not None
        rest = self.proc.stderr.read()
        code = self.proc.wait(timeout=timeout)
        self.events += [json.loads(x) for x in rest.splitlines() if x.startswith("{")]
        return code, rest

    def of(self, event: str) -> list[dict]:
        return [e for e in self.events if e["event"] == event]

    def leftovers(self, grace_s: float = 5.0) -> list[str]:
        """Processes still alive that inherited this run's tag (after `grace_s` for the
        resource tracker, which exits once it has seen its parent go)."""
        deadline = time.monotonic() + grace_s
        while True:
            found = []
            for environ in Path("/proc").glob("[0-9]*/environ"):
                try:
                    if self.tag.encode() not in environ.read_bytes():
                        continue
                    stat = (environ.parent / "stat").read_text()
                    cmdline = (environ.parent / "cmdline").read_bytes()
                except OSError:
                    continue
                if stat.rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(f"{environ.parent.name}: {cmdline.split(bytes(1))!r}")
            if not found or time.monotonic() > deadline:
                return found
            time.sleep(0.2)


def complete(state: Path, *args: str) -> Run:
    run = Run(state, *args)
    code, rest = run.finish()
    assert code == 0, rest[-3000:]
    assert not run.leftovers()
    return run


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("offline")
    out = {"train": root / "train.h5", "test": root / "test.h5"}
    write_synth(out["train"], SynthSpec(samples=600, height=24, width=24, seed=0))
    write_synth(out["test"], SynthSpec(samples=200, height=24, width=24, seed=1))
    return out


def held_out(path: Path) -> dict[str, torch.Tensor]:
    data = MultimodalDataset.load([path])
    reader = ImageReader(data.files, data.offsets, size=SIZE, cache_bytes=1 << 20)
    images = torch.empty((len(data), 3, 3, SIZE, SIZE), dtype=torch.uint8)
    reader.read_into(np.arange(len(data)), images)
    reader.close()
    return {**data.lowdim(np.arange(len(data))), "images": images}


def normalised_error(state: dict[str, torch.Tensor] | None, test: dict[str, torch.Tensor]) -> float:
    """Held-out MSE on normalised actions of an exported ImageJointPolicy (None: untrained)."""
    mean, std = test["action"].mean(0), test["action"].std(0)
    torch.manual_seed(0)
    policy = ImageJointPolicy(16, 4, mean, std)
    if state is not None:
        policy.load_state_dict(state)
    with torch.no_grad():
        return float(mse_bc_loss(policy, test))  # type: ignore[arg-type]


def test_bc_run_ends_at_offline_steps_with_checkpoint_export_and_a_learned_policy(
    data: dict[str, Path], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    run = complete(
        state, *offline_args(data["train"], "offline.steps=300", "checkpoint.interval=100")
    )
    written = run.of("checkpoint written")
    assert [e["iteration"] for e in written] == [100, 200, 300]
    assert run.of("stopped") and run.of("offline data checked")[0]["transitions"] == 600
    header, ckpt = load_checkpoint(state / "checkpoints" / "ckpt-000000300.nrc")
    assert (header.iteration, header.frames) == (300, 300 * 32)
    assert ckpt["kind"] == "offline" and ckpt["offline"]["steps"] == 300
    progress = run.of("progress")
    assert [p["iteration"] for p in progress] == [25 * k for k in range(1, 13)]
    assert all(0 <= p["data_wait_ratio"] <= 1 for p in progress)
    assert np.mean([p["bc_loss"] for p in progress[-2:]]) < 0.3 * progress[0]["bc_loss"]
    rows = [json.loads(x) for x in (state / "history.jsonl").read_text().splitlines()]
    assert rows[-1]["iteration"] == 300 and "data_wait_s" in rows[-1]

    exported = torch.load(state / "export" / "image_joint_policy.pt", weights_only=True)
    test = held_out(data["test"])
    untrained, trained = normalised_error(None, test), normalised_error(exported, test)
    print(f"held-out normalised action MSE: untrained {untrained:.3f}, after BC {trained:.3f}")
    assert trained < 0.3 * untrained and trained < 0.3  # predicting the mean scores ~1

    # Started again, the finished run says so and writes nothing (export, config, history).
    def files() -> dict[str, tuple[int, int]]:
        found = (p for p in state.rglob("*") if p.is_file() and p.name != "lock")
        return {str(p.relative_to(state)): (p.stat().st_mtime_ns, p.stat().st_size) for p in found}

    before = files()
    again = complete(
        state, *offline_args(data["train"], "offline.steps=300", "checkpoint.interval=100")
    )
    assert files() == before
    assert again.of("run already finished: nothing trained, nothing written")
    assert not again.of("checkpoint written") and not again.of("policy exported")


def test_offline_step_exports_bc_loss_and_data_wait_to_prometheus() -> None:
    cfg = load_config(overrides=["metrics.enabled=false"])
    telemetry = Telemetry(cfg, torch.device("cpu"))
    progress = OfflineProgress(telemetry, summary_interval=2, batch_size=32)
    for step, loss in ((1, 0.9), (2, 0.5)):
        stats = {"bc_loss": loss, "grad_norm": 1.0, "skipped": 0.0}
        progress(StepRecord(step, 32 * step, step_s=0.01, wait_s=0.002, stats=stats))
    sample = telemetry.metrics.registry.get_sample_value
    assert sample("navrl_loss", {"term": "bc"}) == 0.5
    assert sample("navrl_prefetch_wait_seconds_count") == 2
    assert sample("navrl_prefetch_wait_seconds_sum") == pytest.approx(0.004)
    assert sample("navrl_iterations_total") == 2 and sample("navrl_frames_total") == 64
    telemetry.close()


def _missing_key(path: Path) -> str:
    with h5py.File(path, "a") as f:
        del f["observations/global_image"]
    return "/observations/global_image"


def _nan_actions(path: Path) -> str:
    with h5py.File(path, "a") as f:
        f["actions"][7, 2] = np.nan
    return "/actions"


def _truncated(path: Path) -> str:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return "cannot open"


@pytest.mark.parametrize("damage", [_missing_key, _nan_actions, _truncated])
def test_bad_dataset_exits_65_naming_file_and_key_before_training(
    damage, data: dict[str, Path], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.h5"
    bad.write_bytes(data["train"].read_bytes())
    key = damage(bad)
    run = Run(tmp_path / "state", *offline_args(bad, "offline.steps=50"))
    code, rest = run.finish()
    assert code == 65, rest[-2000:]
    message = rest.strip().splitlines()[-1]
    assert str(bad) in message and key in message
    if damage is not _truncated:
        assert "expected" in message and "found" in message
    assert not run.of("prefetching") and not run.of("progress")  # nothing started
    assert not (tmp_path / "state" / "checkpoints").exists()
    assert not run.leftovers()


def test_sigterm_writes_a_final_checkpoint_and_a_restart_continues_exactly(
    data: dict[str, Path], tmp_path: Path
) -> None:
    common = offline_args(data["train"], "checkpoint.interval=1000", "prefetch.workers=1")
    run = Run(tmp_path / "a", *common)  # offline.steps = 0: until a signal
    run.wait_for("progress")
    run.proc.send_signal(signal.SIGTERM)
    code, rest = run.finish()
    assert code == 0, rest[-2000:]
    assert not run.leftovers()
    final = run.of("checkpoint written")[-1]
    n = final["iteration"]
    assert final["final"] and n >= 25
    assert run.of("policy exported")[0]["steps"] == n

    total = f"offline.steps={n + 25}"
    resumed = complete(tmp_path / "a", *common, total)
    start = resumed.of("resumed from checkpoint")[0]
    assert (start["iteration"], start["frames"]) == (n, n * 32)
    assert resumed.of("checkpoint written")[-1]["iteration"] == n + 25
    complete(tmp_path / "b", *common, total)  # the same steps, uninterrupted
    a, b = (
        torch.load(tmp_path / d / "export" / "image_joint_policy.pt", weights_only=True)
        for d in ("a", "b")
    )
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rollouts of the TINY task, archived as the daemon's archiver writes them."""
    path = tmp_path_factory.mktemp("archive") / archive_name(0)
    training = Training.build(load_config(None, TINY), "cpu")
    return archive_rollouts(training, path)


def test_ppo_plus_bc_logs_a_bc_term_and_an_offline_run_refuses_its_state_dir(
    archive: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    args = [*TINY, "eval.interval=0", "run.total_frames=256", "offline.objective=ppo+bc"]
    args += ["prefetch.layout=archive", f'prefetch.paths=["{archive}"]', "prefetch.batch_size=64"]
    run = complete(state, *args)
    progress = run.of("progress")
    assert [p["iteration"] for p in progress] == [1, 2, 3, 4]
    assert all(math.isfinite(p["bc_loss"]) for p in progress)
    assert run.of("checkpoint written")[-1]["iteration"] == 4

    # The state dir now holds an online run's checkpoints: an offline run does not take them.
    refused = Run(state, *offline_args(archive, "prefetch.layout=archive", "offline.steps=5"))
    code, rest = refused.finish()
    assert code == 65 and "does not fit this run" in rest and "takes 'offline'" in rest


def test_bc_from_rollout_archives_trains_evaluates_and_exports_the_navrl_policy(
    archive: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    args = offline_args(archive, "prefetch.layout=archive", "offline.steps=30")
    run = complete(state, *TINY, *args, "eval.interval=15", "prefetch.batch_size=64")
    assert [e["iteration"] for e in run.of("evaluation")] == [1, 15, 30]
    assert run.of("policy exported")[0]["kind"] == "navigation"
    exported = torch.load(state / "export" / "policy.pt", weights_only=True)
    assert set(exported) == set(Training.build(load_config(None, TINY), "cpu").policy.state_dict())
