"""What travels between stages: typed messages, never a free-form dict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase

from navrl_daemon.rl.curriculum import Progress
from navrl_daemon.runtime.leases import Lease
from navrl_daemon.storage.staging import StagedState


@dataclass(frozen=True)
class PolicyWeights:
    """A detached copy of the trained policy's weights after `version` updates (the
    version is also the iteration: one update per iteration)."""

    version: int
    frames: int
    state: dict[str, torch.Tensor]


@dataclass(frozen=True)
class Snapshot:
    """The full training state after `iteration` updates, staged on the host for the
    checkpoint writer; `final` marks the one taken at shutdown."""

    iteration: int
    frames: int
    staged: StagedState
    final: bool = False


@dataclass(frozen=True)
class Rollout:
    """A collected rollout, as the producer hands it to the trainer: the leased buffer
    (release it once read) and what the producer knows about it."""

    lease: Lease[TensorDictBase]
    iteration: int  # rollout i: the update on it makes policy version i + 1
    policy_version: int  # the weights that collected it
    collect_s: float
    # Finished-episode stat sums and count of this rollout (every rank's).
    episodes: tuple[torch.Tensor, torch.Tensor]
    # The collector's state right after this rollout, when the update on it is
    # checkpointed (every rank's, on rank 0); None otherwise.
    collector_state: dict[str, Any] | None = None
    # With `pipeline.trainer_stream`: a CUDA event recorded on the producer's stream right
    # after the rollout's last kernel, which the trainer's stream waits for.
    ready: torch.cuda.Event | None = None


@dataclass(frozen=True)
class FinalCollectorState:
    """What the producer sends the trainer once every rank has stopped, for the final
    snapshot: the collector's state after the last rollout (every rank's, on rank 0)."""

    state: dict[str, Any] | None  # None: the env cannot save its state


@dataclass(frozen=True)
class CurriculumProgress:
    """What the evaluator's curriculum decided after an evaluation, for the producer to
    apply between rollouts: the stage training should be at, and the passes in a row."""

    progress: Progress
