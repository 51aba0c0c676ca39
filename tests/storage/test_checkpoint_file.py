"""Checkpoint files (`.nrc`) and the checkpoints dir: round trip, every corruption, retention."""

from __future__ import annotations

import errno
import io
import json
import os
import pickle
import random
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import lz4.frame
import pytest
import torch
from torch import nn

from navrl_daemon.errors import DataError
from navrl_daemon.storage.checkpoint import (
    CheckpointDir,
    CheckpointHeader,
    encode_checkpoint,
    load_checkpoint,
    read_header,
    verify,
)
from navrl_daemon.testing.full_disk import fill


def realistic_state() -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    model(torch.randn(5, 6)).pow(2).sum().backward()
    opt.step()
    gen = torch.Generator().manual_seed(1234)
    torch.rand(3, generator=gen)
    return {
        "model": model.state_dict(),
        "optimizers": {"actor": opt.state_dict()},
        "counters": {"iteration": 7, "frames": 7 * 4096, "policy_version": 7},
        "value_norm": {"mean": torch.randn(1, dtype=torch.float64), "count": 12.5},
        "rng": {"torch": torch.get_rng_state(), "gen": gen.get_state(), "py": random.getstate()},
        "nothing": None,
        "flags": [True, False, "text", 3, -1.5],
    }


def assert_identical(a, b, path="state"):
    assert type(a) is type(b), path
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), (
            path
        )  # bit-exact
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            assert_identical(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_identical(x, y, f"{path}.{i}")
    else:
        assert a == b, path


def nrc(payload_raw: bytes, **overrides) -> bytes:
    """An NRC1 container built by hand from the format spec, around any raw payload."""
    fields = {"raw_bytes": len(payload_raw), **overrides}
    return nrc_stored(lz4.frame.compress(payload_raw), **fields)


def nrc_stored(payload: bytes, **overrides) -> bytes:
    """An NRC1 container around a payload as stored (compressed or crafted), its checksum
    right; the header's fields are the format spec's, `overrides` replace any of them."""
    header = {
        "format_version": 1,
        "iteration": 1,
        "frames": 1,
        "policy_version": 1,
        "created": 0.0,
        "codec": "lz4-frame",
        "level": 0,
        "raw_bytes": 0,
        "stored_bytes": len(payload),
        "checksum": f"crc32:{zlib.crc32(payload):08x}",
        "chunks": [len(payload)],
        "meta": {},
        **overrides,
    }
    head = json.dumps(header).encode()
    return b"NRC1" + struct.pack("<I", len(head)) + head + payload


@pytest.fixture
def blob() -> bytes:
    return encode_checkpoint(
        realistic_state(), iteration=7, frames=28672, policy_version=7, meta={"seed": 3}
    )


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def reason(path: Path) -> str:
    with pytest.raises(DataError) as info:
        load_checkpoint(path)
    assert info.value.exit_code == 65
    assert str(info.value).startswith(f"checkpoint {path}: ")
    return str(info.value)


# --- file format ---------------------------------------------------------------------------


def test_round_trip_is_bit_exact_with_header_fields(tmp_path, blob):
    state = realistic_state()
    path = write(tmp_path / "a.nrc", blob)
    header, loaded = load_checkpoint(path)
    assert_identical(state, loaded)
    assert header == read_header(path)
    assert isinstance(header, CheckpointHeader)
    assert (header.format_version, header.iteration, header.frames) == (1, 7, 28672)
    assert (header.policy_version, header.codec, header.level) == (7, "lz4-frame", 0)
    assert header.meta == {"seed": 3}
    assert header.checksum.startswith("crc32:") and len(header.checksum) == 14
    head_len = struct.unpack("<I", blob[4:8])[0]
    assert header.stored_bytes == len(blob) - 8 - head_len
    assert header.raw_bytes > 0 and isinstance(header.created, float)


@pytest.mark.parametrize("level", [0, 9])
def test_lz4_levels_round_trip_and_report_sizes(tmp_path, level):
    state = {"zeros": torch.zeros(64, 1024), "w": torch.randn(32)}
    path = write(
        tmp_path / "a.nrc",
        encode_checkpoint(state, iteration=1, frames=2, policy_version=3, level=level),
    )
    header, loaded = load_checkpoint(path)
    assert_identical(state, loaded)
    buf = io.BytesIO()
    torch.save(state, buf)
    assert header.level == level
    assert header.raw_bytes == len(buf.getvalue())
    assert header.stored_bytes < header.raw_bytes / 10  # zeros compress well at any level


@pytest.mark.parametrize("threads", [0, 2])
def test_chunked_payload_round_trips_serial_or_in_a_pool(tmp_path, threads):
    state = {"w": torch.randn(300_000), "z": torch.zeros(70_000), "n": 5}
    pool = ThreadPoolExecutor(threads) if threads else None
    blob = encode_checkpoint(
        state, iteration=1, frames=1, policy_version=1, executor=pool, chunk_bytes=100_000
    )
    header, loaded = load_checkpoint(write(tmp_path / "c.nrc", blob))
    assert_identical(state, loaded)
    assert len(header.chunks) == -(-header.raw_bytes // 100_000) > 10
    assert sum(header.chunks) == header.stored_bytes
    # The same bytes whether chunks were compressed serially or in a pool.
    serial = encode_checkpoint(state, iteration=1, frames=1, policy_version=1, chunk_bytes=100_000)

    def payload(b: bytes) -> bytes:
        return b[8 + struct.unpack("<I", b[4:8])[0] :]

    assert payload(serial) == payload(blob)


def test_chunk_sizes_that_do_not_add_up_are_refused(tmp_path):
    raw = b"x" * 1000
    bad = nrc(raw, chunks=[5, 7])
    with pytest.raises(DataError, match="chunks add up to 12"):
        load_checkpoint(write(tmp_path / "b.nrc", bad))


@pytest.mark.parametrize("level", [-1, 17])
def test_bad_level_is_refused(level):
    with pytest.raises(ValueError, match="compression level"):
        encode_checkpoint({}, iteration=0, frames=0, policy_version=0, level=level)


@pytest.mark.parametrize(
    ("state", "where"),
    [
        ({"model": {"w": torch.tensor([1.0, float("nan")])}}, "state.model.w"),
        ({"opt": [{"x": torch.ones(2)}, torch.tensor([float("inf")])]}, "state.opt.1"),
        ({"half": torch.tensor([float("-inf")], dtype=torch.float16)}, "state.half"),
    ],
)
def test_non_finite_tensor_is_never_encoded(state, where):
    with pytest.raises(ValueError, match=f"{where}: non-finite"):
        encode_checkpoint(state, iteration=0, frames=0, policy_version=0)


def test_unloadable_values_and_nan_meta_are_refused_at_encode():
    with pytest.raises(TypeError, match=r"state.x.0: set"):
        encode_checkpoint({"x": [{1, 2}]}, iteration=0, frames=0, policy_version=0)
    with pytest.raises(ValueError):
        encode_checkpoint({}, iteration=0, frames=0, policy_version=0, meta={"x": float("nan")})
    ok = encode_checkpoint({"i": torch.arange(3)}, iteration=0, frames=0, policy_version=0)
    assert ok[:4] == b"NRC1"  # integer tensors have no non-finite values


def test_bad_magic(tmp_path, blob):
    assert "not a navrl checkpoint (bad magic)" in reason(write(tmp_path / "a", b"XRC1" + blob[4:]))


@pytest.mark.parametrize("cut", [2, 6, 9, 30])
def test_truncated_header(tmp_path, blob, cut):
    assert ": truncated: " in reason(write(tmp_path / "a", blob[:cut]))


def test_truncated_payload_at_several_offsets(tmp_path, blob):
    start = 8 + struct.unpack("<I", blob[4:8])[0]
    for cut in (start, start + 1, (start + len(blob)) // 2, len(blob) - 1):
        why = reason(write(tmp_path / f"cut{cut}", blob[:cut]))
        assert ": truncated: payload has" in why, cut
    assert "trailing data" in reason(write(tmp_path / "long", blob + b"\0"))


def test_flipped_payload_byte_fails_checksum(tmp_path, blob):
    bad = bytearray(blob)
    bad[-100] ^= 0x01
    assert "checksum mismatch" in reason(write(tmp_path / "a", bytes(bad)))


def test_foreign_files_are_refused(tmp_path):
    plain = tmp_path / "plain.pt"
    torch.save({"w": torch.ones(3)}, plain)
    assert "(bad magic)" in reason(plain)
    assert "(bad magic)" in reason(write(tmp_path / "rand", random.Random(0).randbytes(4096)))
    assert "(empty file)" in reason(write(tmp_path / "empty", b""))
    assert "unreadable" in reason(tmp_path / "missing.nrc")
    assert "bad header" in reason(write(tmp_path / "json", b"NRC1" + struct.pack("<I", 3) + b"{x}"))
    assert "payload refused" in reason(write(tmp_path / "text", nrc(b"hello, not torch")))
    assert "raw size mismatch" in reason(write(tmp_path / "size", nrc(b"abc", raw_bytes=4)))
    assert "format_version" in reason(write(tmp_path / "v2", nrc(b"abc", format_version=2)))
    with pytest.raises(DataError, match="bad magic"):
        read_header(plain)


class Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("how", ["torch.save", "pickle"])
def test_code_carrying_pickle_is_refused_never_executed(tmp_path, how):
    marker = tmp_path / "pwned"
    buf = io.BytesIO()
    if how == "torch.save":
        torch.save({"w": torch.ones(1), "x": Evil(marker)}, buf)
    else:
        pickle.dump({"x": Evil(marker)}, buf, protocol=2)
    raw = buf.getvalue()
    # Control: the payload really runs code when loaded the unsafe way.
    torch.load(io.BytesIO(raw), weights_only=False) if how == "torch.save" else pickle.loads(raw)
    assert marker.exists()
    marker.unlink()

    path = write(tmp_path / "evil.nrc", nrc(raw))  # valid container, correct checksum
    assert "payload refused by torch.load(weights_only=True)" in reason(path)
    assert verify([path])[0][1].startswith("payload refused")
    assert not marker.exists()


# --- checkpoints dir -----------------------------------------------------------------------


def small(iteration: int) -> bytes:
    state = {"w": torch.full((4,), float(iteration)), "iteration": iteration}
    return encode_checkpoint(state, iteration=iteration, frames=iteration * 10, policy_version=1)


def manifest(d: CheckpointDir) -> dict:
    return json.loads((d.path / "MANIFEST.json").read_text())


def corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def test_write_names_latest_in_manifest(tmp_path):
    d = CheckpointDir(tmp_path / "checkpoints")
    assert d.files() == [] and d.newest_valid() is None
    paths = [d.write(small(i), i) for i in (3, 12, 1000)]
    assert [p.name for p in paths] == [
        "ckpt-000000003.nrc",
        "ckpt-000000012.nrc",
        "ckpt-000001000.nrc",
    ]
    assert d.files() == paths
    assert manifest(d)["latest"] == "ckpt-000001000.nrc"
    assert manifest(d)["files"] == [p.name for p in paths]
    assert not list(d.path.glob(".tmp-*"))
    path, header, state = d.newest_valid()
    assert path == paths[-1] and header.iteration == 1000 and state["iteration"] == 1000
    with pytest.raises(ValueError):
        d.write(b"not a checkpoint", 5)


def test_newest_valid_skips_corrupt_newest_and_says_why(tmp_path):
    d = CheckpointDir(tmp_path)
    paths = [d.write(small(i), i) for i in (1, 2, 3)]
    corrupt(paths[2])
    paths[1].write_bytes(paths[1].read_bytes()[:50])
    path, header, state = d.newest_valid()
    assert path == paths[0] and header.iteration == 1 and state["iteration"] == 1
    assert [p for p, _ in d.skipped] == [paths[2], paths[1]]
    assert d.skipped[0][1].startswith("checksum mismatch")
    assert d.skipped[1][1].startswith("truncated")
    assert verify(paths) == [(paths[0], None), *reversed(d.skipped)]
    corrupt(paths[0])
    assert d.newest_valid() is None and len(d.skipped) == 3


def test_temp_files_never_count_and_are_removed(tmp_path):
    d = CheckpointDir(tmp_path)
    d.write(small(1), 1)
    # An interrupted write: a complete-looking temp of a newer iteration and a half-written one.
    write(tmp_path / ".tmp-abc123", small(99))
    write(tmp_path / ".tmp-def456", small(100)[:40])
    write(tmp_path / "ckpt-000000002.nrc.bak", small(2))
    write(tmp_path / "notes.txt", b"hi")
    assert [p.name for p in d.files()] == ["ckpt-000000001.nrc"]
    assert d.newest_valid()[1].iteration == 1 and d.skipped == []
    assert [p.name for p in d.remove_temp_files()] == [".tmp-abc123", ".tmp-def456"]
    assert not list(tmp_path.glob(".tmp-*"))
    assert (tmp_path / "notes.txt").exists() and d.remove_temp_files() == []


def test_prune_keeps_last_and_best(tmp_path):
    d = CheckpointDir(tmp_path)
    paths = [d.write(small(i), i) for i in range(1, 7)]
    scores = {paths[1]: 0.9, paths[3]: 0.7, paths[0]: 0.1, tmp_path / "gone.nrc": 1.0}
    deleted = d.prune(keep_last=2, keep_best=2, scores=scores)
    assert deleted == [paths[0], paths[2]]
    assert d.files() == [paths[1], paths[3], paths[4], paths[5]]
    assert manifest(d) | {"updated": 0} == {
        "latest": paths[5].name,
        "files": [p.name for p in d.files()],
        "updated": 0,
    }
    assert d.prune(keep_last=1) == [paths[1], paths[3], paths[4]]
    assert d.files() == [paths[5]] and d.prune(keep_last=1) == []


def test_prune_keeps_every_milestone_for_good(tmp_path):
    d = CheckpointDir(tmp_path)
    paths = {i: d.write(small(i), i) for i in range(1, 11)}
    corrupt(paths[6])
    scores = {paths[3]: 0.9}
    deleted = d.prune(keep_last=2, keep_best=1, scores=scores, keep_every=4)
    assert deleted == [paths[i] for i in (1, 2, 5, 7)]
    assert d.files() == [paths[i] for i in (3, 4, 8, 9, 10)]
    assert [p for p, _ in d.rejected] == [paths[6]]  # a broken milestone is no milestone
    assert manifest(d)["files"] == [p.name for p in d.files()]
    assert d.prune(keep_last=1, keep_every=4) == [paths[3], paths[9]]
    assert d.files() == [paths[4], paths[8], paths[10]]
    assert d.prune(keep_last=1) == [paths[4], paths[8]]  # off: only the newest stays
    with pytest.raises(ValueError, match="keep_every"):
        d.prune(keep_last=1, keep_every=-2)


def test_prune_never_deletes_newest_valid(tmp_path):
    d = CheckpointDir(tmp_path)
    paths = [d.write(small(i), i) for i in range(1, 5)]
    corrupt(paths[3])
    assert d.prune(keep_last=1) == [paths[0], paths[1]]
    assert d.files() == [paths[2]]  # the corrupt newest went aside (rejected/)
    assert [p for p, _ in d.rejected] == [paths[3]]
    assert manifest(d)["latest"] == paths[2].name
    assert d.newest_valid()[0] == paths[2]
    corrupt(paths[2])
    assert d.prune(keep_last=1) == [] and d.files() == [paths[2]]  # nothing valid: no change
    assert d.rejected == []
    with pytest.raises(ValueError, match="keep_last"):
        d.prune(keep_last=0)
    with pytest.raises(ValueError, match="keep_best"):
        d.prune(keep_last=1, keep_best=-1)


def test_junk_files_never_take_keep_last_places_and_are_moved_aside(tmp_path):
    """Junk with high iteration numbers used to fill keep_last (two junk files and
    keep_last=5 kept three real checkpoints) and stay for ever."""
    d = CheckpointDir(tmp_path)
    paths = [d.write(small(i), i) for i in range(1, 8)]
    write(tmp_path / "ckpt-000009998.nrc", b"junk")
    write(tmp_path / "ckpt-000009999.nrc", small(9999)[:-3])
    assert d.prune(keep_last=5, newest_valid=paths[-1]) == paths[:2]
    assert d.files() == paths[2:]
    assert sorted(p.name for p in (tmp_path / "rejected").iterdir()) == [
        "ckpt-000009998.nrc",
        "ckpt-000009999.nrc",
    ]
    assert [(p.name, why.split(" ")[0]) for p, why in d.rejected] == [
        ("ckpt-000009998.nrc", "not"),
        ("ckpt-000009999.nrc", "truncated:"),
    ]
    assert manifest(d)["files"] == [p.name for p in paths[2:]]
    # Moved aside, never deleted: a second junk file of the same name gets its own place.
    write(tmp_path / "ckpt-000009998.nrc", b"more junk")
    d.prune(keep_last=5)
    assert sorted(p.name for p in (tmp_path / "rejected").iterdir())[:2] == [
        "ckpt-000009998.nrc",
        "ckpt-000009998.nrc.1",
    ]


def test_files_the_run_does_not_accept_count_as_invalid(tmp_path):
    """`accept` (a run's check of the contents: pipeline/resume.py) counts like the
    container checks: newest_valid skips, verify names, prune moves such a file aside."""

    def accept(header, state):
        return None if state["iteration"] % 2 else "an even iteration"

    plain = CheckpointDir(tmp_path)
    paths = [plain.write(small(i), i) for i in (1, 2, 3, 4)]
    d = CheckpointDir(tmp_path, accept=accept)
    assert d.newest_valid()[0] == paths[2]
    assert d.skipped == [(paths[3], "an even iteration")]
    assert verify(paths, accept)[1] == (paths[1], "an even iteration")
    assert d.prune(keep_last=5) == []
    assert d.files() == [paths[0], paths[2]]


def random_checkpoint(iteration: int, nbytes: int = 200_000) -> bytes:
    state = {"w": torch.rand(nbytes // 4, generator=torch.Generator().manual_seed(iteration))}
    return encode_checkpoint(state, iteration=iteration, frames=iteration, policy_version=1)


def test_a_full_disk_makes_room_by_deleting_older_checkpoints_first(small_disk):
    """Low on space, older checkpoints go before a new one is written (oldest first, never
    the newest valid one); when even that is not enough, the write fails and the newest
    valid checkpoint is still there, whole. A real full disk: a 1 MB tmpfs."""
    disk = small_disk("1m")
    d = CheckpointDir(disk / "checkpoints")
    paths = [d.write(random_checkpoint(i), i) for i in (1, 2, 3)]
    filler = fill(disk)  # another process takes every byte that is left
    path4 = d.write(random_checkpoint(4), 4)
    assert d.made_room == paths[:2]  # 1, then 2: still short, so the oldest went too
    assert d.files() == [paths[2], path4]
    path5 = d.write(random_checkpoint(5), 5)
    assert d.made_room == [paths[2]] and d.files() == [path4, path5]
    with pytest.raises(OSError) as err:
        d.write(random_checkpoint(6, nbytes=2_000_000), 6)  # cannot fit even alone
    assert err.value.errno == errno.ENOSPC
    assert d.files() == [path5] and verify([path5]) == [(path5, None)]
    assert not list(d.path.glob(".tmp-*"))
    filler.unlink()
    assert d.write(random_checkpoint(6), 6) and d.made_room == []


def test_the_manifest_names_what_is_on_disk_after_a_full_disk(small_disk):
    """A full disk left MANIFEST.json naming checkpoints deleted to make room, and not the
    newest: a write that failed after making room left it as it was, and a prune whose
    manifest write hit ENOSPC deleted files the manifest still named. A real full tmpfs."""
    disk = small_disk("1m")
    d = CheckpointDir(disk / "checkpoints")
    paths = {i: d.write(random_checkpoint(i), i) for i in (1, 2, 3)}
    fill(disk)
    paths[4] = d.write(random_checkpoint(4), 4)
    assert manifest(d)["files"] == [paths[3].name, paths[4].name]
    with pytest.raises(OSError):  # does not fit even alone, after 3 went to make room
        d.write(random_checkpoint(6, nbytes=2_000_000), 6)
    assert d.files() == [paths[4]]
    assert manifest(d) | {"updated": 0} == {
        "latest": paths[4].name,
        "files": [paths[4].name],
        "updated": 0,
    }
    paths[5] = d.write(random_checkpoint(5), 5)
    fill(disk)  # not a byte left: the manifest cannot be rewritten before the deletion
    assert d.prune(keep_last=1) == [paths[4]]
    assert d.files() == [paths[5]]
    assert manifest(d)["files"] == [paths[5].name] and manifest(d)["latest"] == paths[5].name
    assert d.manifest_error is None  # written once the deletion made room
