"""One daemon process as one rank of a torch.distributed run started by torchrun.

`World.from_environ()` reads the launcher's RANK, LOCAL_RANK, WORLD_SIZE (and
LOCAL_WORLD_SIZE); without them, or with WORLD_SIZE=1, the process is a plain single
daemon. The process groups a distributed run opens, and what goes over them, are the
pipeline's (pipeline/ranks.py): this layer knows no RL.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from navrl_daemon.errors import ConfigError


@dataclass(frozen=True)
class World:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> World:
        env = os.environ if environ is None else environ
        if "WORLD_SIZE" not in env:
            return cls()
        try:
            world = cls(
                rank=int(env.get("RANK", "0")),
                local_rank=int(env.get("LOCAL_RANK", "0")),
                world_size=int(env["WORLD_SIZE"]),
                local_world_size=int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])),
            )
        except ValueError as err:
            raise ConfigError(f"launcher environment: {err}") from None
        if not 0 <= world.rank < world.world_size or world.local_rank < 0:
            raise ConfigError(
                f"launcher environment: RANK={world.rank}, LOCAL_RANK={world.local_rank}, "
                f"WORLD_SIZE={world.world_size} do not fit together"
            )
        return world

    def device(self, base: str) -> torch.device:
        """`cuda` → this rank's `cuda:LOCAL_RANK`; anything else as it is."""
        if self.distributed and base == "cuda":
            return torch.device("cuda", self.local_rank)
        return torch.device(base)
