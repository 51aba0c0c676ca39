"""Segment codec: exact round trips for every filter and mode, filters against plain
reference computations, and bad blobs rejected."""

from __future__ import annotations

import lz4.frame
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from navrl_daemon.storage.codec import (
    FILTERS,
    CodecError,
    KeyCodec,
    PackedCodec,
    filter_for,
    pack_order,
    parse_key_filters,
)
from navrl_daemon.storage.segment import DecodedSegment, SegmentLayout

DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int8, np.uint16, np.bool_]


@st.composite
def segments(draw: st.DrawFn) -> np.ndarray:
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = (draw(st.integers(0, 12)), *draw(hnp.array_shapes(min_dims=0, max_dims=3, max_side=4)))
    # Floats with NaN, inf, -0.0 and subnormals: every bit pattern must come back.
    return draw(hnp.arrays(dtype, shape))


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@settings(max_examples=150)
@given(
    segment=segments(),
    filter_=st.sampled_from(FILTERS),
    mode=st.sampled_from(["episode", "frame"]),
    level=st.sampled_from([0, 4]),
)
def test_round_trip_is_bit_exact_for_every_filter_and_mode(
    segment: np.ndarray, filter_: str, mode: str, level: int
) -> None:
    if mode == "frame" and filter_.startswith("delta"):
        filter_ = "shuffle" if filter_.endswith("shuffle") else "none"
    codec = KeyCodec(segment.dtype, segment.shape[1:], filter_, mode, level)  # type: ignore[arg-type]
    blob = codec.encode(segment)
    assert same_bits(codec.decode(blob, len(segment)), segment)


@given(segment=segments(), data=st.data())
def test_frame_mode_decodes_only_the_asked_steps(segment: np.ndarray, data: st.DataObject) -> None:
    codec = KeyCodec(segment.dtype, segment.shape[1:], "shuffle", "frame")
    steps = data.draw(st.lists(st.integers(0, max(len(segment) - 1, 0)), max_size=6))
    if not len(segment):
        steps = []
    blob = codec.encode(segment)
    assert same_bits(codec.decode_steps(blob, len(segment), steps), segment[steps])


def test_shuffle_stores_byte_planes() -> None:
    x = np.array([[1.0, -2.5], [3.25, 1e-30]], dtype=np.float32)
    raw = lz4.frame.decompress(KeyCodec(x.dtype, (2,), "shuffle").encode(x))
    elements = [bytes(x.reshape(-1)[i : i + 1].tobytes()) for i in range(4)]
    planes = bytes(elements[e][b] for b in range(4) for e in range(4))  # byte b of every element
    assert raw == planes


def test_delta_stores_wrapping_integer_differences_along_time() -> None:
    x = np.array([[1.0, np.nan], [-0.0, 7.0], [np.inf, 7.0]], dtype=np.float32)
    raw = lz4.frame.decompress(KeyCodec(x.dtype, (2,), "delta").encode(x))
    bits = [[int(v) for v in row] for row in x.view(np.uint32)]
    want = [bits[0]] + [
        [(bits[t][j] - bits[t - 1][j]) % 2**32 for j in range(2)] for t in range(1, 3)
    ]
    assert np.frombuffer(raw, dtype=np.uint32).reshape(3, 2).tolist() == want


def test_delta_is_refused_in_frame_mode() -> None:
    with pytest.raises(ValueError, match="episode mode only"):
        KeyCodec(np.dtype(np.float32), (3,), "delta", "frame")


def test_encode_refuses_a_segment_of_another_layout() -> None:
    codec = KeyCodec(np.dtype(np.float32), (3,))
    with pytest.raises(ValueError, match="does not match"):
        codec.encode(np.zeros((4, 2), dtype=np.float32))
    with pytest.raises(ValueError, match="does not match"):
        codec.encode(np.zeros((4, 3), dtype=np.float64))


@pytest.mark.parametrize("mode", ["episode", "frame"])
def test_truncated_or_mislabelled_blobs_raise_codec_error(mode: str) -> None:
    x = np.arange(60, dtype=np.float32).reshape(5, 12)
    codec = KeyCodec(x.dtype, (12,), "none", mode)  # type: ignore[arg-type]
    blob = codec.encode(x)
    with pytest.raises(CodecError):
        codec.decode(blob[: len(blob) // 2], 5)
    with pytest.raises(CodecError):
        codec.decode(blob, 4)  # the index says 4 steps, the blob holds 5
    with pytest.raises(CodecError):
        codec.decode(b"\x00" * 40, 5)


# ---------------------------------------------------------------------------- packed (format 2)


@st.composite
def packed_segments(draw: st.DrawFn) -> tuple[PackedCodec, list[np.ndarray]]:
    """1-5 keys of mixed dtypes and step shapes, one length, filters and a mode."""
    mode = draw(st.sampled_from(["episode", "frame"]))
    length = draw(st.integers(0, 9))
    codecs, arrays = [], []
    for _ in range(draw(st.integers(1, 5))):
        dtype = np.dtype(draw(st.sampled_from(DTYPES)))
        step = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
        name = draw(st.sampled_from(FILTERS if mode == "episode" else ("none", "shuffle")))
        codecs.append(KeyCodec(dtype, step, name, mode))
        arrays.append(draw(hnp.arrays(dtype, (length, *step))))
    return PackedCodec(tuple(codecs), mode), arrays  # type: ignore[arg-type]


@settings(max_examples=150)
@given(case=packed_segments())
def test_packed_round_trip_is_bit_exact_and_every_key_an_aligned_view(
    case: tuple[PackedCodec, list[np.ndarray]],
) -> None:
    codec, arrays = case
    length = len(arrays[0])
    raw = codec.decode(codec.encode(arrays), length)
    assert raw.flags.writeable
    assert raw.tobytes() == b"".join(arrays[i].tobytes() for i in pack_order(codec.keys))
    paths = [f"k{i}" for i in range(len(arrays))]
    segment = DecodedSegment(raw, length, SegmentLayout(paths, codec.keys))
    assert list(segment) == paths
    for path, array in zip(paths, arrays, strict=True):
        assert same_bits(segment[path], array) and segment[path].flags.aligned, path
    if length:  # a step row holds every key's step, and splits back into them
        steps = np.arange(length)[::-1]
        split = segment.layout.split(segment.rows(steps))
        for path, array in zip(paths, arrays, strict=True):
            assert same_bits(split[path], array[steps]), path


def test_pack_order_puts_larger_elements_first_ties_in_column_order() -> None:
    codecs = [KeyCodec(np.dtype(t), (2,)) for t in (np.bool_, np.float32, np.int64, np.int32)]
    assert pack_order(codecs) == [2, 1, 3, 0]


@pytest.mark.parametrize("mode", ["episode", "frame"])
def test_bad_packed_blobs_raise_codec_error(mode: str) -> None:
    x, done = np.arange(60, dtype=np.float32).reshape(5, 12), np.zeros((5, 1), bool)
    codec = PackedCodec(
        (KeyCodec(x.dtype, (12,), "shuffle", mode), KeyCodec(done.dtype, (1,), mode=mode)),  # type: ignore[arg-type]
        mode,  # type: ignore[arg-type]
    )
    blob = codec.encode([x, done])
    for bad, length in [(blob[: len(blob) // 2], 5), (blob, 4), (b"\x00" * 40, 5), (b"", 5)]:
        with pytest.raises(CodecError):
            codec.decode(bad, length)
    with pytest.raises(ValueError, match="does not match"):
        codec.encode([x[:4], done])


def test_key_filters_first_match_wins_and_non_floats_stay_unfiltered() -> None:
    pairs = parse_key_filters(["*/lidar=delta+shuffle", "agents/*=shuffle"])
    f32, b1 = np.dtype(np.float32), np.dtype(np.bool_)
    assert filter_for("agents/observation/lidar", f32, "none", pairs) == "delta+shuffle"
    assert filter_for("agents/observation/state", f32, "none", pairs) == "shuffle"
    assert filter_for("next/agents/reward", f32, "delta", pairs) == "delta"
    assert filter_for("done", b1, "shuffle", pairs) == "none"
    for bad in ["lidar", "=shuffle", "x=zstd"]:
        with pytest.raises(ValueError):
            parse_key_filters([bad])
