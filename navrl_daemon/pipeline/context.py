"""RunContext: what every part of the wiring needs, built once by `serve`; and what the
offline objectives (navrl_daemon/offline/) provide to it, handed in by the command that
runs the daemon, so the training core never imports them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from navrl_daemon.config import Config
from navrl_daemon.pipeline.cadence import Cadence
from navrl_daemon.pipeline.coordinator import Coordinator
from navrl_daemon.pipeline.telemetry import Telemetry
from navrl_daemon.rl.ppo import AuxLoss
from navrl_daemon.runtime.compute import ComputeThreads
from navrl_daemon.runtime.distributed import World
from navrl_daemon.runtime.supervisor import Shutdown, Stage
from navrl_daemon.stages.trainer import Trainer


@dataclass(frozen=True)
class RunContext:
    cfg: Config
    state_dir: Path
    device: torch.device
    shutdown: Shutdown
    threads: ComputeThreads  # where each stage's torch work runs
    telemetry: Telemetry  # where the stages' reports go
    coordinator: Coordinator  # what the ranks agree on (alone: SingleProcess)
    cadence: Cadence  # which iterations checkpoint, archive, evaluate; frames per iteration
    # The offline objectives, where the caller provides them (`navrl-daemon run` does).
    offline: OfflineObjectives | None = None

    @property
    def world(self) -> World:
        return self.coordinator.world


class PPOExtraTerm(Protocol):
    """What "ppo+bc" adds to a PPO run: a loss term of every update, the stage that feeds
    it, and the trainer that hands that stage's batches on."""

    term: AuxLoss

    def prefetcher(self, updates_done: int) -> Stage: ...

    def trainer(self, trainer: Trainer) -> Stage: ...


class OfflineObjectives(Protocol):
    """`offline.objective` other than "none" (navrl_daemon/offline/wiring.py)."""

    def refuse_distributed(self, cfg: Config, distributed: bool) -> None:
        """ConfigError (78) where the objective cannot run under torchrun."""
        ...

    def bc_stages(self, ctx: RunContext) -> list[Stage]:
        """The stages of "bc": no env, prefetched batches into an offline trainer."""
        ...

    def ppo_plus_bc(self, ctx: RunContext) -> PPOExtraTerm:
        """The BC term of "ppo+bc", made before the learner it is part of."""
        ...
