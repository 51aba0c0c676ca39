"""NavRL's policy/value network in plain torch, with NavRL's state_dict layout
(navrl-task §2).

NavRL built the network from tensordict/torchrl wrappers (TensorDictModule, Rearrange,
CatTensors) and lazy layers. Their nesting is visible in the checkpoint's key names
(`feature_extractor.module.0.module.7.weight`), so this module mirrors it: `Keyed` stands in
for a TensorDictModule (a `.module` attribute) and parameter-free layers keep their
Sequential slots, so the published checkpoint loads with `strict=True` and ours export back
to the same 37 keys.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from tensordict import TensorDictBase
from torch import nn
from torch.distributions import Beta, Independent

from navrl_daemon.config import Config
from navrl_daemon.config.execution_plan import lidar_lowering
from navrl_daemon.rl.gae import GAE
from navrl_daemon.rl.lidar_cnn import LidarCNN, Lowering
from navrl_daemon.rl.value_norm import ValueNorm

FEATURE_DIM = 256
SHARED_EXTRACTOR = "feature_extractor."
CRITIC_EXTRACTOR = "critic_extractor."
ACTION_DIM = 3
OBS_KEY = ("agents", "observation")


class Keyed(nn.Module):
    """Stand-in for tensordict's TensorDictModule: only its `.module` nesting, for the keys."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.module(*args)


class Concat(nn.Module):
    """Stand-in for torchrl's CatTensors (slot 2 of the feature extractor, no parameters).

    CatTensors sorted its keys, so NavRL's trunk input is [cnn 128 | dynamic 64 | state 8],
    not the order written in NavRL's code (navrl-task §2).
    """

    def forward(self, *features: torch.Tensor) -> torch.Tensor:
        return torch.cat(features, dim=-1)


class BetaHead(nn.Module):
    """α, β = 1 + softplus(linear) + 1e-6 per axis, so the Beta is unimodal."""

    def __init__(self, in_features: int = FEATURE_DIM, action_dim: int = ACTION_DIM) -> None:
        super().__init__()
        self.alpha_layer = nn.Linear(in_features, action_dim)
        self.beta_layer = nn.Linear(in_features, action_dim)

    def forward(self, feature: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        alpha = 1.0 + F.softplus(self.alpha_layer(feature)) + 1e-6
        beta = 1.0 + F.softplus(self.beta_layer(feature)) + 1e-6
        return alpha, beta


def make_mlp(in_features: int, units: list[int]) -> nn.Sequential:
    """NavRL's make_mlp: Linear → LeakyReLU → LayerNorm per width (activation before norm)."""
    layers: list[nn.Module] = []
    for width in units:
        layers += [nn.Linear(in_features, width), nn.LeakyReLU(), nn.LayerNorm(width)]
        in_features = width
    return nn.Sequential(*layers)


def make_feature_extractor(lidar_conv: Lowering = "auto") -> Keyed:
    """NavRL's feature extractor: LiDAR CNN, obstacle MLP, concatenation, trunk."""
    return Keyed(
        nn.ModuleList(
            [
                Keyed(LidarCNN(lidar_conv)),
                # slot 0 is NavRL's Rearrange: 5 obstacles × 10 features → 50
                Keyed(nn.Sequential(nn.Flatten(start_dim=-3), make_mlp(50, [128, 64]))),
                Concat(),
                Keyed(make_mlp(128 + 64 + 8, [FEATURE_DIM, FEATURE_DIM])),
            ]
        )
    )


def extract(
    extractor: Keyed, state: torch.Tensor, lidar: torch.Tensor, dynamic_obstacle: torch.Tensor
) -> torch.Tensor:
    """`extractor`'s feature [B…,256] of the observation's parts (any leading batch dims)."""
    lead = state.shape[:-1]
    cnn, dynamic, concat, trunk = extractor.module
    x = concat(
        cnn(lidar.reshape(-1, *lidar.shape[-3:])),
        dynamic(dynamic_obstacle.reshape(-1, *dynamic_obstacle.shape[-3:])),
        state.reshape(-1, state.shape[-1]),
    )
    return trunk(x).reshape(*lead, FEATURE_DIM)


def navrl_layout(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` without the own critic's extractor (ppo.separate_critic): NavRL's keys."""
    return {k: v for k, v in state.items() if not k.startswith(CRITIC_EXTRACTOR)}


def has_own_critic(state: Mapping[str, Any]) -> bool:
    """Whether a policy state_dict has the own critic's extractor (ppo.separate_critic)."""
    return any(k.startswith(CRITIC_EXTRACTOR) for k in state)


def observation(td: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The (state, lidar, dynamic_obstacle) of `td`'s ("agents", "observation") entry."""
    obs = td.get(OBS_KEY)
    return obs.get("state"), obs.get("lidar"), obs.get("dynamic_obstacle")


class NavRLPolicy(nn.Module):
    """Shared feature trunk (or, with `separate_critic`, one per head), Beta actor and
    critic, plus ValueNorm and GAE buffers.

    Tensor-level methods (`features`, `distribution`, `value`) take any leading batch dims;
    `act` is the TensorDict boundary used by rollouts and evaluation.
    """

    in_keys = (
        (*OBS_KEY, "state"),
        (*OBS_KEY, "lidar"),
        (*OBS_KEY, "direction"),
        (*OBS_KEY, "dynamic_obstacle"),
    )
    out_keys = (
        ("agents", "action_normalized"),
        ("agents", "action"),
        "sample_log_prob",
        "state_value",
    )

    def __init__(
        self,
        action_limit: float = 2.0,
        gamma: float = 0.99,
        lmbda: float = 0.95,
        separate_critic: bool = False,
        lidar_conv: Lowering = "auto",
    ) -> None:
        super().__init__()
        self.action_limit = action_limit
        self.feature_extractor = make_feature_extractor(lidar_conv)
        self.actor = Keyed(nn.ModuleList([Keyed(BetaHead())]))
        self.critic = Keyed(nn.Linear(FEATURE_DIM, 1))
        self.value_norm = ValueNorm()
        self.gae = GAE(gamma, lmbda)
        # NavRL: small orthogonal heads start at mean action 0.5 (zero velocity), value ≈ 0.
        for layer in (self.beta_head.alpha_layer, self.beta_head.beta_layer, self.critic.module):
            nn.init.orthogonal_(layer.weight, gain=0.01)
            nn.init.zeros_(layer.bias)
        # ppo.separate_critic: the critic head reads a feature extractor of its own, so its
        # loss never moves the actor's features. Built last: NavRL's layers draw the same
        # initial weights either way.
        self.critic_extractor = make_feature_extractor(lidar_conv) if separate_critic else None

    @property
    def beta_head(self) -> BetaHead:
        return self.actor.module[0].module

    def features(
        self, state: torch.Tensor, lidar: torch.Tensor, dynamic_obstacle: torch.Tensor
    ) -> torch.Tensor:
        """state [B…,8], lidar [B…,1,36,4], dynamic_obstacle [B…,1,5,10] → [B…,256]."""
        return extract(self.feature_extractor, state, lidar, dynamic_obstacle)

    def critic_features(
        self,
        state: torch.Tensor,
        lidar: torch.Tensor,
        dynamic_obstacle: torch.Tensor,
        feature: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """What the critic head reads: the actor's feature (NavRL's shared trunk; `feature`
        when already computed), or with ppo.separate_critic the critic's own extractor's
        feature of the same input."""
        if self.critic_extractor is not None:
            return extract(self.critic_extractor, state, lidar, dynamic_obstacle)
        return self.features(state, lidar, dynamic_obstacle) if feature is None else feature

    def critic_parameters(self) -> list[nn.Parameter]:
        """The critic's: its head, and its own extractor if it has one (what the critic's
        gradient clip covers; NavRL leaves the shared trunk unclipped)."""
        own = [] if self.critic_extractor is None else list(self.critic_extractor.parameters())
        return [*self.critic.parameters(), *own]

    def distribution(self, feature: torch.Tensor) -> Independent:
        """The 3-axis Beta over normalised actions in (0,1)³.

        Argument validation is off: it would sync the device on every call, and non-finite
        parameters are caught by the PPO update instead.
        """
        alpha, beta = self.beta_head(feature)
        return Independent(Beta(alpha, beta, validate_args=False), 1, validate_args=False)

    def value(self, feature: torch.Tensor) -> torch.Tensor:
        """V(s) in ValueNorm-normalised units, [B…,1]."""
        return self.critic(feature)

    def observe(self, td: TensorDictBase) -> torch.Tensor:
        """The trunk feature of `td`'s ("agents", "observation") entry."""
        return self.features(*observation(td))

    def state_value(self, td: TensorDictBase) -> torch.Tensor:
        """V of `td`'s ("agents", "observation") entry, [B…,1], normalised units."""
        return self.value(self.critic_features(*observation(td)))

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        """nn.Module's, but a state_dict in NavRL's layout (no `critic_extractor.` keys:
        NavRL's checkpoint, a run without ppo.separate_critic) loads into a policy with
        its own critic too: that extractor starts as a copy of the shared one, whose
        feature the critic head was trained on."""
        if self.critic_extractor is not None and not has_own_critic(state_dict):
            shared = {
                CRITIC_EXTRACTOR + k.removeprefix(SHARED_EXTRACTOR): v
                for k, v in state_dict.items()
                if k.startswith(SHARED_EXTRACTOR)
            }
            state_dict = {**state_dict, **shared}
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def to_world(self, action_normalized: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
        """a ∈ (0,1)³ [B…,3] → world velocity [B…,1,3]: v_goal = (2a−1)·L, then R_z(θ)·v_goal.

        θ is the heading of `direction` ([B…,1,3], goal − start with z = 0), navrl-task §1.5/§1.7.
        """
        v = ((2.0 * action_normalized - 1.0) * self.action_limit).unsqueeze(-2)
        theta = torch.atan2(direction[..., 1], direction[..., 0])
        cos, sin = theta.cos(), theta.sin()
        vx, vy, vz = v.unbind(-1)
        return torch.stack([cos * vx - sin * vy, sin * vx + cos * vy, vz], dim=-1)

    def act(
        self,
        td: TensorDictBase,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
    ) -> TensorDictBase:
        """Write action, log-prob and value into `td` (batch dims [N] or [N,T]) and return it.

        Stochastic actions are a Beta sample (NavRL's ExplorationType.RANDOM) drawn from
        `generator` (None: torch's default one); deterministic ones the Beta mean α/(α+β)
        (ExplorationType.MEAN), as in NavRL's eval and ROS runners.
        """
        parts = observation(td)
        feature = self.features(*parts)
        dist = self.distribution(feature)
        action = dist.mean if deterministic else sample_beta(dist, generator)
        direction = td.get((*OBS_KEY, "direction"))
        td.set(("agents", "action_normalized"), action)
        td.set(("agents", "action"), self.to_world(action, direction))
        td.set("sample_log_prob", dist.log_prob(action))
        td.set("state_value", self.value(self.critic_features(*parts, feature)))
        return td

    def forward(self, td: TensorDictBase, deterministic: bool = False) -> TensorDictBase:
        return self.act(td, deterministic)


def sample_beta(dist: Independent, generator: torch.Generator | None) -> torch.Tensor:
    """A sample of the policy's Beta, the same draw as `dist.rsample()` from `generator`.

    torch's Beta samples through a Dirichlet over (α, β) that always draws from the default
    generator, and a CUDA graph captured in any thread registers that generator: a draw
    from it elsewhere during the capture fails ("Offset increment outside graph capture").
    So acting threads bring their own generator. No gradient flows through the sample
    (acting runs under no_grad; the PPO loss takes log-probs of stored actions).
    """
    beta = dist.base_dist
    concentration = torch.stack((beta.concentration1, beta.concentration0), -1)
    return torch._sample_dirichlet(concentration, generator=generator).select(-1, 0)


def make_policy(
    cfg: Config, device: torch.device | str, lidar_conv: Lowering | None = None
) -> NavRLPolicy:
    """The run's policy; `lidar_conv`: the execution plan's lowering (the daemon's) or
    an override (export: "native"), else ppo.lidar_conv resolved for `device` by the
    plan's rule (config/execution_plan.py)."""
    if lidar_conv is None:
        lidar_conv = lidar_lowering(cfg.ppo.lidar_conv, device).value
    return NavRLPolicy(
        action_limit=cfg.env.action_limit,
        gamma=cfg.ppo.gamma,
        lmbda=cfg.ppo.lmbda,
        separate_critic=cfg.ppo.separate_critic,
        lidar_conv=lidar_conv,
    ).to(device)


def acting_copy(policy: NavRLPolicy) -> NavRLPolicy:
    """A separate policy for collection or evaluation that weights are copied into."""
    clone = copy.deepcopy(policy)
    clone.requires_grad_(False)
    return clone
