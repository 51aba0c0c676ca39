"""`pipeline.trainer_stream`: the trainer's GPU work on a stream of its own (issue #22).

On a CPU the option changes nothing (there are no streams): the same run, bit for bit.
On CUDA: at lag 0 the run is the one without the option (every hand-over is ordered by
events and synchronizes), and at lag 1 the trainer's update and the next captured rollout
run side by side without a crash or a non-finite loss. The CUDA cases run in the GPU
session (benchmarks/device/gpu_session.sh)."""

from __future__ import annotations

import math
from pathlib import Path

import anyio
import pytest
import torch

from navrl_daemon.config import Config, load_config
from navrl_daemon.ops.progress import IterationRecord
from navrl_daemon.pipeline.daemon import serve
from navrl_daemon.storage.policy_file import load_policy_state
from tests.conftest import TINY, trainer_for

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")


def config(device: str, *extra: str) -> Config:
    return load_config(
        None,
        [
            *TINY,
            f"run.device={device}",
            "run.total_frames=512",  # TINY: 64 frames per iteration → 8 iterations
            "eval.interval=0",
            "checkpoint.interval=4",
            *extra,
        ],
        environ={},
    )


def run(cfg: Config, state: Path) -> tuple[dict[str, torch.Tensor], list[IterationRecord]]:
    records: list[IterationRecord] = []
    anyio.run(serve, cfg, state, records.append)
    return load_policy_state(state / "export" / "policy.pt"), records


def same_runs(device: str, tmp_path: Path, *extra: str, exact: bool) -> None:
    a, a_records = run(config(device, *extra), tmp_path / "plain")
    b, b_records = run(config(device, *extra, "pipeline.trainer_stream=true"), tmp_path / "s")
    assert len(a_records) == len(b_records) == 8
    assert a.keys() == b.keys() and a
    for key in a:
        if exact:
            assert torch.equal(a[key], b[key]), key
        else:
            torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=1e-5, msg=key)


def test_on_a_cpu_the_option_changes_nothing(tmp_path: Path) -> None:
    same_runs("cpu", tmp_path, exact=True)


@CUDA
def test_cuda_lag_0_with_the_trainer_stream_is_the_run_without(tmp_path: Path) -> None:
    paths = ("env.collect_path=cuda_graph", "ppo.update_path=cuda_graph")
    same_runs("cuda", tmp_path, *paths, exact=False)


@CUDA
def test_cuda_lag_1_with_the_trainer_stream_trains_beside_the_next_rollout(
    tmp_path: Path,
) -> None:
    cfg = config(
        "cuda",
        "env.collect_path=cuda_graph",
        "ppo.update_path=cuda_graph",
        "pipeline.max_policy_lag=1",
        "pipeline.trainer_stream=true",
    )
    _, records = run(cfg, tmp_path)
    assert len(records) == 8
    assert max(r.policy_lag for r in records) == 1
    for r in records:
        assert all(math.isfinite(v) for k, v in r.losses.items() if k != "rolled_back"), r.losses


def test_the_hand_overs_of_a_trainer_with_its_own_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Part of the protocol the CUDA tests exercise on a GPU, checked here on its calls: the
    update waits for the rollout's event (not the whole producer stream), and the stream is
    synchronized before weights are handed out."""
    from contextlib import nullcontext

    from navrl_daemon.rl.training import Training
    from navrl_daemon.runtime.compute import ComputeThread
    from navrl_daemon.runtime.streams import TrainerStream
    from tests.runtime.test_streams import FakeStream

    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: nullcontext())
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: "producer's")
    training = Training.build(config("cpu"), "cpu")
    compute = ComputeThread()
    trainer = trainer_for(training, compute, stream=TrainerStream(FakeStream(calls)))  # type: ignore[arg-type]
    try:
        training.collector.collect(training.buffer)
        trainer._update(training.buffer, None, "rollout 0")  # type: ignore[arg-type]
        assert calls[0] == "wait_event rollout 0"
        calls.clear()
        trainer._update(training.buffer)  # no event (an offline caller): the whole stream
        assert calls[0] == "wait_stream producer's"
        calls.clear()
        weights = trainer._weights()
        assert calls == ["synchronize"] and weights.keys() == training.policy.state_dict().keys()
    finally:
        compute.close()
