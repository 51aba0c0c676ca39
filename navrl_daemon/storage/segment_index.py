"""Global frame index over variable-length segments: prefix sums and a binary search.

Frame `g` of the concatenation of all segments lies in segment `s` with
`starts[s] <= g < starts[s + 1]`; `np.searchsorted` finds `s` in O(log S) per frame,
vectorised over a whole batch of frames.
"""

from __future__ import annotations

import numpy as np


class SegmentIndex:
    def __init__(self, lengths: np.ndarray) -> None:
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.ndim != 1 or (lengths < 0).any():
            raise ValueError("segment lengths must be a 1-D array of non-negative integers")
        self.lengths = lengths
        # starts[s] = frames before segment s; starts[-1] = all frames.
        self.starts = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.starts[1:])

    @property
    def segments(self) -> int:
        return len(self.lengths)

    @property
    def frames(self) -> int:
        return int(self.starts[-1])

    def locate(self, frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global frame numbers → (segment, offset within it); IndexError when out of range."""
        frames = np.asarray(frames, dtype=np.int64)
        if frames.size and (frames.min() < 0 or frames.max() >= self.frames):
            raise IndexError(f"frame out of range 0..{self.frames - 1}")
        # side="right": a frame at a segment's start belongs to it, not to an empty one before.
        segment = np.searchsorted(self.starts, frames, side="right") - 1
        return segment, frames - self.starts[segment]

    def windows(self, width: int) -> SegmentIndex:
        """The index of every start of a `width`-step window lying inside one segment."""
        if width < 1:
            raise ValueError(f"window width must be >= 1, got {width}")
        return SegmentIndex(np.maximum(self.lengths - (width - 1), 0))
