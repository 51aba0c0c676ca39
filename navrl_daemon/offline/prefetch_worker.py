"""The prefetch worker process (offline/prefetch.py starts it with *spawn*).

Kept apart from prefetch.py so a worker imports only numpy, torch and h5py (not
tensordict): each worker starts faster and stays smaller.
"""

from __future__ import annotations

import os
import signal
from collections import deque
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np
import torch

from navrl_daemon.errors import DataError
from navrl_daemon.offline.datasets import DatasetFile, ImageReader

# How often an idle worker checks that its parent is still the one that started it.
PARENT_POLL_S = 0.5


def worker_main(
    conn: Connection,
    parent_pid: int,
    files: list[DatasetFile],
    offsets: np.ndarray,
    image_size: int,
    cache_bytes: int,
    slot_names: list[str],
    slot_shape: tuple[int, ...],
) -> None:
    """Read the images of each task into its slot until told to stop or orphaned."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    torch.set_num_threads(1)  # one core per worker; parallelism comes from the workers
    try:
        reader = ImageReader(files, offsets, image_size, cache_bytes)
        shms = [SharedMemory(name=n) for n in slot_names]
        slots = [slot_view(s, slot_shape) for s in shms]
    except BaseException as e:
        _send(conn, _error(-1, e))
        return
    _send(conn, ("ready", -1, ""))
    pending: deque[Any] = deque()
    try:
        while True:
            # Take in everything already sent, so a stop request overtakes queued tasks.
            while conn.poll(0 if pending else PARENT_POLL_S):
                pending.append(conn.recv())
                if pending[-1] is None:
                    return
            if os.getppid() != parent_pid:
                return  # orphaned: the parent was killed
            if not pending:
                continue
            seq, slot, indices = pending.popleft()
            try:
                reader.read_into(indices, slots[slot][: len(indices)])
            except Exception as e:
                _send(conn, _error(seq, e))
                return
            if not _send(conn, ("done", seq, "")):
                return
    except (EOFError, OSError):
        return  # the parent's end of the pipe closed: it is gone
    finally:
        reader.close()


def slot_view(shm: SharedMemory, shape: tuple[int, ...]) -> torch.Tensor:
    """A `[B, cameras, S, S, 3]` slot as a `[B, cameras, 3, S, S]` view (no copy)."""
    return torch.from_numpy(np.ndarray(shape, np.uint8, buffer=shm.buf)).permute(0, 1, 4, 2, 3)


def _send(conn: Connection, msg: tuple[str, int, str]) -> bool:
    """Send to the parent; False when it is gone."""
    try:
        conn.send(msg)
        return True
    except (OSError, ValueError):
        return False


def _error(seq: int, e: BaseException) -> tuple[str, int, str]:
    if isinstance(e, DataError):
        return ("data_error", seq, str(e))
    return ("error", seq, f"{type(e).__name__}: {e}")
