"""Start ranks the way torchrun does: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT."""

from __future__ import annotations

import os
import socket

from tests.conftest import SUBPROCESS_ENV


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_env(rank: int, world: int, port: int, local_world: int | None = None) -> dict[str, str]:
    local_world = world if local_world is None else local_world
    return {
        **os.environ,
        **SUBPROCESS_ENV,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank % local_world),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(local_world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
