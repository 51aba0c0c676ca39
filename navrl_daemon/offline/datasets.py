"""Multimodal HDF5 datasets (design §6): layouts A and B, checked once, read lazily.

A file holds `joint (N+1, J)`, three camera images `(N+1, H, W, 3)` (HWC) or
`(N+1, 3, H, W)` (CHW), `actions (N, A)`, `rewards (N, 1)`, `terminals (N, 1)`; layout A
keeps the observations under `/observations`, layout B keeps everything at the root.
Observations i and i+1 frame transition i. `left_wrist_image` / `right_wrist_image` are
accepted for `left_image` / `right_image`.

- `inspect_dataset` opens a file once and checks every dataset's presence, rank, shape,
  dtype and length, and that the file holds the data its shapes claim (nothing read from
  other files: storage/hdf5_input.py); any mismatch is a `DataError` naming the file, the
  key, what was expected and what was found. HWC vs CHW is read off the shapes, not taken
  from a flag. Loading checks the values: finite joints, actions and rewards, terminals
  0 or 1.
- `MultimodalDataset` holds the low-dimensional arrays of one or more files in RAM
  (joint, actions, rewards, terminals: a few hundred bytes a transition), the action
  mean/std computed once, and only the *description* of the images: images stay on disk
  and are read per sample (`ImageReader`, used by the prefetch workers).
- `resize_images` is the one CPU resize (torch, bilinear with antialias on uint8).

No asyncio, no processes here: `offline/prefetch.py` runs `ImageReader`s in workers.
"""

from __future__ import annotations

import glob
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import h5py
import numpy as np
import torch
import torch.nn.functional as F

from navrl_daemon.errors import DataError
from navrl_daemon.storage.hdf5_input import check_claimed_size, describe_dtype, open_confined

Layout = Literal["A", "B"]
ImageFormat = Literal["HWC", "CHW"]

CAMERAS = ("left_image", "right_image", "global_image")
ALIASES = {"left_image": "left_wrist_image", "right_image": "right_wrist_image"}
LOWDIM = ("actions", "rewards", "terminals")
# numpy dtype kinds each low-dimensional dataset may have (images: uint8, checked apart).
DTYPE_KINDS = {"/actions": "f", "joint": "f", "/rewards": "fiu", "/terminals": "biu"}
KIND_NAMES = {"f": "a float dtype", "fiu": "a numeric dtype", "biu": "a bool or int dtype"}
# Images read and resized together by an ImageReader: bounds its full-size staging copy.
ROWS_PER_PIECE = 64


@dataclass(frozen=True)
class CameraSpec:
    """Where one camera's images live in a file, and how they are laid out."""

    name: str  # canonical: left_image, right_image, global_image
    path: str  # in the file, e.g. /observations/left_wrist_image
    format: ImageFormat
    height: int
    width: int
    chunk_bytes: int  # 0 when the dataset is contiguous


@dataclass(frozen=True)
class DatasetFile:
    """One checked file: small and picklable, so workers can reopen the file themselves."""

    path: Path
    layout: Layout
    transitions: int  # N: actions; observations hold N + 1
    joint_dim: int
    action_dim: int
    cameras: tuple[CameraSpec, ...]

    @property
    def image_bytes_per_sample(self) -> int:
        return sum(3 * c.height * c.width for c in self.cameras)


# ---------------------------------------------------------------------------- checking


def expand_paths(patterns: Iterable[str]) -> list[Path]:
    """Paths or globs, in the given order, each glob sorted; a pattern matching nothing
    is a `DataError` (a typo should not silently train on less data)."""
    out: list[Path] = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            found = sorted(Path(p) for p in glob.glob(pattern))
            if not found:
                raise DataError(f"dataset pattern {pattern!r}: matches no file")
            out.extend(found)
        else:
            out.append(Path(pattern))
    return out


def open_h5(path: Path, *, cache_bytes: int | None = None) -> h5py.File:
    """Open read-only; every way a file can fail to open becomes a `DataError`, and so
    does a file that reads others (storage/hdf5_input.py)."""
    if not path.exists():
        raise DataError(f"dataset {path}: not found")
    size = path.stat().st_size
    if size == 0:
        raise DataError(f"dataset {path}: empty file")
    if not h5py.is_hdf5(path):
        raise DataError(f"dataset {path}: not an HDF5 file (or its superblock is damaged)")
    kwargs = {}
    if cache_bytes is not None:
        # Slots: a prime well above the number of chunks the cache can hold.
        kwargs = {"rdcc_nbytes": cache_bytes, "rdcc_nslots": 10007, "rdcc_w0": 1.0}
    try:
        return open_confined(path, "dataset", **kwargs)
    except OSError as e:
        # HDF5 compares the end of file with the one its superblock records.
        raise DataError(f"dataset {path}: cannot open ({size} bytes on disk): {e}") from None


def detect_layout(f: h5py.File, path: Path) -> Layout:
    if isinstance(f.get("observations"), h5py.Group):
        return "A"
    if "joint" in f:
        return "B"
    raise DataError(
        f"dataset {path}: key /observations or /joint: expected layout A (/observations/...) "
        f"or B (datasets at the root), found root keys {sorted(f.keys())}"
    )


def inspect_dataset(path: Path, layout: Literal["auto", "A", "B"] = "auto") -> DatasetFile:
    """Check a file's structure once (no data read); see the module docstring."""
    with open_h5(path) as f:
        found = detect_layout(f, path)
        if layout != "auto" and layout != found:
            raise DataError(
                f"dataset {path}: layout: expected {layout} (prefetch.layout), found {found}"
            )
        obs = "/observations/" if found == "A" else "/"
        actions = _dataset(f, path, "/actions", ndim=2)
        n = actions.shape[0]
        if n < 1:
            raise DataError(f"dataset {path}: key /actions: expected at least 1 row, found 0")
        for key in ("/rewards", "/terminals"):
            ds = _dataset(f, path, key, ndim=2)
            _expect_shape(path, key, ds.shape, (n, 1), what="(N, 1) with N = len(actions)")
        joint = _dataset(f, path, obs + "joint", ndim=2)
        _expect_rows(path, obs + "joint", joint.shape, n + 1)
        cameras = tuple(_camera(f, path, obs, name, n + 1) for name in CAMERAS)
        for key, kinds in DTYPE_KINDS.items():
            key = obs + key if key == "joint" else key
            if f[key].dtype.kind not in kinds or f[key].dtype.names:
                raise DataError(
                    f"dataset {path}: key {key}: expected {KIND_NAMES[kinds]}, found "
                    f"{describe_dtype(f[key].dtype)}"
                )
        return DatasetFile(
            path=path,
            layout=found,
            transitions=n,
            joint_dim=joint.shape[1],
            action_dim=actions.shape[1],
            cameras=cameras,
        )


def _dataset(f: h5py.File, path: Path, key: str, *, ndim: int) -> h5py.Dataset:
    ds = f.get(key)
    if not isinstance(ds, h5py.Dataset):
        what = "missing" if ds is None else f"a {type(ds).__name__}"
        raise DataError(f"dataset {path}: key {key}: expected a {ndim}-D dataset, found {what}")
    if ds.ndim != ndim:
        raise DataError(
            f"dataset {path}: key {key}: expected {ndim} dimensions, found shape {ds.shape}"
        )
    check_claimed_size(ds, f"dataset {path}: key {key}")
    return ds


def _expect_rows(path: Path, key: str, shape: tuple[int, ...], rows: int) -> None:
    if shape[0] != rows:
        raise DataError(
            f"dataset {path}: key {key}: expected {rows} rows (N + 1 observations for "
            f"N = {rows - 1} actions), found {shape[0]}"
        )


def _expect_shape(
    path: Path, key: str, shape: tuple[int, ...], want: tuple[int, ...], *, what: str
) -> None:
    if tuple(shape) != want:
        raise DataError(f"dataset {path}: key {key}: expected shape {want} {what}, found {shape}")


def _camera(f: h5py.File, path: Path, obs: str, name: str, rows: int) -> CameraSpec:
    key = obs + name
    if key not in f and name in ALIASES and obs + ALIASES[name] in f:
        key = obs + ALIASES[name]
    if key not in f:
        alias = f" (or {obs + ALIASES[name]})" if name in ALIASES else ""
        raise DataError(
            f"dataset {path}: key {key}{alias}: expected an image dataset "
            "(N+1, H, W, 3) or (N+1, 3, H, W), found missing"
        )
    ds = _dataset(f, path, key, ndim=4)
    _expect_rows(path, key, ds.shape, rows)
    if ds.dtype != np.uint8:
        raise DataError(f"dataset {path}: key {key}: expected dtype uint8, found {ds.dtype}")
    _, a, b, c = ds.shape
    if c == 3 and a != 3:
        fmt: ImageFormat = "HWC"
        height, width = a, b
    elif a == 3 and c != 3:
        fmt, height, width = "CHW", b, c
    else:
        detail = "ambiguous: both" if a == c == 3 else "neither"
        raise DataError(
            f"dataset {path}: key {key}: expected (N+1, H, W, 3) or (N+1, 3, H, W), found "
            f"{ds.shape} ({detail} of axes 1 and 3 hold 3 channels)"
        )
    chunk_bytes = math.prod(ds.chunks) if ds.chunks else 0
    return CameraSpec(name, key, fmt, height, width, chunk_bytes)


# ---------------------------------------------------------------------------- in RAM


@dataclass
class MultimodalDataset:
    """The low-dimensional data of one or more files in RAM; images described, not read.

    Transition `i` (global, over the files in order) holds `joint[i]` and the images of
    observation i, `actions[i]`, `rewards[i]`, `terminals[i]` and `next_joint[i]`.
    """

    files: list[DatasetFile]
    offsets: np.ndarray  # [len(files) + 1], prefix sums of the transitions used per file
    joint: np.ndarray  # [N, J] float32
    next_joint: np.ndarray  # [N, J] float32
    actions: np.ndarray  # [N, A] float32
    rewards: np.ndarray  # [N, 1] float32
    terminals: np.ndarray  # [N, 1] bool
    action_mean: np.ndarray  # [A] float32, over every loaded action
    action_std: np.ndarray  # [A] float32, floored at 1e-6

    @classmethod
    def load(
        cls,
        paths: Sequence[Path],
        *,
        layout: Literal["auto", "A", "B"] = "auto",
        max_samples: int = 0,
    ) -> MultimodalDataset:
        """Check every file, then load up to `max_samples` transitions (0: all), files in
        order, the last one cut short where the limit falls."""
        if not paths:
            raise DataError("datasets: no file given (prefetch.paths is empty)")
        files = [inspect_dataset(Path(p), layout) for p in paths]
        first = files[0]
        for df in files[1:]:
            for attr in ("joint_dim", "action_dim"):
                if getattr(df, attr) != getattr(first, attr):
                    raise DataError(
                        f"dataset {df.path}: {attr}: expected {getattr(first, attr)} "
                        f"(as in {first.path}), found {getattr(df, attr)}"
                    )
        parts: dict[str, list[np.ndarray]] = {k: [] for k in ("joint", "next", *LOWDIM)}
        used: list[DatasetFile] = []
        counts: list[int] = []
        left = max_samples if max_samples > 0 else None
        for df in files:
            n = df.transitions if left is None else min(df.transitions, left)
            if n == 0:
                break
            with open_h5(df.path) as f:
                obs = "/observations/" if df.layout == "A" else "/"
                joint = _read(f, df.path, obs + "joint", n + 1, np.float32)
                parts["joint"].append(joint[:n])
                parts["next"].append(joint[1:])
                for key in ("actions", "rewards"):
                    parts[key].append(_read(f, df.path, "/" + key, n, np.float32))
                terminals = _read(f, df.path, "/terminals", n, None)
            _check_finite(df.path, "/actions", parts["actions"][-1])
            _check_finite(df.path, "/rewards", parts["rewards"][-1])
            _check_finite(df.path, obs + "joint", joint)
            _check_flags(df.path, "/terminals", terminals)
            parts["terminals"].append(terminals.astype(np.bool_))
            used.append(df)
            counts.append(n)
            if left is not None:
                left -= n
        actions = np.concatenate(parts["actions"])
        mean = actions.mean(axis=0, dtype=np.float64)
        std = np.maximum(actions.std(axis=0, dtype=np.float64), 1e-6)
        return cls(
            files=used,
            offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            joint=np.concatenate(parts["joint"]),
            next_joint=np.concatenate(parts["next"]),
            actions=actions,
            rewards=np.concatenate(parts["rewards"]),
            terminals=np.concatenate(parts["terminals"]),
            action_mean=mean.astype(np.float32),
            action_std=std.astype(np.float32),
        )

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def image_bytes(self) -> int:
        """Bytes of the images of the loaded transitions, as stored (uncompressed)."""
        counts = np.diff(self.offsets)
        return int(
            sum(
                int(n) * df.image_bytes_per_sample for n, df in zip(counts, self.files, strict=True)
            )
        )

    def lowdim(self, indices: np.ndarray) -> dict[str, torch.Tensor]:
        """The RAM-resident part of the transitions `indices` (copies)."""
        return {
            "joint": torch.from_numpy(self.joint[indices]),
            "next_joint": torch.from_numpy(self.next_joint[indices]),
            "action": torch.from_numpy(self.actions[indices]),
            "reward": torch.from_numpy(self.rewards[indices]),
            "terminal": torch.from_numpy(self.terminals[indices]),
        }


def _read(f: h5py.File, path: Path, key: str, rows: int, dtype: type | None) -> np.ndarray:
    try:
        return np.asarray(f[key][:rows], dtype=dtype)
    except (OSError, ValueError) as e:
        raise DataError(f"dataset {path}: key {key}: cannot read rows 0..{rows}: {e}") from None


def _check_flags(path: Path, key: str, values: np.ndarray) -> None:
    bad = (values != 0) & (values != 1)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise DataError(
            f"dataset {path}: key {key}: expected 0 or 1 (false or true), found "
            f"{int(bad.sum())} other values (first at row {row}: {values[row].tolist()})"
        )


def _check_finite(path: Path, key: str, values: np.ndarray) -> None:
    bad = ~np.isfinite(values)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise DataError(
            f"dataset {path}: key {key}: expected finite values, found "
            f"{int(bad.sum())} non-finite (first at row {row}: {values[row].tolist()})"
        )


# ---------------------------------------------------------------------------- images


def resize_images(images: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 `[B, 3, H, W]` (any memory format) → uint8 `[B, 3, size, size]`, bilinear
    with antialias. torch's uint8 kernel is fastest on channels-last input, which is what
    a HWC file gives for free."""
    if images.shape[-2:] == (size, size):
        return images
    return F.interpolate(images, size=(size, size), mode="bilinear", antialias=True)


def as_bchw(raw: np.ndarray, fmt: ImageFormat) -> torch.Tensor:
    """A `[B, H, W, 3]` or `[B, 3, H, W]` uint8 array as a `[B, 3, H, W]` view (no copy)."""
    t = torch.from_numpy(raw)
    return t.permute(0, 3, 1, 2) if fmt == "HWC" else t


def contiguous_runs(sorted_indices: np.ndarray) -> list[tuple[int, int, int]]:
    """`(position, start, stop)` for each run of consecutive values in a sorted array."""
    if len(sorted_indices) == 0:
        return []
    breaks = np.flatnonzero(np.diff(sorted_indices) != 1) + 1
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [len(sorted_indices)]])
    return [
        (int(a), int(sorted_indices[a]), int(sorted_indices[b - 1]) + 1)
        for a, b in zip(starts, stops, strict=True)
    ]


class ImageReader:
    """Reads the images of chosen transitions from open files, resized to `size`.

    Reads are per run of consecutive indices, in sorted order (one `read_direct` per run
    and camera), never one fancy-indexed read (h5py wants those increasing and unique,
    and is slow with many of them). Each dataset's chunk cache holds two of its chunks,
    so neighbouring indices that share a chunk decompress it once; capped by
    `cache_bytes`.
    """

    def __init__(
        self, dataset_files: Sequence[DatasetFile], offsets: np.ndarray, size: int, cache_bytes: int
    ) -> None:
        self.files = list(dataset_files)
        self.offsets = offsets
        self.size = size
        self._h5: list[h5py.File] = []
        for df in self.files:
            chunk = max(c.chunk_bytes for c in df.cameras)
            cache = min(cache_bytes, max(1 << 20, 2 * chunk))
            self._h5.append(open_h5(df.path, cache_bytes=cache))

    def read_into(self, sorted_indices: np.ndarray, out: torch.Tensor) -> None:
        """Write the images of `sorted_indices` (global, ascending) into `out`
        `[len, cameras, 3, size, size]` uint8."""
        which = np.searchsorted(self.offsets, sorted_indices, side="right") - 1
        for file_no in np.unique(which):
            rows = np.flatnonzero(which == file_no)
            local = sorted_indices[rows] - self.offsets[file_no]
            self._read_file(int(file_no), local, out[rows[0] : rows[-1] + 1])

    def _read_file(self, file_no: int, local: np.ndarray, out: torch.Tensor) -> None:
        # In pieces of ROWS_PER_PIECE, so the full-size staging copy stays small.
        for a in range(0, len(local), ROWS_PER_PIECE):
            piece = slice(a, a + ROWS_PER_PIECE)
            self._read_piece(file_no, local[piece], out[piece])

    def _read_piece(self, file_no: int, local: np.ndarray, out: torch.Tensor) -> None:
        df, f = self.files[file_no], self._h5[file_no]
        runs = contiguous_runs(local)
        for cam_no, cam in enumerate(df.cameras):
            ds = f[cam.path]
            row_shape = ds.shape[1:]
            raw = np.empty((len(local), *row_shape), dtype=np.uint8)
            # h5py's low-level read: one hyperslab per run, without the high-level
            # selection objects that `read_direct` builds on every call (random batches
            # are mostly runs of one row, so that per-call cost was ~20% of a batch).
            file_space = ds.id.get_space()
            origin = (0,) * len(row_shape)
            for pos, start, stop in runs:
                count = (stop - start, *row_shape)
                try:
                    file_space.select_hyperslab((start, *origin), count)
                    memory_space = h5py.h5s.create_simple(count)
                    ds.id.read(memory_space, file_space, raw[pos : pos + stop - start])
                except (OSError, ValueError, KeyError) as e:
                    raise DataError(
                        f"dataset {df.path}: key {cam.path}: cannot read rows {start}..{stop}: {e}"
                    ) from None
            out[:, cam_no].copy_(resize_images(as_bchw(raw, cam.format), self.size))

    def close(self) -> None:
        for f in self._h5:
            f.close()
        self._h5.clear()
