"""The prefetcher: batches equal a direct h5py read plus resize of the same indices and
the RAM-resident low-dim data; the same seed gives the same batches whatever the number
of workers; no worker process and no shared-memory slot outlives `close()`, a killed or
terminated parent, or a bad file; a dead worker is an error, not a hang."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from navrl_daemon.errors import DataError
from navrl_daemon.offline.dataset_synth import SynthSpec, write_synth
from navrl_daemon.offline.datasets import MultimodalDataset
from navrl_daemon.offline.prefetch import BatchSchedule, Prefetcher
from tests.conftest import REPO
from tests.offline.test_datasets import direct_images


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("prefetch")
    a, b = root / "a.h5", root / "b.h5"
    write_synth(a, SynthSpec(samples=40, layout="A", height=20, width=24))
    write_synth(
        b,
        SynthSpec(samples=30, layout="B", image_format="CHW", height=16, width=16,
                  wrist_aliases=True, chunk_rows=4, seed=1),
    )  # fmt: skip
    return [a, b]


def alive(pid: int) -> bool:
    """Running, and not a zombie waiting for a (container) init to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def children() -> set[int]:
    """Live child processes of this one, but multiprocessing's resource tracker (one per
    process, started with the first shared-memory block and meant to outlive it)."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            cmdline = (stat.parent / "cmdline").read_bytes()
            if b"resource_tracker" not in cmdline:
                out.add(int(stat.parent.name))
    return out


def wait_until(condition, timeout: float = 15.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_batches_match_direct_reads_then_close_leaves_nothing(paths: list[Path]) -> None:
    data = MultimodalDataset.load(paths)
    before = children()
    with Prefetcher(data, batch_size=12, depth=2, workers=2, image_size=10, seed=5) as pf:
        assert len(pf.pids) == 2 and set(pf.pids) <= children()
        names = pf.slot_names
        assert all(Path("/dev/shm", n).exists() for n in names)
        seen = []
        for _ in range(7):  # 84 > 70 transitions: crosses into the second epoch
            batch = pf.next()
            idx = batch["index"].numpy()
            assert batch["images"].shape == (12, 3, 3, 10, 10)
            assert batch["images"].dtype == torch.uint8
            assert (np.diff(idx) >= 0).all()
            for row, i in enumerate(idx):
                path, local = (paths[0], i) if i < 40 else (paths[1], i - 40)
                assert torch.equal(batch["images"][row], direct_images(path, int(local), 10))
            np.testing.assert_array_equal(batch["action"].numpy(), data.actions[idx])
            np.testing.assert_array_equal(batch["joint"].numpy(), data.joint[idx])
            np.testing.assert_array_equal(batch["next_joint"].numpy(), data.next_joint[idx])
            seen.extend(idx.tolist())
        assert set(seen) == set(range(70))  # every transition served in the first epoch
        assert pf.stats().batches == 7
        pids = pf.pids
    assert not any(alive(p) for p in pids)
    assert children() <= before
    assert not any(Path("/dev/shm", n).exists() for n in names)


def test_same_seed_same_batches_whatever_the_workers_and_from_any_batch(
    paths: list[Path],
) -> None:
    data = MultimodalDataset.load(paths)
    runs = []
    for workers, depth, first, count in ((1, 1, 0, 6), (3, 2, 2, 4)):
        with Prefetcher(
            data, batch_size=9, depth=depth, workers=workers, image_size=8, seed=11,
            first_batch=first,
        ) as pf:  # fmt: skip
            runs.append([pf.next().clone() for _ in range(count)])
    # The second run (other workers and depth) resumed at batch 2: it serves batches 2..5.
    for a, b in zip(runs[0][2:], runs[1], strict=True):
        assert torch.equal(a["index"], b["index"])
        assert torch.equal(a["images"], b["images"])
        assert torch.equal(a["action"], b["action"])
    assert not torch.equal(runs[0][0]["index"], runs[0][1]["index"])


def test_schedule_is_a_seeded_permutation_per_epoch() -> None:
    s = BatchSchedule(size=50, batch_size=10, seed=3)
    epoch0 = np.concatenate([s.indices(k) for k in range(5)])
    epoch1 = np.concatenate([s.indices(k) for k in range(5, 10)])
    assert sorted(epoch0.tolist()) == list(range(50)) == sorted(epoch1.tolist())
    assert not np.array_equal(epoch0, epoch1)
    again = BatchSchedule(size=50, batch_size=10, seed=3)
    assert np.array_equal(again.indices(7), s.indices(7))
    other = BatchSchedule(size=50, batch_size=10, seed=4)
    assert not np.array_equal(other.indices(0), s.indices(0))


PARENT = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path

    if __name__ == "__main__":  # spawned workers import this file: keep their imports few
        from navrl_daemon.offline.datasets import MultimodalDataset
        from navrl_daemon.offline.prefetch import Prefetcher

        data = MultimodalDataset.load([Path(p) for p in sys.argv[1:]])
        pf = Prefetcher(data, batch_size=8, depth=2, workers=2, image_size=8, seed=0)
        pf.start()
        pf.next()
        print(json.dumps({"pids": pf.pids, "slots": pf.slot_names}), flush=True)
        time.sleep(600)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killed_parent_leaves_no_worker_and_no_slot(
    paths: list[Path], tmp_path: Path, sig: signal.Signals
) -> None:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    proc = subprocess.Popen(
        [sys.executable, str(script), *map(str, paths)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line, proc.stderr.read()  # type: ignore[union-attr]
        doc = json.loads(line)
        assert all(alive(p) for p in doc["pids"])
        proc.send_signal(sig)
        proc.wait(10)
        assert wait_until(lambda: not any(alive(p) for p in doc["pids"])), doc["pids"]
        # The resource tracker, outliving its parent, unlinks the slots.
        assert wait_until(lambda: not any(Path("/dev/shm", n).exists() for n in doc["slots"]))
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]


def test_bad_file_at_worker_start_is_data_error_and_leaves_no_worker(
    paths: list[Path], tmp_path: Path
) -> None:
    path = tmp_path / "soon_truncated.h5"
    path.write_bytes(paths[0].read_bytes())
    data = MultimodalDataset.load([path])
    path.write_bytes(path.read_bytes()[:20_000])  # damaged after it was checked
    before = children()
    with pytest.raises(DataError, match=f"{path}: cannot open"):
        Prefetcher(data, batch_size=4, depth=1, workers=2, image_size=8).start()
    assert children() <= before


def test_dead_worker_is_an_error_not_a_hang(paths: list[Path]) -> None:
    data = MultimodalDataset.load(paths)
    with Prefetcher(data, batch_size=4, depth=1, workers=2, image_size=8) as pf:
        pf.next()
        os.kill(pf.pids[0], signal.SIGKILL)
        with pytest.raises(
            RuntimeError, match=rf"worker 0 \(pid {pf.pids[0]}\) exited with code -9"
        ):
            for _ in range(10):
                pf.next()
