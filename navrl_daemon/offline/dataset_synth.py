"""Synthetic multimodal datasets (layout A or B, HWC or CHW) whose actions come from a
known policy of the observations, so behaviour cloning has something exact to learn.

The policy (`synth_policy`) is `tanh(joint @ W_JOINT + image_means @ W_IMAGE)`: each
action depends on the 16 joint values and on the mean of each colour channel of each of
the three cameras (scaled to [0, 1]). Each image is a per-channel brightness plus a
texture drawn from a small bank, so it is as incompressible as a photo and its channel
means vary from sample to sample. The joint is an AR(1) process; rewards and terminals
are plausible filler (episodes of `EPISODE_LENGTH` steps).

Written in blocks of rows (bounded memory at any file size) to a temp file in the same
directory, renamed into place when complete.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import h5py
import numpy as np

from navrl_daemon.offline.datasets import ALIASES, CAMERAS
from navrl_daemon.storage.atomic import fsync_dir

JOINT_DIM = 16
ACTION_DIM = 4
EPISODE_LENGTH = 100
TEXTURES = 16
_POLICY_RNG = np.random.default_rng(20240606)  # fixed: the policy is the same for every seed
W_JOINT = (_POLICY_RNG.standard_normal((JOINT_DIM, ACTION_DIM)) * 0.2).astype(np.float32)
W_IMAGE = (_POLICY_RNG.standard_normal((3 * len(CAMERAS), ACTION_DIM)) * 1.5).astype(np.float32)
IMAGE_BIAS = -W_IMAGE.sum(axis=0) * 0.5  # centres the image term for means around 0.5


def synth_policy(joint: np.ndarray, image_means: np.ndarray) -> np.ndarray:
    """Actions `[B, 4]` from `joint [B, 16]` and `image_means [B, 9]` (camera-major, RGB,
    each in [0, 1])."""
    return np.tanh(joint @ W_JOINT + image_means @ W_IMAGE + IMAGE_BIAS).astype(np.float32)


@dataclass(frozen=True)
class SynthSpec:
    samples: int  # N transitions (N + 1 observations)
    layout: Literal["A", "B"] = "A"
    image_format: Literal["HWC", "CHW"] = "HWC"
    height: int = 256
    width: int = 256
    wrist_aliases: bool = False
    chunk_rows: int = 1  # rows per HDF5 chunk of the image datasets (0: contiguous)
    compression: Literal["none", "lzf", "gzip"] = "none"
    seed: int = 0

    def image_shape(self) -> tuple[int, int, int]:
        h, w = self.height, self.width
        return (h, w, 3) if self.image_format == "HWC" else (3, h, w)

    @property
    def bytes_per_observation(self) -> int:
        return len(CAMERAS) * 3 * self.height * self.width + 4 * JOINT_DIM


def samples_for_bytes(target: int, height: int, width: int) -> int:
    return max(1, target // (len(CAMERAS) * 3 * height * width + 4 * JOINT_DIM))


def write_synth(path: Path, spec: SynthSpec, *, block_rows: int = 256) -> dict[str, object]:
    """Write the dataset `spec` describes to `path`; returns a summary."""
    if spec.samples < 1:
        raise ValueError(f"samples: at least 1, got {spec.samples}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".tmp-", suffix=".h5", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        _write(tmp, spec, block_rows)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return {
        "path": str(path),
        "layout": spec.layout,
        "image_format": spec.image_format,
        "samples": spec.samples,
        "image_size": [spec.height, spec.width],
        "bytes": path.stat().st_size,
        "seed": spec.seed,
    }


def _write(path: Path, spec: SynthSpec, block_rows: int) -> None:
    rng = np.random.default_rng(spec.seed)
    n, rows = spec.samples, spec.samples + 1
    obs = "observations/" if spec.layout == "A" else ""
    names = [ALIASES.get(c, c) if spec.wrist_aliases else c for c in CAMERAS]
    shape = spec.image_shape()
    chunks = (spec.chunk_rows, *shape) if spec.chunk_rows > 0 else None
    compression = None if spec.compression == "none" else spec.compression
    if compression is not None and chunks is None:
        chunks = (1, *shape)
    # Texture bank (HWC), values in [-30, 30]. CHW files hold the transposed images, so a
    # CHW and a HWC file of the same seed hold the same pictures.
    hwc = (spec.height, spec.width, 3)
    bank = rng.integers(-30, 31, size=(len(CAMERAS), TEXTURES, *hwc), dtype=np.int16)

    joint = np.empty((rows, JOINT_DIM), dtype=np.float32)
    joint[0] = rng.standard_normal(JOINT_DIM)
    noise = rng.standard_normal((rows, JOINT_DIM)).astype(np.float32)
    for i in range(1, rows):
        joint[i] = 0.9 * joint[i - 1] + 0.45 * noise[i]

    with h5py.File(path, "w") as f:
        f.attrs["generator"] = "navrl-daemon dataset synth"
        f.attrs["seed"] = spec.seed
        f.create_dataset(obs + "joint", data=joint)
        images = [
            f.create_dataset(
                obs + name,
                shape=(rows, *shape),
                dtype=np.uint8,
                chunks=chunks,
                compression=compression,
            )
            for name in names
        ]
        actions = np.empty((n, ACTION_DIM), dtype=np.float32)
        for start in range(0, rows, block_rows):
            stop = min(rows, start + block_rows)
            means = np.empty((stop - start, 3 * len(CAMERAS)), dtype=np.float32)
            for cam, ds in enumerate(images):
                block = _images(rng, bank[cam], stop - start)
                means[:, 3 * cam : 3 * cam + 3] = block.mean(axis=(1, 2)) / 255.0
                ds[start:stop] = (
                    block if spec.image_format == "HWC" else block.transpose(0, 3, 1, 2)
                )
            last = min(stop, n)
            if start < last:
                actions[start:last] = synth_policy(joint[start:last], means[: last - start])
        f.create_dataset("actions", data=actions)
        rewards = -np.abs(joint[1:, :ACTION_DIM]).mean(axis=1, keepdims=True)
        f.create_dataset("rewards", data=rewards.astype(np.float32))
        terminals = (np.arange(1, rows) % EPISODE_LENGTH == 0).reshape(n, 1)
        f.create_dataset("terminals", data=terminals)


def _images(rng: np.random.Generator, bank: np.ndarray, count: int) -> np.ndarray:
    """`count` HWC images: a brightness per channel in [50, 205] plus a texture of `bank`."""
    brightness = rng.integers(50, 206, size=(count, 1, 1, 3), dtype=np.int16)
    textures = bank[rng.integers(0, len(bank), size=count)]
    return np.clip(textures + brightness, 0, 255).astype(np.uint8)
