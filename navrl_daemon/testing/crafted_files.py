"""Crafted input files, each with a part of the message a command must refuse it with
(exit 65): policy files (`.pt`), checkpoints (`.nrc`) and HDF5 datasets.

Written by the tests (tests/test_cli_crafted_policies.py, tests/offline/test_crafted_datasets.py)
and by benchmarks/crafted_files.py, which runs every one through its commands;
benchmarks/faults.py builds its lying checkpoint on `nrc_container`. A payload pickle runs
`touch MARKER` if anything unpickles it without `weights_only`: the marker file must never
appear.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import h5py
import lz4.frame
import numpy as np
import torch

from navrl_daemon.offline.dataset_synth import SynthSpec, write_synth
from navrl_daemon.storage.checkpoint import CODEC, FORMAT_VERSION, MAGIC, encode_checkpoint

WEIGHT = "actor.module.0.module.alpha_layer.weight"  # any float weight of NavRL's policy
HUGE_ROWS = 10**12


@dataclass(frozen=True)
class Crafted:
    path: Path
    reason: str  # a part of the refusal's message


class Payload:
    """Unpickled without `weights_only`, runs `touch MARKER` (os.system pickles as
    `posix.system`)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[[str], int], tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def torch_bytes(obj: object, *, zip_format: bool = True) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=zip_format)
    return buf.getvalue()


def nrc_container(raw: bytes, iteration: int = 1, payload: bytes | None = None) -> bytes:
    """A `.nrc` around any `torch.save` bytes, its checksum right: the format's container
    written out here so that nothing in the project's writer refuses the contents.
    `payload`: the stored bytes, where they are not `raw` compressed (a frame that lies)."""
    payload = lz4.frame.compress(raw) if payload is None else payload
    header = {
        "format_version": FORMAT_VERSION,
        "iteration": iteration,
        "frames": iteration,
        "policy_version": iteration,
        "created": 0.0,
        "codec": CODEC,
        "level": 0,
        "raw_bytes": len(raw),
        "stored_bytes": len(payload),
        "checksum": f"crc32:{zlib.crc32(payload):08x}",
        "chunks": [len(payload)],
        "meta": {},
    }
    head = json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(head)) + head + payload


def _with(valid: dict[str, torch.Tensor], key: str, value: object) -> dict[str, object]:
    return {**valid, key: value}


def _nan(valid: dict[str, torch.Tensor], value: float) -> dict[str, torch.Tensor]:
    weight = valid[WEIGHT].clone()
    weight[0, 0] = value
    return {**valid, WEIGHT: weight}


def policy_contents(valid: dict[str, torch.Tensor], marker: Path) -> dict[str, tuple[object, str]]:
    """What a policy file may hold instead of NavRL's state_dict, and why it is refused;
    the same in a `.pt` and in a checkpoint's `learner.policy`."""
    shrunk = valid[WEIGHT][:-1].clone()
    return {
        "payload": ({**valid, "x": Payload(marker)}, "unsupported GLOBAL posix.system"),
        "int_keys": ({i: v for i, v in enumerate(valid.values())}, "key 0 is not a str"),
        "nan_weight": (_nan(valid, float("nan")), "non-finite"),
        "inf_weight": (_nan(valid, float("inf")), "non-finite"),
        "sparse": (_with(valid, WEIGHT, valid[WEIGHT].to_sparse()), "sparse"),
        "meta": (_with(valid, WEIGHT, torch.empty_like(valid[WEIGHT], device="meta")), "meta"),
        "complex64": (_with(valid, WEIGHT, valid[WEIGHT].to(torch.complex64)), "complex64"),
        "int_weights": (_with(valid, WEIGHT, valid[WEIGHT].to(torch.int64)), "int64"),
        "list": (list(valid.values()), "a list, not a state_dict"),
        "not_tensor": (_with(valid, WEIGHT, 1.5), "a float, not a tensor"),
        "wrong_shape": (_with(valid, WEIGHT, shrunk), "wrong shape"),
        "missing_key": ({k: v for k, v in valid.items() if k != WEIGHT}, "missing"),
        "unexpected_key": (_with(valid, "extra.weight", torch.zeros(2)), "unexpected"),
    }


def policy_files(valid: dict[str, torch.Tensor], out: Path, marker: Path) -> dict[str, Crafted]:
    """Crafted `.pt` files: bytes torch cannot read, and every `policy_contents`."""
    out.mkdir(parents=True, exist_ok=True)
    whole = torch_bytes(valid)
    legacy = torch_bytes(valid, zip_format=False)
    raw = {
        "text": (b"hello world\n", "neither torch's zip archive nor a pickle"),
        "empty": (b"", "empty"),
        "nrc0_garbage": (
            b"NRC0" + bytes(range(256)) * 4,
            "neither torch's zip archive nor a pickle",
        ),
        "truncated_zip": (whole[: len(whole) // 2], "failed reading zip archive"),
        "truncated_pickle": (legacy[: len(legacy) // 2], "truncated"),
    }
    files = {}
    for name, (data, reason) in raw.items():
        path = out / f"{name}.pt"
        path.write_bytes(data)
        files[name] = Crafted(path, reason)
    for name, (contents, reason) in policy_contents(valid, marker).items():
        path = out / f"{name}.pt"
        path.write_bytes(torch_bytes(contents))
        files[name] = Crafted(path, reason)
    return files


def accepted_policy_files(valid: dict[str, torch.Tensor], out: Path) -> dict[str, Path]:
    """Policy files that are read (bfloat16, float64: converted to float32; in float16,
    NavRL's value normaliser overflows, and the file is refused as non-finite)."""
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for dtype in (torch.bfloat16, torch.float64):
        path = out / f"{str(dtype).removeprefix('torch.')}.pt"
        path.write_bytes(torch_bytes({k: v.to(dtype) for k, v in valid.items()}))
        files[path.stem] = path
    return files


def checkpoint_files(valid: dict[str, torch.Tensor], out: Path, marker: Path) -> dict[str, Crafted]:
    """Crafted `.nrc` checkpoints, each with a right checksum: a learner or policy of the
    wrong type, a payload, and every `policy_contents` as the `learner.policy`."""
    out.mkdir(parents=True, exist_ok=True)
    contents: dict[str, tuple[object, str]] = {
        "learner_list": ({"kind": "full", "learner": [1, 2]}, "learner is a list"),
        "policy_str": ({"kind": "full", "learner": {"policy": "weights"}}, "policy is a str"),
        "no_learner": ({"kind": "full"}, "holds no learner.policy"),
        "payload_state": ({"kind": "full", "x": Payload(marker)}, "posix.system"),
    }
    for name, (policy, reason) in policy_contents(valid, marker).items():
        contents[f"policy_{name}"] = ({"kind": "full", "learner": {"policy": policy}}, reason)
    files = {}
    for name, (state, reason) in contents.items():
        path = out / f"{name}.nrc"
        path.write_bytes(nrc_container(torch_bytes(state)))
        files[name] = Crafted(path, reason)
    garbage = out / "header_only.nrc"
    garbage.write_bytes(MAGIC + struct.pack("<I", 2) + b"{}")
    files["header_only"] = Crafted(garbage, "format_version")
    return files


def valid_checkpoint(valid: dict[str, torch.Tensor], path: Path) -> Path:
    """A warm-start checkpoint (what `checkpoints import` writes) of `valid`."""
    state = {"kind": "warm_start", "learner": {"policy": valid}}
    path.write_bytes(encode_checkpoint(state, iteration=1, frames=0, policy_version=0))
    return path


# ---------------------------------------------------------------------------- HDF5

SMALL_DATASET = SynthSpec(samples=40, layout="A", height=8, width=8, chunk_rows=1)
LOWDIM_KEYS = ("actions", "rewards", "terminals", "observations/joint")


def _edited(src: Path, dst: Path, edit: Callable[[h5py.File], None]) -> Path:
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        edit(f)
    return dst


def _replace(key: str, make: Callable[[h5py.File, str], None]) -> Callable[[h5py.File], None]:
    def edit(f: h5py.File) -> None:
        del f[key]
        make(f, key)

    return edit


def _virtual(source: Path) -> Callable[[h5py.File, str], None]:
    def make(f: h5py.File, key: str) -> None:
        shape = (SMALL_DATASET.samples, 4)
        layout = h5py.VirtualLayout(shape=shape, dtype=np.float32)
        layout[:] = h5py.VirtualSource(str(source), "/actions", shape=shape)
        f.create_virtual_dataset(key, layout, fillvalue=0)

    return make


def _external_storage(raw: Path) -> Callable[[h5py.File, str], None]:
    def make(f: h5py.File, key: str) -> None:
        shape = (SMALL_DATASET.samples, 4)
        raw.write_bytes(np.ones(shape, np.float32).tobytes())
        f.create_dataset(key, shape=shape, dtype=np.float32, external=[(str(raw), 0, 4 * 160)])

    return make


def _huge(f: h5py.File) -> None:
    """Every dataset claims 10**12 transitions, consistently, with no data written."""
    for key in [*LOWDIM_KEYS, *(f"observations/{c}" for c in _cameras(f))]:
        old = f[key]
        rows = HUGE_ROWS + (1 if key.startswith("observations/") else 0)
        shape, chunks, dtype = (rows, *old.shape[1:]), (1, *old.shape[1:]), old.dtype
        del f[key]
        f.create_dataset(key, shape=shape, chunks=chunks, dtype=dtype)


def _cameras(f: h5py.File) -> list[str]:
    return [k for k in f["observations"] if k != "joint"]


def _soft_loop(f: h5py.File) -> None:
    del f["actions"]
    f["actions"] = h5py.SoftLink("/loop")
    f["loop"] = h5py.SoftLink("/actions")


def _references(f: h5py.File, rows: int) -> np.ndarray:
    return np.array([[f["actions"].ref]] * rows, dtype=h5py.ref_dtype)


def _set(key: str, row: int, value: object) -> Callable[[h5py.File], None]:
    def edit(f: h5py.File) -> None:
        data = f[key][:]
        data[row] = value
        f[key][...] = data

    return edit


def dataset_files(out: Path) -> dict[str, Crafted]:
    """Crafted HDF5 datasets, each a copy of one small valid file (`valid.h5`) changed."""
    out.mkdir(parents=True, exist_ok=True)
    valid, other = out / "valid.h5", out / "other.h5"
    write_synth(valid, SMALL_DATASET)
    write_synth(other, SynthSpec(**{**SMALL_DATASET.__dict__, "seed": 1}))
    n = SMALL_DATASET.samples
    edits: dict[str, tuple[Callable[[h5py.File], None], str]] = {
        "external_link": (
            _replace("actions", lambda f, k: f.__setitem__(k, h5py.ExternalLink(str(other), k))),
            "external link",
        ),
        "external_link_group": (
            _replace(
                "observations",
                lambda f, k: f.__setitem__(k, h5py.ExternalLink(str(other), "/observations")),
            ),
            "external link",
        ),
        "virtual_dataset": (_replace("actions", _virtual(other)), "virtual dataset"),
        "virtual_missing_source": (
            _replace("actions", _virtual(out / "missing.h5")),
            "virtual dataset",
        ),
        "external_storage": (
            _replace("actions", _external_storage(out / "actions.raw")),
            "external storage",
        ),
        "huge_rows": (_huge, "claims"),
        "soft_link_loop": (_soft_loop, "soft link"),
        "reference_dtype": (
            _replace("rewards", lambda f, k: f.create_dataset(k, data=_references(f, n))),
            "object references",
        ),
        "string_terminals": (
            _replace("terminals", lambda f, k: f.create_dataset(k, data=[[b"False"]] * n)),
            "strings",
        ),
        "terminal_two": (
            _replace("terminals", lambda f, k: f.create_dataset(k, data=np.full((n, 1), 2))),
            "0 or 1",
        ),
        "nan_rewards": (_set("rewards", 3, np.nan), "key /rewards: expected finite"),
        "inf_joint": (_set("observations/joint", 7, np.inf), "expected finite"),
    }
    files = {}
    for name, (edit, reason) in edits.items():
        files[name] = Crafted(_edited(valid, out / f"{name}.h5", edit), reason)
    return files


def archive_files(valid: Path, out: Path) -> dict[str, Crafted]:
    """Crafted copies of a valid rollout archive `valid`: an index column that is an
    external link or a virtual dataset into an untouched copy, or that claims 10**12 rows."""
    out.mkdir(parents=True, exist_ok=True)
    other = out / "other" / valid.name
    other.parent.mkdir(exist_ok=True)
    shutil.copy(valid, other)

    def external(f: h5py.File) -> None:
        del f["index/iteration"]
        f["index/iteration"] = h5py.ExternalLink(str(other), "/index/iteration")

    def virtual(f: h5py.File) -> None:
        ds = f["index/env"]
        layout = h5py.VirtualLayout(shape=ds.shape, dtype=ds.dtype)
        layout[:] = h5py.VirtualSource(str(other), "/index/env", shape=ds.shape)
        del f["index/env"]
        f.create_virtual_dataset("index/env", layout)

    def huge(f: h5py.File) -> None:
        del f["index/iteration"]
        f.create_dataset("index/iteration", shape=(HUGE_ROWS,), chunks=(1024,), dtype=np.int64)

    edits = {
        "external_link": (external, "key /index/iteration: an external link"),
        "virtual_dataset": (virtual, "key /index/env: a virtual dataset"),
        "huge_index": (huge, f"index/iteration: shape ({HUGE_ROWS},) claims"),
    }
    return {
        name: Crafted(_edited(valid, out / f"{name}-{valid.name}", edit), reason)
        for name, (edit, reason) in edits.items()
    }
