"""A decoded segment: one env's T steps of every key, in one byte buffer.

The buffer is "key-major": key by key in `codec.pack_order` (larger elements first), each
key's `[T, *step_shape]` array in C order, so every key is a zero-copy, aligned numpy view.
Archive format 2 decodes straight into this layout (one LZ4 call per segment); format 1
blobs are decoded per key and packed into it, so readers see one layout for both.

Samplers take whole steps: `SegmentLayout.row_index(T)` says which bytes of the buffer
make step t's "row" (every key's step t, in pack order), so a batch of transitions is one
fancy index per sample and one `split` per batch, not one Python call per sample and key.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from navrl_daemon.storage.codec import KeyCodec, pack_order


@dataclass(frozen=True)
class KeyPlace:
    """Where one key lies: `column` is its first byte within a step row."""

    path: str
    dtype: np.dtype
    step_shape: tuple[int, ...]
    step_bytes: int
    column: int


class SegmentLayout:
    """The byte layout of decoded segments of one schema (keys in column order)."""

    def __init__(self, paths: Sequence[str], codecs: Sequence[KeyCodec]) -> None:
        self.paths = tuple(paths)  # column order
        places: list[KeyPlace] = []
        column = 0
        for i in pack_order(codecs):
            c = codecs[i]
            places.append(KeyPlace(self.paths[i], c.dtype, c.step_shape, c.step_bytes, column))
            column += c.step_bytes
        self.packed = tuple(places)  # pack order
        self.by_path = {p.path: p for p in places}
        self.step_bytes = column
        self._rows: dict[int, np.ndarray] = {}

    def segment_bytes(self, length: int) -> int:
        return length * self.step_bytes

    def view(self, raw: np.ndarray, length: int, path: str) -> np.ndarray:
        """Key `path` of a key-major buffer: `[length, *step_shape]`, no copy."""
        p = self.by_path[path]
        start = length * p.column  # the keys before it, all `length` steps of each
        part = raw[start : start + length * p.step_bytes]
        return part.view(p.dtype).reshape(length, *p.step_shape)

    def pack(self, arrays: Mapping[str, np.ndarray], length: int) -> np.ndarray:
        """Key-major bytes of `[length, *step_shape]` arrays (a copy, writable)."""
        out = np.empty(self.segment_bytes(length), dtype=np.uint8)
        offset = 0
        for p in self.packed:
            size = length * p.step_bytes
            out[offset : offset + size] = (
                np.ascontiguousarray(arrays[p.path]).reshape(-1).view(np.uint8)
            )
            offset += size
        return out

    def row_index(self, length: int) -> np.ndarray:
        """`[length, step_bytes]`: the buffer positions of each step's row (cached)."""
        index = self._rows.get(length)
        if index is None:
            t = np.arange(length, dtype=np.int64)[:, None]
            index = np.concatenate(
                [
                    length * p.column + t * p.step_bytes + np.arange(p.step_bytes)
                    for p in self.packed
                ]
                or [np.zeros((length, 0), dtype=np.int64)],
                axis=1,
            )
            index.setflags(write=False)
            self._rows[length] = index
        return index

    def split(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """`[..., step_bytes]` rows → each key `[..., *step_shape]` (own, aligned memory),
        in column order."""
        lead = rows.shape[:-1]
        out = {}
        for path in self.paths:
            p = self.by_path[path]
            part = np.ascontiguousarray(rows[..., p.column : p.column + p.step_bytes])
            out[path] = part.view(p.dtype).reshape(*lead, *p.step_shape)
        return out


class DecodedSegment(Mapping[str, np.ndarray]):
    """A decoded segment's buffer; `segment[path]` is a key's `[T, *step_shape]` view."""

    __slots__ = ("layout", "length", "raw")

    def __init__(self, raw: np.ndarray, length: int, layout: SegmentLayout) -> None:
        if raw.dtype != np.uint8 or raw.ndim != 1 or len(raw) != layout.segment_bytes(length):
            raise ValueError(
                f"{raw.dtype}{list(raw.shape)} is not the {layout.segment_bytes(length)} "
                f"bytes of a {length}-step segment"
            )
        self.raw = raw
        self.length = length
        self.layout = layout

    @property
    def nbytes(self) -> int:
        return self.raw.nbytes

    def rows(self, steps: np.ndarray | int | slice) -> np.ndarray:
        """Step rows `[..., step_bytes]` (a copy): `steps` indexes the T steps."""
        return self.raw[self.layout.row_index(self.length)[steps]]

    def __getitem__(self, path: str) -> np.ndarray:
        return self.layout.view(self.raw, self.length, path)

    def __iter__(self) -> Iterator[str]:
        return iter(self.layout.paths)

    def __len__(self) -> int:
        return len(self.layout.paths)
