"""Archive files: real embedded-env rollouts round-trip bit-exactly in both modes; the
segment index matches a brute-force scan; a file killed mid-write reads back up to its
last whole segment; truncated, corrupt and foreign files raise DataError naming the file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from navrl_daemon.config import load_config
from navrl_daemon.errors import DataError
from navrl_daemon.rl.training import Training
from navrl_daemon.storage.archive import (
    ArchiveFile,
    ArchiveWriter,
    Schema,
    archive_files,
    archive_name,
    encode_segments,
    last_archived_iteration,
    remove_temp_files,
)
from navrl_daemon.storage.episode_store import ArchiveReader, rollout_arrays
from navrl_daemon.storage.segment_index import SegmentIndex
from navrl_daemon.testing.crafted_files import archive_files as archive_files_crafted
from tests.conftest import REPO, TINY

# TINY with pillars, so the LiDAR sees something.
OBSTACLES = [*TINY, "env.num_obstacles=30", "env.field_size=12.0"]


@pytest.fixture(scope="module")
def rollouts() -> list[dict[str, np.ndarray]]:
    """Three consecutive real rollouts of the embedded env, as `a/b/c` → [N, T, ...] arrays."""
    training = Training.build(load_config(None, OBSTACLES), "cpu")
    out = []
    for _ in range(3):
        training.collector.collect(training.buffer)
        out.append(rollout_arrays(training.buffer, copy=True))
    return out


def write(
    path: Path, rollouts: list[dict[str, np.ndarray]], schema: Schema, first: int = 0
) -> None:
    writer = ArchiveWriter(path, schema)
    for i, arrays in enumerate(rollouts, start=first):
        n = next(iter(arrays.values())).shape[0]
        writer.append(encode_segments(schema, arrays, range(n), iteration=i, policy_version=10 + i))
    writer.close()


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ---------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize(
    ("mode", "filter_", "key_filters"),
    [
        ("episode", "none", []),
        ("episode", "shuffle", [("*/lidar", "delta+shuffle"), ("*/state", "delta")]),
        ("frame", "none", []),
        ("frame", "shuffle", []),
    ],
)
def test_real_rollouts_round_trip_bit_exact_for_every_key(
    tmp_path: Path,
    rollouts: list[dict[str, np.ndarray]],
    mode: str,
    filter_: str,
    key_filters: list,
    version: int,
) -> None:
    schema = Schema.for_rollout(
        rollouts[0],
        mode=mode,
        default_filter=filter_,
        key_filters=key_filters,  # type: ignore[arg-type]
        version=version,
    )
    path = tmp_path / archive_name(0)
    write(path, rollouts, schema)
    with ArchiveFile.open(path) as f:
        assert f.complete and f.torn == 0
        assert f.schema == schema and f.schema.version == version
        assert len(f.rows["offset"][0]) == (len(schema.keys) if version == 1 else 1)
        n, t = next(iter(rollouts[0].values())).shape[:2]
        assert f.segments == 3 * n and f.frames == 3 * n * t
        assert f.rows["iteration"].tolist() == [i for i in range(3) for _ in range(n)]
        assert f.rows["policy_version"].tolist() == [10 + i for i in range(3) for _ in range(n)]
        assert f.rows["env"].tolist() == list(range(n)) * 3
        for s in range(f.segments):
            decoded = f.segment(s)
            source = rollouts[s // n]
            assert list(decoded.keys()) == list(source.keys())
            for key, array in source.items():
                assert same_bits(decoded[key], array[s % n]), (key, s)


def test_reader_samples_transitions_and_windows_exactly(
    tmp_path: Path, rollouts: list[dict[str, np.ndarray]]
) -> None:
    """Across a format-1 file (one blob per key, shuffled) and a format-2 file (packed, in
    frame mode): an archive directory written before and after an upgrade reads as one."""
    paths = [tmp_path / archive_name(0), tmp_path / archive_name(1)]
    old = Schema.for_rollout(rollouts[0], default_filter="shuffle", version=1)
    write(paths[0], rollouts[:2], old)
    write(paths[1], rollouts[2:], Schema.for_rollout(rollouts[0], mode="frame"), first=2)
    n, t = next(iter(rollouts[0].values())).shape[:2]
    rng = np.random.default_rng(0)
    with ArchiveReader(paths, workers=2, cache_bytes=1 << 20) as reader:
        assert reader.segments == 3 * n and reader.frames == 3 * n * t
        assert reader.column("iteration").tolist() == [i for i in range(3) for _ in range(n)]
        frames = rng.integers(0, reader.frames, size=64)
        td = reader.gather(frames)
        for key, _ in rollouts[0].items():
            want = np.stack([rollouts[g // (n * t)][key][(g // t) % n, g % t] for g in frames])
            got = td.get(tuple(key.split("/"))).numpy()
            assert same_bits(got, want), key
        windows = reader.windows(16, 3, rng)
        assert tuple(windows.batch_size) == (16, 3)
        # Every window is 3 consecutive steps of one segment: find it by brute force.
        lidar = windows.get(("agents", "observation", "lidar")).numpy()
        sources = np.concatenate([r["agents/observation/lidar"] for r in rollouts])
        for w in lidar:
            assert any(
                same_bits(w, sources[s, k : k + 3]) for s in range(3 * n) for k in range(t - 2)
            )
        assert reader.cache.hits + reader.cache.misses > 0


# ---------------------------------------------------------------------------- index


@given(lengths=st.lists(st.integers(0, 9), max_size=40), data=st.data())
def test_index_lookup_matches_brute_force(lengths: list[int], data: st.DataObject) -> None:
    index = SegmentIndex(np.array(lengths, dtype=np.int64))
    table = [(s, k) for s, n in enumerate(lengths) for k in range(n)]  # frame g → (s, k)
    assert index.frames == len(table)
    if table:
        frames = data.draw(st.lists(st.integers(0, len(table) - 1), min_size=1, max_size=50))
        segment, offset = index.locate(np.array(frames))
        assert list(zip(segment.tolist(), offset.tolist(), strict=True)) == [
            table[g] for g in frames
        ]
    with pytest.raises(IndexError):
        index.locate(np.array([len(table)]))
    width = data.draw(st.integers(1, 10))
    starts = [(s, k) for s, n in enumerate(lengths) for k in range(n - width + 1)]
    windows = index.windows(width)
    assert windows.frames == len(starts)
    if starts:
        segment, offset = windows.locate(np.arange(len(starts)))
        assert list(zip(segment.tolist(), offset.tolist(), strict=True)) == starts


# ---------------------------------------------------------------------------- kill -9

WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from pathlib import Path
    from navrl_daemon.storage.archive import ArchiveWriter, Schema, encode_segments

    rng = np.random.default_rng(int(sys.argv[2]))
    arrays = {
        "obs/lidar": rng.random((4, 16, 36, 4), dtype=np.float32),
        "done": rng.random((4, 16, 1)) < 0.1,
    }
    schema = Schema.for_rollout(arrays, default_filter="shuffle")
    writer = ArchiveWriter(Path(sys.argv[1]), schema)
    i = 0
    while True:
        writer.append(encode_segments(schema, arrays, range(4), iteration=i, policy_version=i))
        i += 1
        print(i, flush=True)
    """
)


def kill_writer_mid_append(path: Path, seed: int) -> int:
    """Run a writer that appends forever, kill -9 it after a few appends; appends seen."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(seed)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert proc.stdout is not None
    seen = 0
    while seen < 3 + seed:
        seen = int(proc.stdout.readline())
    time.sleep(0.001 * seed)  # land somewhere inside a later append
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return seen


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_killed_writer_leaves_a_file_readable_up_to_its_last_whole_segment(
    tmp_path: Path, seed: int
) -> None:
    path = tmp_path / archive_name(0)
    seen = kill_writer_mid_append(path, seed)
    with ArchiveFile.open(path) as f:
        assert not f.complete
        assert f.segments >= 4 * seen  # every append it reported is there
        assert f.segments % 4 == 0  # an append's rows commit together (one `length` write)
        f.verify()  # every indexed segment decodes with its checksum
    with ArchiveReader([path]) as reader:
        assert reader.sample(8, np.random.default_rng(0)).batch_size[0] == 8


@pytest.mark.parametrize("version", [1, 2])
def test_rows_without_their_length_or_their_bytes_are_not_trusted(
    tmp_path: Path, version: int
) -> None:
    """What a kill -9 between an append's two flushes can leave: index rows whose `length`
    never came (fill value -1), or whose blob bytes lie past the blob dataset's end."""
    rng = np.random.default_rng(0)
    arrays = {"obs/x": rng.random((4, 8, 64), dtype=np.float32)}
    schema = Schema.for_rollout(arrays, version=version)
    (blobs,) = schema.blob_datasets
    path = tmp_path / archive_name(0)
    write(path, [arrays], schema)
    with h5py.File(path, "r+") as f:
        f.attrs["complete"] = False
        for name in ("iteration", "env", "policy_version", "raw_bytes", "row_crc32", "length"):
            f[f"index/{name}"].resize((6,))
        for name in ("offset", "stored_bytes", "crc32"):
            f[f"index/{name}"].resize((6, 1))
        assert f["index/length"][4:].tolist() == [-1, -1]
    with ArchiveFile.open(path) as f:
        assert (f.segments, f.torn) == (4, 2)
        f.verify()
    with h5py.File(path, "r+") as f:
        f["index/length"][4:] = 8
        f["index/offset"][4] = f[blobs].shape[0]  # points past the written bytes
        f["index/stored_bytes"][4] = 100
    with ArchiveFile.open(path) as f:
        assert (f.segments, f.torn) == (4, 2)
    with h5py.File(path, "r+") as f:
        f.attrs["complete"] = True
    with pytest.raises(DataError, match="marked complete but only 4 of 6 index rows"):
        ArchiveFile.open(path)


def test_a_row_that_fails_its_checksum_is_not_trusted_and_the_rest_are(tmp_path: Path) -> None:
    """One high bit flipped in the newest file's last index row (`iteration ^= 1 << 40`):
    the restart took 2**40 + 9 for the last archived rollout and archived nothing after
    it. Opening leaves that row out (as `verify` reports it), and only that row."""
    rng = np.random.default_rng(0)
    arrays = {"obs/x": rng.random((4, 8, 64), dtype=np.float32)}
    schema = Schema.for_rollout(arrays)
    older, newest = tmp_path / archive_name(0), tmp_path / archive_name(1)
    write(older, [arrays] * 2, schema, first=5)
    write(newest, [arrays] * 3, schema, first=7)  # rows 0..11: iterations 7, 8, 9
    with h5py.File(newest, "r+") as f:
        f["index/iteration"][11] ^= 1 << 40
        f["index/env"][5] ^= 1 << 20  # and one row in the middle
    bad: list[DataError] = []
    assert last_archived_iteration(tmp_path, on_bad=bad.append) == 9
    (error,) = bad
    assert f"archive {newest}: index row 5 (iteration 8, env 1048577)" in str(error)
    assert "checksum mismatch" in str(error) and "(2 bad row(s))" in str(error)
    with ArchiveFile.open(newest) as f:
        assert f.complete and f.segments == 10 and f.bad_rows == [5, 11]
        assert f.rows["iteration"].tolist() == [7] * 4 + [8] * 3 + [9] * 3
        assert f.rows["env"].tolist() == [0, 1, 2, 3, 0, 2, 3, 0, 1, 2]
        assert same_bits(f.segment(9)["obs/x"], arrays["obs/x"][2])  # rows after it still read
        with pytest.raises(DataError, match=r"index row 5 .* \(2 bad row\(s\)\)"):
            f.verify()
    with ArchiveReader([older, newest]) as reader:
        assert reader.segments == 18 and set(reader.column("iteration").tolist()) == {5, 6, 7, 8, 9}
    with h5py.File(newest, "r+") as f:  # every row bad: the file before it says
        f["index/row_crc32"][:] ^= 1
    bad.clear()
    assert last_archived_iteration(tmp_path, on_bad=bad.append) == 6 and len(bad) == 1


# ---------------------------------------------------------------------------- bad input


@pytest.fixture(params=[1, 2], ids=["format1", "format2"])
def good_file(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    rng = np.random.default_rng(0)
    arrays = {"obs/x": rng.random((4, 8, 64), dtype=np.float32), "done": np.zeros((4, 8, 1), bool)}
    schema = Schema.for_rollout(arrays, version=request.param)
    path = tmp_path / archive_name(0)
    write(path, [arrays, arrays], schema)
    return path


def open_and_verify(path: Path) -> None:
    with ArchiveFile.open(path) as f:
        f.verify()


def test_truncated_file_raises_data_error_naming_it(good_file: Path) -> None:
    data = good_file.read_bytes()
    for cut in (0, 100, len(data) // 2, len(data) - 1000):
        good_file.write_bytes(data[:cut])
        with pytest.raises(DataError, match=str(good_file)):
            open_and_verify(good_file)


def test_corrupt_blob_byte_is_caught_by_its_checksum(good_file: Path) -> None:
    with h5py.File(good_file, "r") as f:
        packed = "segments" in f
        blobs = f["segments" if packed else "blobs/obs/x"]
        offset = blobs.id.get_chunk_info(0).byte_offset
    data = bytearray(good_file.read_bytes())
    data[offset + 10] ^= 0xFF
    good_file.write_bytes(bytes(data))
    what = "packed blob" if packed else "key obs/x"
    with pytest.raises(DataError, match=rf"{good_file}.*segment 0 {what}: checksum mismatch"):
        open_and_verify(good_file)


def test_foreign_files_raise_data_error(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["x"] = np.arange(3)
    with pytest.raises(DataError, match=f"{foreign}: not a navrl archive"):
        ArchiveFile.open(foreign)
    text = tmp_path / "notes.h5"
    text.write_text("hello")
    with pytest.raises(DataError, match=f"{text}: not an HDF5 file"):
        ArchiveFile.open(text)
    with pytest.raises(DataError, match="not found"):
        ArchiveFile.open(tmp_path / "missing.h5")


def test_a_file_reading_others_or_claiming_more_than_it_holds_is_refused(
    good_file: Path, tmp_path: Path
) -> None:
    """An external link or a virtual dataset would read another file; an index claiming
    10**12 rows would be allocated whole: each is a DataError naming the file and key."""
    for case in archive_files_crafted(good_file, tmp_path / "crafted").values():
        with pytest.raises(DataError) as err:
            open_and_verify(case.path)
        assert f"archive {case.path}: " in str(err.value) and case.reason in str(err.value)


def test_wrong_version_and_bad_keys_attribute_raise_data_error(good_file: Path) -> None:
    with h5py.File(good_file, "r+") as f:
        f.attrs["version"] = 99
    with pytest.raises(DataError, match="unsupported version 99"):
        ArchiveFile.open(good_file)
    with h5py.File(good_file, "r+") as f:
        f.attrs["version"] = 1
        f.attrs["keys"] = '[{"path": "obs/x", "dtype": "O", "shape": [], "filter": "none"}]'
    with pytest.raises(DataError, match="bad keys attribute"):
        ArchiveFile.open(good_file)


def test_no_pickle_only_numeric_datasets_and_plain_attributes(good_file: Path) -> None:
    seen = []

    def check(name: str, obj: object) -> None:
        if isinstance(obj, h5py.Dataset):
            assert obj.dtype.kind in "uib", (name, obj.dtype)
            seen.append(name)
        for value in obj.attrs.values():  # type: ignore[attr-defined]
            assert isinstance(value, str | np.generic | np.ndarray), (name, type(value))
            if isinstance(value, np.ndarray):
                assert value.dtype.kind in "uifb"

    with h5py.File(good_file, "r") as f:
        check("/", f)
        f.visititems(check)
    assert {"blobs/obs/x", "segments"} & set(seen) and "index/crc32" in seen


def test_reader_skips_bad_files_only_when_asked(good_file: Path, tmp_path: Path) -> None:
    bad = tmp_path / archive_name(1)
    bad.write_bytes(good_file.read_bytes()[:500])
    with pytest.raises(DataError, match=str(bad)):
        ArchiveReader([good_file, bad])
    skipped: list[DataError] = []
    with ArchiveReader([bad, good_file], on_bad=skipped.append) as reader:
        assert [f.path for f in reader.files] == [good_file] and reader.segments == 8
    assert len(skipped) == 1 and str(bad) in str(skipped[0])
    with pytest.raises(DataError, match="no readable archive among 1 file"):
        ArchiveReader([bad], on_bad=skipped.append)


def test_archive_files_lists_by_sequence_and_ignores_other_names(tmp_path: Path) -> None:
    for name in ["rollouts-000010.h5", "rollouts-000002.h5", "notes.txt", "rollouts-1.h5"]:
        (tmp_path / name).touch()
    assert [p.name for p in archive_files(tmp_path)] == ["rollouts-000002.h5", "rollouts-000010.h5"]
    assert archive_files(tmp_path / "none") == []


def test_a_file_appears_under_its_name_only_once_readable(tmp_path: Path) -> None:
    """A kill -9 while a file is being created leaves a temp file no reader lists (and the
    next archiver removes), never a `rollouts-*.h5` that `archive verify` calls broken."""
    leftover = tmp_path / ".tmp-rollouts-000000.h5"
    leftover.write_bytes(b"\x89HDF half a superblock")
    assert archive_files(tmp_path) == [] and last_archived_iteration(tmp_path) is None
    arrays = {"obs/x": np.zeros((2, 4, 3), dtype=np.float32)}
    schema = Schema.for_rollout(arrays)
    write(tmp_path / archive_name(1), [arrays, arrays], schema, first=7)
    assert [p.name for p in archive_files(tmp_path)] == [archive_name(1)]
    assert last_archived_iteration(tmp_path) == 8
    assert remove_temp_files(tmp_path) == [leftover] and not leftover.exists()
    with pytest.raises(FileExistsError):
        write(tmp_path / archive_name(1), [arrays], schema)
    assert [p.name for p in tmp_path.iterdir()] == [archive_name(1)]
