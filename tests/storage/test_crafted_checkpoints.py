"""Checkpoint files that pass magic, lengths and checksum but must not load: sizes claimed
far beyond the file (an LZ4 frame claiming an exabyte, a header claiming 4 EiB of payload)
and a non-finite weight. Each is an invalid file (DataError, exit 65) with its reason,
never a MemoryError, and the run's loader falls back past it to the newest valid one and
moves it aside (issue #69). Real files on disk throughout."""

from __future__ import annotations

import io
import re
import struct
from collections.abc import Callable
from pathlib import Path

import lz4.frame
import numpy as np
import pytest
import torch

from navrl_daemon.errors import DataError
from navrl_daemon.pipeline.resume import newest_checkpoint
from navrl_daemon.storage import checkpoint
from navrl_daemon.storage.checkpoint import (
    REJECTED,
    CheckpointDir,
    encode_checkpoint,
    load_checkpoint,
    verify,
)
from navrl_daemon.storage.codec import CodecError, KeyCodec, PackedCodec
from tests.storage.test_checkpoint_file import nrc_stored


def frame_claiming(size: int, data: bytes) -> bytes:
    """A well-formed LZ4 frame whose header claims `size` decoded bytes around `data`."""
    compressor = lz4.frame.LZ4FrameCompressor(auto_flush=True)
    return compressor.begin(source_size=size) + compressor.compress(data) + b"\0\0\0\0"


def container(payload: bytes, **overrides: object) -> bytes:
    """An NRC1 file around a stored payload at iteration 9, its checksum right."""
    return nrc_stored(payload, **{"iteration": 9, "frames": 90, "policy_version": 9, **overrides})


def learner_state(iteration: int) -> dict:
    """A checkpoint's shape in small: a policy's weights and its optimiser's moments."""
    torch.manual_seed(iteration)
    policy = {"actor.weight": torch.randn(4, 3), "actor.bias": torch.zeros(4)}
    moments = {"step": torch.tensor(float(iteration)), "exp_avg": torch.randn(4, 3)}
    optimizer = {"state": {0: moments}, "param_groups": [{"lr": 3e-4, "params": [0]}]}
    return {"learner": {"policy": policy, "optimizers": {"actor": optimizer}}, "i": iteration}


def written(directory: CheckpointDir, iterations: range) -> list[Path]:
    return [
        directory.write(
            encode_checkpoint(learner_state(i), iteration=i, frames=i, policy_version=i), i
        )
        for i in iterations
    ]


def raw_state(iteration: int) -> bytes:
    buf = io.BytesIO()
    torch.save(learner_state(iteration), buf)
    return buf.getvalue()


def exabyte_frame(raw_bytes: int | None, iteration: int = 9) -> bytes:
    """The issue's file (about 260 bytes): one chunk, an LZ4 frame claiming 2**60 bytes."""
    raw = b"x" * 200
    payload = frame_claiming(2**60, raw)
    raw_size = len(raw) if raw_bytes is None else raw_bytes
    return container(payload, raw_bytes=raw_size, iteration=iteration)


def exabyte_payload(iteration: int = 9) -> bytes:
    """A header claiming 2**62 stored bytes in one chunk; the file holds about 1.5 KB."""
    raw = raw_state(iteration)
    payload = lz4.frame.compress(raw)
    return container(
        payload, raw_bytes=len(raw), stored_bytes=2**62, chunks=[2**62], iteration=iteration
    )


CRAFTED: dict[str, Callable[[], bytes]] = {
    "frame claims 2**60": lambda: exabyte_frame(None),
    "frame and raw_bytes claim 2**60": lambda: exabyte_frame(2**60),
    "stored_bytes claims 2**62": exabyte_payload,
}
REASONS = {
    "frame claims 2**60": "LZ4 frame claims 1152921504606846976 bytes",
    "frame and raw_bytes claim 2**60": "LZ4 frame claims 1152921504606846976 bytes",
    "stored_bytes claims 2**62": f"truncated: payload has .* of {2**62} bytes",
}


@pytest.mark.parametrize("name", CRAFTED)
def test_a_size_claimed_beyond_the_file_is_an_invalid_file_not_a_memory_error(
    tmp_path: Path, name: str
) -> None:
    d = CheckpointDir(tmp_path / "checkpoints")
    older = written(d, range(1, 4))
    crafted = d.path / "ckpt-000000009.nrc"
    crafted.write_bytes(CRAFTED[name]())
    assert crafted.stat().st_size < 2000  # claiming exabytes

    with pytest.raises(DataError, match=REASONS[name]) as info:
        load_checkpoint(crafted)
    assert info.value.exit_code == 65
    ((path, why),) = verify([crafted])
    assert path == crafted and re.search(REASONS[name], why)

    found = newest_checkpoint(d)  # what `run` starts from
    assert found is not None and found[0] == older[-1] and found[2]["i"] == 3
    assert [p.name for p in (d.path / REJECTED).iterdir()] == [crafted.name]


@pytest.mark.parametrize(
    "spoil",
    [
        lambda s: s["learner"]["policy"]["actor.weight"].__setitem__((1, 2), float("nan")),
        lambda s: s["learner"]["optimizers"]["actor"]["state"][0]["exp_avg"].fill_(float("inf")),
    ],
    ids=["nan weight", "inf optimiser moment"],
)
def test_a_non_finite_tensor_is_invalid_and_the_newest_valid_one_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spoil: Callable[[dict], None]
) -> None:
    """Five valid checkpoints, then one with a non-finite tensor: written by the project's
    own writer with its finiteness guard off, as a writer without the guard (or memory
    corrupted before the checksum) would have. `verify` used to pass it, and `run` resumed
    from it and rolled back to it until it gave up."""
    d = CheckpointDir(tmp_path / "checkpoints")
    valid = written(d, range(1, 6))
    state = learner_state(6)
    spoil(state)
    with monkeypatch.context() as unguarded:
        unguarded.setattr(checkpoint, "_all_finite", lambda t: True)
        bad = d.write(encode_checkpoint(state, iteration=6, frames=6, policy_version=6), 6)

    with pytest.raises(DataError, match="non-finite values") as info:
        load_checkpoint(bad)
    assert info.value.exit_code == 65
    reasons = dict(verify(d.files()))
    assert all(reasons[p] is None for p in valid)
    assert reasons[bad].startswith("state.learner.") and "non-finite values" in reasons[bad]

    found = newest_checkpoint(d)
    assert found is not None and found[0] == valid[-1] and found[2]["i"] == 5
    assert [p.name for p in (d.path / REJECTED).iterdir()] == [bad.name]
    assert d.newest_valid()[0] == valid[-1]  # and so does a rollback (load_learner)


@pytest.mark.parametrize("how", ["symlink", "copy"])
def test_a_checkpoint_under_a_newer_name_is_invalid_and_resume_does_not_go_back(
    tmp_path: Path, how: str
) -> None:
    """`ln -s ckpt-26 ckpt-999999999` (or a copy) made a run resume from iteration 26, cut
    its history back, and its first write removed the checkpoint it had just written."""
    d = CheckpointDir(tmp_path / "checkpoints")
    valid = written(d, range(1, 6))
    stranger = d.path / "ckpt-999999999.nrc"
    if how == "symlink":
        stranger.symlink_to(valid[1].name)
    else:
        stranger.write_bytes(valid[1].read_bytes())
    why = dict(verify(d.files()))[stranger]
    assert why is not None and ("symbolic link" if how == "symlink" else "holds iteration 2") in why
    found = newest_checkpoint(d)
    assert found is not None and found[0] == valid[-1] and found[2]["i"] == 5
    assert [p.name for p in (d.path / REJECTED).iterdir()] == [stranger.name]
    assert all(p.exists() for p in valid)  # the link's target is left where it was


@pytest.mark.parametrize("mode", ["episode", "frame"])
def test_the_archive_codec_refuses_a_frame_claiming_more_than_its_segment(mode: str) -> None:
    codec = KeyCodec(np.dtype(np.float32), (3,), "none", mode)  # type: ignore[arg-type]
    packed = PackedCodec((codec,), mode)  # type: ignore[arg-type]
    step = np.arange(3, dtype=np.float32).tobytes()
    frame = frame_claiming(2**60, step)
    blob = frame if mode == "episode" else struct.pack("<I", len(frame)) + frame
    for decode in (codec.decode, packed.decode):
        with pytest.raises(CodecError, match="claims 1152921504606846976 bytes"):
            decode(blob, 1)
