"""HDF5 files a user names (offline datasets, rollout archives): read from that file only.

HDF5 lets a file pull data from others: external links, virtual datasets (VDS, whose
missing sources even read as fill values) and external raw storage. `open_confined`
refuses a file that holds any of them, and a soft link that loops, so every byte read
comes from the named file. `check_claimed_size` refuses a dataset whose shape claims more
than its file can hold, before anything is allocated for it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from navrl_daemon.errors import DataError

MAX_LINKS = 100_000  # a dataset or archive file holds tens; bounds the walk itself
# How many bytes one stored byte may decompress to: deflate's ceiling is about 1032:1.
MAX_EXPANSION = 1100


def open_confined(path: Path, what: str, **kwargs: Any) -> h5py.File:
    """`h5py.File(path, "r", **kwargs)`, refused (DataError naming `what` and `path`) when
    anything in it reads outside the file. OSError from opening is the caller's to word."""
    f = h5py.File(path, "r", **kwargs)
    try:
        _confine(f, f"{what} {path}")
    except BaseException:
        f.close()
        raise
    return f


def _confine(f: h5py.File, where: str) -> None:
    seen = 0

    def visit(name: str, link: Any) -> str | None:
        # A problem is returned, not raised: h5py stops the walk at a non-None value, and
        # an exception raised inside its callback leaves its lock in error.
        nonlocal seen
        seen += 1
        if seen > MAX_LINKS:
            return f"more than {MAX_LINKS} links; not a dataset file"
        return _outside(f, name, link)

    try:
        problem = f.visititems_links(visit)
    except (RuntimeError, KeyError, OSError, ValueError) as e:
        raise DataError(f"{where}: cannot walk its groups: {e}") from None
    if problem is not None:
        raise DataError(f"{where}: {problem}")


def _outside(f: h5py.File, name: str, link: Any) -> str | None:
    """Why the object `link` names reads outside the file (None: it does not)."""
    if isinstance(link, h5py.ExternalLink):
        return (
            f"key /{name}: an external link to {link.filename}:{link.path}; its data must "
            "be in the file itself"
        )
    if isinstance(link, h5py.SoftLink):
        try:
            f.get(name)
        except (RuntimeError, KeyError) as e:  # HDF5: "too many links"
            return f"key /{name}: a soft link to {link.path} that loops ({e})"
        return None
    if not isinstance(link, h5py.HardLink):
        return f"key /{name}: a {type(link).__name__}, not a plain link"
    obj = f.get(name)
    if not isinstance(obj, h5py.Dataset):
        return None
    if obj.is_virtual:
        return (
            f"key /{name}: a virtual dataset (its data lies in other files); copy the data "
            "into the file"
        )
    if obj.external:
        return (
            f"key /{name}: external storage in {obj.external[0][0]!r}; its data must be in "
            "the file itself"
        )
    return None


def check_claimed_size(ds: h5py.Dataset, where: str, *, unwritten: int | None = 0) -> None:
    """Refuse `ds` when its shape claims more bytes than its file can hold (more than
    MAX_EXPANSION times the file's size), or more than `unwritten` of its chunks were never
    written (they would read as fill values; None: not checked). `where`: "dataset FILE:
    key KEY"."""
    claimed = math.prod(ds.shape) * ds.dtype.itemsize
    if claimed == 0:
        return
    file_bytes = ds.file.id.get_filesize()
    if claimed > MAX_EXPANSION * file_bytes:
        raise DataError(
            f"{where}: shape {ds.shape} claims {claimed:,} bytes; the file holds "
            f"{file_bytes:,}, too few for that however compressed"
        )
    if unwritten is None:
        return
    if ds.chunks is None:
        stored = ds.id.get_storage_size()
        if stored < claimed:
            raise DataError(
                f"{where}: shape {ds.shape} claims {claimed:,} bytes, {stored:,} written"
            )
        return
    chunks = math.prod(-(-n // c) for n, c in zip(ds.shape, ds.chunks, strict=True))
    stored = ds.id.get_num_chunks()
    if stored + unwritten < chunks:
        raise DataError(
            f"{where}: shape {ds.shape} claims {chunks:,} chunks of data, {stored:,} written"
        )


def describe_dtype(dtype: np.dtype) -> str:
    """A dtype as a message says it: h5py stores strings, references and variable-length
    data as numpy `object`, which says nothing."""
    if h5py.check_string_dtype(dtype) is not None or dtype.kind in "SU":
        return f"strings ({dtype})"
    if h5py.check_dtype(ref=dtype) is not None:
        return "object references"
    if h5py.check_vlen_dtype(dtype) is not None:
        return "variable-length sequences"
    if dtype.names:
        return f"a compound type ({dtype})"
    return str(dtype)
