"""Small stand-ins for the compute a stage drives (no env, no PPO), so a stage test sees
only the stage's own rules: what it sends where, when, and how it stops. Channels, leases,
compute threads and the shutdown are the real ones."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

from navrl_daemon.pipeline.coordinator import SingleProcess
from navrl_daemon.rl.collector import Collector
from navrl_daemon.rl.learner import Learner
from navrl_daemon.rl.rollout import EpisodeStats
from navrl_daemon.rl.run_state import COLLECTOR, LEARNER, RunState


class CountingEnv:
    """Counts the rollouts collected on it; its state is that count."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.rollouts = 0

    def state_dict_env(self) -> dict[str, torch.Tensor]:
        return {"rollouts": torch.tensor(self.rollouts)}

    def load_state_dict_env(self, state: dict[str, torch.Tensor]) -> None:
        """A ResumableEnv (env/contract.py) restores what it saves."""
        self.rollouts = int(state["rollouts"])


class FakeCollector:
    """What the producer uses of rl.training.Collector. Each rollout fills the buffer with
    the number of rollouts collected so far, and with the acting policy's weight."""

    def __init__(self) -> None:
        self.env = CountingEnv()
        self.td = TensorDict({"obs": torch.zeros(2)}, batch_size=[])
        self.policy = torch.nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            self.policy.weight.zero_()  # the weights of version 0
        self.episodes = EpisodeStats("cpu")
        self.sampler = torch.Generator()  # where actions are drawn from (a checkpoint saves it)
        self.capture_error: str | None = None  # why a captured rollout fell back, if it did

    state_dict = Collector.state_dict  # what the real one saves, of what the fake holds

    def collect(self, buffer: TensorDict) -> float:
        self.env.rollouts += 1
        buffer["rollout"].fill_(self.env.rollouts)
        buffer["weight"].fill_(float(self.policy.weight.item()))
        return 0.001


def run_state(learner: Any = None, collector: Any = None) -> RunState:
    """The run's parts as the daemon wires them, of a fake learner and collector."""
    state = RunState()
    if learner is not None:
        state.add(LEARNER, None, learner)
    if collector is not None:
        state.add(COLLECTOR, None, collector)
    return state


def rollout_buffer() -> TensorDict:
    return TensorDict({"rollout": torch.zeros(4), "weight": torch.zeros(4)}, batch_size=[4])


class FakeLearner:
    """What the trainer uses of rl.training.Learner: every update adds the buffer's first
    value to one weight and counts a version."""

    def __init__(self) -> None:
        self.policy = torch.nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            self.policy.weight.zero_()
        self.optimizers = {"actor": torch.optim.SGD(self.policy.parameters(), lr=0.1)}
        self.generator = torch.Generator().manual_seed(0)
        self.version = 0
        self.nonfinite_streak = 0
        self.update_path = "eager"
        self.capture_error: str | None = None
        self.seen: list[float] = []

    state_dict = Learner.state_dict

    def update(
        self, buffer: TensorDict, abort: Any = None, release: Any = None, progress: Any = None
    ) -> dict:
        first = float(buffer["rollout"][0])
        self.seen.append(first)
        with torch.no_grad():
            self.policy.weight.add_(first)
        self.version += 1
        return {"loss": first}

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.policy.state_dict().items()}


class VotingCoordinator(SingleProcess):
    """A coordinator whose other ranks vote to stop at vote `stop_at_vote` (counted from
    1), and which records what it is asked to gather."""

    def __init__(self, stop_at_vote: int | None = None) -> None:
        super().__init__()
        self.stop_at_vote = stop_at_vote
        self.votes = 0
        self.gathered: list[dict[str, Any] | None] = []

    async def agree(self, stopping: bool, stage: int) -> tuple[bool, int]:
        self.votes += 1
        return stopping or self.votes == self.stop_at_vote, stage

    async def gather_collectors(self, state: dict[str, Any] | None) -> dict[str, Any] | None:
        self.gathered.append(state)
        return state
