"""RunContext: what every part of the wiring needs, built once by `serve`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from navrl_daemon.config import Config
from navrl_daemon.pipeline.cadence import Cadence
from navrl_daemon.pipeline.coordinator import Coordinator
from navrl_daemon.pipeline.telemetry import Telemetry
from navrl_daemon.runtime.compute import ComputeThreads
from navrl_daemon.runtime.distributed import World
from navrl_daemon.runtime.supervisor import Shutdown


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

    @property
    def world(self) -> World:
        return self.coordinator.world
