"""Segment codec of the rollout archive: an optional filter, then LZ4 frame compression.

A segment is one env's T steps of one key, a C-contiguous array `[T, *step_shape]`.

Filters (all exact: decoding gives back the same bits, NaNs and -0.0 included):

- `none`: the bytes as they are.
- `shuffle`: byte-shuffle (Blosc's trick): byte 0 of every element, then byte 1, ... Float
  sensor data has slowly varying exponent bytes that LZ4 only finds once they sit together.
- `delta`: along time, in the integer domain of the element width (wrapping), so it is
  exact for floats too: step 0 as it is, then step t minus step t-1.
- `delta+shuffle`: delta, then shuffle.

Modes:

- `episode`: the whole segment is one LZ4 frame.
- `frame`: every step is its own LZ4 frame, so one step decodes alone. The blob is a
  little-endian u32 table of the T frame sizes, then the frames back to back. Delta
  filters need the previous step and are episode-mode only.

`KeyCodec` codes one key's segment alone (archive format 1: one blob per key).
`PackedCodec` codes all keys of a segment in one blob (format 2): each key filtered as
`KeyCodec` would, the results back to back in `pack_order`, then one LZ4 frame per segment
(episode mode) or per step (frame mode). Decoding gives the segment's bytes "key-major":
key by key in pack order, each key's `[T, *step_shape]` array in C order. One LZ4 call of
the whole segment instead of one per key: the per-key Python work was most of a decode.
"""

from __future__ import annotations

import fnmatch
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import lz4.frame
import numpy as np

Filter = Literal["none", "shuffle", "delta", "delta+shuffle"]
Mode = Literal["episode", "frame"]
FILTERS: tuple[Filter, ...] = ("none", "shuffle", "delta", "delta+shuffle")
MODES: tuple[Mode, ...] = ("episode", "frame")
CODEC = "lz4-frame"

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
# The most one stored byte of an LZ4 frame can decode to: the block format's densest
# sequence is a run of match-length bytes of 255 each (all zeros reach about 243).
LZ4_MAX_RATIO = 255


class CodecError(ValueError):
    """A blob does not decode to the array its key describes."""


def decompress_frame(blob: bytes | memoryview, limit: int) -> bytearray:
    """One LZ4 frame's bytes, at most `limit` of them; CodecError for anything else.

    The frame's own header says how much to allocate, so a crafted one claiming an
    exabyte is refused by that claim, before any allocation; no valid frame decodes to
    more than LZ4_MAX_RATIO times its size either."""
    limit = min(limit, LZ4_MAX_RATIO * memoryview(blob).nbytes)
    try:
        claimed = lz4.frame.get_frame_info(blob)["content_size"]  # 0: not stored
        if claimed > limit:
            raise CodecError(f"LZ4 frame claims {claimed} bytes, at most {limit} possible here")
        raw = lz4.frame.decompress(blob, return_bytearray=True)
    except RuntimeError as e:  # lz4 reports bad frames as RuntimeError
        raise CodecError(f"not a valid LZ4 frame: {e}") from None
    if len(raw) > limit:
        raise CodecError(f"LZ4 frame decoded to {len(raw)} bytes, at most {limit} possible here")
    return raw


@dataclass(frozen=True)
class KeyCodec:
    """How one key's segments are stored: element type, per-step shape, filter, mode, level."""

    dtype: np.dtype
    step_shape: tuple[int, ...]
    filter: Filter = "none"
    mode: Mode = "episode"
    level: int = 0

    def __post_init__(self) -> None:
        if self.filter not in FILTERS:
            raise ValueError(f"filter {self.filter!r} not one of {', '.join(FILTERS)}")
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} not one of {', '.join(MODES)}")
        if self.mode == "frame" and self.filter.startswith("delta"):
            raise ValueError("delta filters work along time: episode mode only")
        if not 0 <= self.level <= lz4.frame.COMPRESSIONLEVEL_MAX:
            raise ValueError(f"level {self.level} not in 0..{lz4.frame.COMPRESSIONLEVEL_MAX}")
        if self.dtype.itemsize not in _UINT:
            raise ValueError(f"dtype {self.dtype} has no integer view for the filters")

    @property
    def step_bytes(self) -> int:
        return math.prod(self.step_shape) * self.dtype.itemsize

    def encode(self, segment: np.ndarray) -> bytes:
        """Compress `[T, *step_shape]` into one blob."""
        if segment.dtype != self.dtype or segment.shape[1:] != self.step_shape:
            raise ValueError(
                f"segment {segment.dtype}{list(segment.shape)} does not match "
                f"{self.dtype}[T, {', '.join(map(str, self.step_shape))}]"
            )
        steps = np.ascontiguousarray(segment).view(_UINT[self.dtype.itemsize])
        if self.mode == "episode":
            return self._compress(self._forward(steps))
        frames = [self._compress(self._forward(step[None])) for step in steps]
        sizes = struct.pack(f"<{len(frames)}I", *map(len, frames))
        return b"".join([sizes, *frames])

    def decode(self, blob: bytes | memoryview, length: int) -> np.ndarray:
        """The `[length, *step_shape]` array `blob` was made from; CodecError if it is not."""
        if self.mode == "frame":
            return self.decode_steps(blob, length, np.arange(length))
        raw = self._decompress(blob, length)
        if self.filter == "none":  # the default: no integer view needed
            return np.frombuffer(raw, dtype=self.dtype).reshape(length, *self.step_shape)
        return self._inverse(raw, length).view(self.dtype)

    def decode_steps(
        self, blob: bytes | memoryview, length: int, steps: Sequence[int] | np.ndarray
    ) -> np.ndarray:
        """Only the given steps, `[len(steps), *step_shape]`; frame mode decodes just those."""
        steps = np.asarray(steps, dtype=np.int64)
        if self.mode == "episode":
            return self.decode(blob, length)[steps]
        view, spans = _frame_spans(blob, length)
        out = np.empty((len(steps), *self.step_shape), dtype=_UINT[self.dtype.itemsize])
        for i, t in enumerate(steps.tolist()):
            start, end = spans[t]
            out[i] = self._inverse(self._decompress(view[start:end], 1), 1)[0]
        return out.view(self.dtype)

    # filters work on the unsigned-integer view `[T, *step_shape]`

    def _forward(self, steps: np.ndarray) -> bytes:
        if self.filter.startswith("delta"):
            delta = steps.copy()
            np.subtract(steps[1:], steps[:-1], out=delta[1:])  # wraps: exact for any bits
            steps = delta
        if self.filter.endswith("shuffle"):
            return steps.reshape(-1).view(np.uint8).reshape(-1, self.dtype.itemsize).T.tobytes()
        return steps.tobytes()

    def _inverse(self, raw: bytearray, length: int) -> np.ndarray:
        """The unsigned-integer view `[length, *step_shape]` of what `_forward` was given."""
        itemsize = self.dtype.itemsize
        if self.filter.endswith("shuffle"):
            planes = np.frombuffer(raw, dtype=np.uint8).reshape(itemsize, -1)
            flat = planes.T.copy(order="C").view(_UINT[itemsize]).reshape(-1)
        else:
            flat = np.frombuffer(raw, dtype=_UINT[itemsize])  # a bytearray: writable, no copy
        steps = flat.reshape(length, *self.step_shape)
        if self.filter.startswith("delta"):
            np.cumsum(steps, axis=0, dtype=steps.dtype, out=steps)  # wraps back
        return steps

    def _compress(self, raw: bytes) -> bytes:
        return lz4.frame.compress(raw, compression_level=self.level, store_size=True)

    def _decompress(self, blob: bytes | memoryview, length: int) -> bytearray:
        expected = length * self.step_bytes
        raw = decompress_frame(blob, expected)
        if len(raw) != expected:
            raise CodecError(f"decoded {len(raw)} bytes, expected {expected} for {length} steps")
        return raw


def pack_order(codecs: Sequence[KeyCodec]) -> list[int]:
    """The order keys are packed in: larger elements first, ties in column order. Every
    key's bytes then start at a multiple of its element size (aligned numpy views)."""
    return sorted(range(len(codecs)), key=lambda i: -codecs[i].dtype.itemsize)


@dataclass(frozen=True)
class PackedCodec:
    """Every key of a segment in one blob (see module doc). `keys` in column order."""

    keys: tuple[KeyCodec, ...]
    mode: Mode = "episode"
    level: int = 0

    def __post_init__(self) -> None:
        if any(k.mode != self.mode or k.level != self.level for k in self.keys):
            raise ValueError("every key of a packed segment has the segment's mode and level")

    @cached_property
    def order(self) -> list[int]:
        return pack_order(self.keys)

    @cached_property
    def step_bytes(self) -> int:
        return sum(k.step_bytes for k in self.keys)

    def encode(self, segments: Sequence[np.ndarray]) -> bytes:
        """Compress one segment given as `[T, *step_shape]` arrays in column order."""
        if len(segments) != len(self.keys):
            raise ValueError(f"{len(segments)} arrays for {len(self.keys)} keys")
        length = len(segments[0]) if segments else 0
        for codec, segment in zip(self.keys, segments, strict=True):
            if segment.dtype != codec.dtype or segment.shape != (length, *codec.step_shape):
                raise ValueError(
                    f"segment {segment.dtype}{list(segment.shape)} does not match "
                    f"{codec.dtype}[{length}, {', '.join(map(str, codec.step_shape))}]"
                )
        order = self.order
        if self.mode == "episode":
            parts = [
                self.keys[i]._forward(
                    np.ascontiguousarray(segments[i]).view(_UINT[self.keys[i].dtype.itemsize])
                )
                for i in order
            ]
            return lz4.frame.compress(
                b"".join(parts), compression_level=self.level, store_size=True
            )
        # Frame mode: a [T, step_bytes] table of rows, each step's keys filtered alone.
        rows = np.concatenate(
            [_step_rows(self.keys[i], segments[i], length) for i in order], axis=1
        )
        frames = [
            lz4.frame.compress(row.tobytes(), compression_level=self.level, store_size=True)
            for row in rows
        ]
        return b"".join([struct.pack(f"<{length}I", *map(len, frames)), *frames])

    def decode(self, blob: bytes | memoryview, length: int) -> np.ndarray:
        """The segment's bytes, key-major in pack order: a writable uint8 array."""
        raw = self._decompress(blob, length)
        if self.mode == "frame":  # filters already undone, step by step
            return raw
        for codec, column in self._filtered:  # none by default: no Python work per key
            start, size = length * column, length * codec.step_bytes
            region = raw[start : start + size]
            region[:] = codec._inverse(region.data, length).reshape(-1).view(np.uint8)
        return raw

    @cached_property
    def _filtered(self) -> list[tuple[KeyCodec, int]]:
        """Keys with a filter, and where their step bytes start in a step row."""
        out, column = [], 0
        for i in self.order:
            if self.keys[i].filter != "none":
                out.append((self.keys[i], column))
            column += self.keys[i].step_bytes
        return out

    def _decompress(self, blob: bytes | memoryview, length: int) -> np.ndarray:
        expected = length * self.step_bytes
        if self.mode == "episode":
            raw = decompress_frame(blob, expected)
            if len(raw) != expected:
                raise CodecError(
                    f"decoded {len(raw)} bytes, expected {expected} for {length} steps"
                )
            return np.frombuffer(raw, dtype=np.uint8)
        rows = _frames(blob, length, self.step_bytes)
        out = np.empty(expected, dtype=np.uint8)
        column, offset = 0, 0
        for i in self.order:  # the step-major rows, column by column, into key-major
            codec = self.keys[i]
            width = codec.step_bytes
            part = rows[:, column : column + width]
            if codec.filter.endswith("shuffle"):  # undo each step's byte planes
                n = math.prod(codec.step_shape)
                part = part.reshape(length, codec.dtype.itemsize, n).transpose(0, 2, 1)
            out[offset : offset + length * width].reshape(length, width)[:] = part.reshape(
                length, width
            )
            column += width
            offset += length * width
        return out


def _step_rows(codec: KeyCodec, segment: np.ndarray, length: int) -> np.ndarray:
    """`[T, step_bytes]` uint8: each step of one key, byte-shuffled alone if its filter says."""
    n = math.prod(codec.step_shape)
    steps = np.ascontiguousarray(segment).reshape(length, n)
    planes = steps.view(np.uint8).reshape(length, n, codec.dtype.itemsize)
    if codec.filter.endswith("shuffle"):
        planes = planes.transpose(0, 2, 1)
    return planes.reshape(length, codec.step_bytes)


def _frame_spans(blob: bytes | memoryview, length: int) -> tuple[memoryview, list[tuple[int, int]]]:
    """Frame mode's blob: a u32 table of `length` frame sizes, then the frames. Returns the
    blob and each step's frame as (start, end); CodecError if the table does not fit."""
    view = memoryview(blob)
    table = 4 * length
    if len(view) < table:
        raise CodecError(f"frame table needs {table} bytes, blob has {len(view)}")
    sizes = np.frombuffer(view[:table], dtype="<u4").astype(np.int64)
    ends = table + np.cumsum(sizes)
    if length and ends[-1] != len(view):
        raise CodecError(f"frames add up to {int(ends[-1])} bytes, blob has {len(view)}")
    return view, list(zip((ends - sizes).tolist(), ends.tolist(), strict=True))


def _frames(blob: bytes | memoryview, length: int, step_bytes: int) -> np.ndarray:
    """Frame mode, every step decoded → `[length, step_bytes]` (packed step rows)."""
    view, spans = _frame_spans(blob, length)
    rows = []
    for t, (start, end) in enumerate(spans):
        try:
            row = decompress_frame(view[start:end], step_bytes)
        except CodecError as e:
            raise CodecError(f"step {t}: {e}") from None
        if len(row) != step_bytes:
            raise CodecError(f"step {t}: decoded {len(row)} bytes, expected {step_bytes}")
        rows.append(row)
    return np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(length, step_bytes)


def parse_key_filters(entries: Sequence[str]) -> list[tuple[str, Filter]]:
    """`["PATTERN=FILTER", ...]` (fnmatch patterns on `a/b/c` key paths) → pairs."""
    pairs: list[tuple[str, Filter]] = []
    for entry in entries:
        pattern, sep, name = entry.partition("=")
        pattern, name = pattern.strip(), name.strip()
        if not sep or not pattern:
            raise ValueError(f"{entry!r}: expected PATTERN=FILTER, e.g. */lidar=shuffle")
        if name not in FILTERS:
            raise ValueError(f"{entry!r}: filter {name!r} not one of {', '.join(FILTERS)}")
        pairs.append((pattern, name))  # type: ignore[arg-type]
    return pairs


def filter_for(
    path: str, dtype: np.dtype, default: Filter, key_filters: Sequence[tuple[str, Filter]]
) -> Filter:
    """The first matching per-key filter; else `default` for floats and `none` otherwise
    (booleans and small integers are already LZ4-friendly)."""
    for pattern, name in key_filters:
        if fnmatch.fnmatchcase(path, pattern):
            return name
    return default if dtype.kind == "f" else "none"
