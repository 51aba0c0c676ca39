"""NavRL's PPO update (navrl-task §3): one linear function over a collected [N, T] batch.

The loss terms are small pure functions so tests can check them on hand-computed numbers.
NavRL quirks kept on purpose: the actor loss is scaled by the action dimension (3), the
critic loss is the max of two *mean* Huber losses, the critic's learning rate is the
actor's, and the feature extractor's gradients are not clipped (unless
`ppo.feature_extractor_max_grad_norm` asks for it). `ppo.target_kl` adds the KL early stop
NavRL's update lacks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tensordict import TensorDictBase
from torch.nn.utils import clip_grad_norm_, get_total_norm

from navrl_daemon.config import PPOConfig
from navrl_daemon.rl.data_parallel import DataParallel
from navrl_daemon.rl.gae import compute_gae
from navrl_daemon.rl.mirror import with_mirror
from navrl_daemon.rl.policy import ACTION_DIM, OBS_KEY, NavRLPolicy

# The optimiser of the critic's own extractor (ppo.separate_critic).
CRITIC_EXTRACTOR_OPT = "critic_extractor"

# The PPO loss terms, by name, summed into each minibatch's loss (`tensor_losses`); an
# update's extra terms (`AuxLoss`: the BC term of "ppo+bc") join them under their own names.
# Every sink reports what the update returns by name (a `_loss` is a loss term, a
# `_grad_norm` a gradient norm): a new term here needs no edit elsewhere.
LOSS_TERMS = ("actor_loss", "critic_loss", "entropy_loss")

# What each applied step reports besides its loss terms (`Step.stats`), in this order.
STEP_STATS = (
    "actor_grad_norm",
    "critic_grad_norm",
    # The shared feature extractor's gradient norm before its clip (unclipped in NavRL's
    # update: ppo.feature_extractor_max_grad_norm).
    "feature_extractor_grad_norm",
    # KL from the rollout's policy on each step's minibatch, before its step (k3 estimator),
    # over the collected rows; with ppo.mirror the same over their reflections, against the
    # behaviour log-probs their ratios use: how far from 1 those start (else 0).
    "kl",
    "mirror_kl",
    # The policy's entropy on the collected rows (the loss's term is -entropy_coef x it,
    # over the mirrored rows too).
    "policy_entropy",
    "explained_var",
    # How far the critic has moved from the rollout's values V_old (normalised units):
    # the mean |V - V_old| before each step, and the share of rows beyond ppo.value_clip,
    # which the clipped critic loss no longer pulls towards their targets.
    "value_shift",
    "value_clipped",
)

# An update's statistics without extra terms (each is the mean over the applied steps).
STAT_NAMES = (*LOSS_TERMS, *STEP_STATS)

# Extra named loss terms of a minibatch, `(policy, minibatch) -> {name: scalar}`, added to
# PPO's on every update path (the BC term of "ppo+bc": offline/trainer.py).
AuxLoss = Callable[[NavRLPolicy, TensorDictBase], dict[str, torch.Tensor]]


def learning_rates(cfg: PPOConfig) -> dict[str, float]:
    """Per optimiser; the critic reads the actor's lr, as NavRL's does, and so does the
    critic's own extractor (ppo.separate_critic)."""
    lrs = {
        "feature_extractor": cfg.feature_extractor_lr,
        "actor": cfg.actor_lr,
        "critic": cfg.actor_lr,
    }
    if cfg.separate_critic:
        lrs[CRITIC_EXTRACTOR_OPT] = cfg.actor_lr
    return lrs


def make_optimizers(policy: NavRLPolicy, cfg: PPOConfig) -> dict[str, torch.optim.Adam]:
    """Three Adams with default betas/eps, as NavRL; a fourth for the critic's own
    extractor (ppo.separate_critic), which a checkpoint from before it may lack."""
    lrs = learning_rates(cfg)
    optimizers = {
        "feature_extractor": torch.optim.Adam(
            policy.feature_extractor.parameters(), lr=lrs["feature_extractor"]
        ),
        "actor": torch.optim.Adam(policy.actor.parameters(), lr=lrs["actor"]),
        "critic": torch.optim.Adam(policy.critic.parameters(), lr=lrs["critic"]),
    }
    if policy.critic_extractor is not None:
        optimizers[CRITIC_EXTRACTOR_OPT] = torch.optim.Adam(
            policy.critic_extractor.parameters(), lr=lrs[CRITIC_EXTRACTOR_OPT]
        )
    return optimizers


# ---------------------------------------------------------------------------- loss terms


def actor_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantage: torch.Tensor,
    clip_ratio: float,
    action_dim: int = ACTION_DIM,
    dual_clip: float = 0.0,
) -> torch.Tensor:
    """Clipped surrogate: −mean(min(r·A, clip(r, 1±c)·A)) × action_dim; with `dual_clip`
    (> 1 + c) rows with A < 0 take max(that, dual_clip·A) instead (dual-clip PPO).

    log-probs are [B], advantages [B,1]. The × action_dim is NavRL's scaling, kept so the
    published hyper-parameters mean the same thing here.
    """
    ratio = torch.exp(log_prob - old_log_prob).unsqueeze(-1)
    surrogate = ratio * advantage
    clipped = ratio.clamp(1.0 - clip_ratio, 1.0 + clip_ratio) * advantage
    objective = torch.min(surrogate, clipped)
    if dual_clip > 0:
        held = torch.max(objective, dual_clip * advantage)
        objective = torch.where(advantage < 0, held, objective)
    return -objective.mean() * action_dim


def critic_loss(
    value: torch.Tensor,
    old_value: torch.Tensor,
    target: torch.Tensor,
    value_clip: float,
    huber_delta: float,
    reducer: DataParallel | None = None,
) -> torch.Tensor:
    """max(Huber(target, v_clipped), Huber(target, v)): a max of two means, as NavRL.

    v_clipped = v_old + clip(v − v_old, ±value_clip), all in normalised units. With a
    `reducer` the means are over every rank's minibatch (this rank's share is returned).
    """
    clipped = old_value + (value - old_value).clamp(-value_clip, value_clip)
    loss_clipped = F.huber_loss(clipped, target, delta=huber_delta)
    loss_plain = F.huber_loss(value, target, delta=huber_delta)
    if reducer is not None:
        return reducer.max_of_means(loss_clipped, loss_plain)
    return torch.max(loss_clipped, loss_plain)


def kl_estimate(log_ratio: torch.Tensor) -> torch.Tensor:
    """mean((r − 1) − log r) with log r = log π(a) − log π_old(a): Schulman's k3 estimator
    of KL(π_old ‖ π), never negative."""
    return ((log_ratio.exp() - 1.0) - log_ratio).mean()


def kl_stop_bar(cfg: PPOConfig) -> float | None:
    """The minibatch KL above which `ppo.target_kl` stops an update (1.5 × target_kl, the
    bar of Spinning Up and Stable-Baselines3); None without it (target_kl = 0)."""
    return 1.5 * cfg.target_kl if cfg.target_kl > 0 else None


def clip_gradients(
    policy: NavRLPolicy, cfg: PPOConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NavRL's clips (the actor head; the critic head with its own extractor, if any) and
    the shared extractor's norm, clipped too with `ppo.feature_extractor_max_grad_norm`.
    Returns the three norms before clipping; nothing is read on the host."""
    actor_norm = clip_grad_norm_(policy.actor.parameters(), cfg.max_grad_norm)
    critic_norm = clip_grad_norm_(policy.critic_parameters(), cfg.max_grad_norm)
    params = list(policy.feature_extractor.parameters())
    if cfg.feature_extractor_max_grad_norm == 0:  # NavRL: measured, left as it is
        extractor_norm = get_total_norm([p.grad for p in params if p.grad is not None])
    else:
        extractor_norm = clip_grad_norm_(params, cfg.feature_extractor_max_grad_norm)
    return actor_norm, critic_norm, extractor_norm


def entropy_loss(entropy: torch.Tensor, entropy_coef: float | torch.Tensor) -> torch.Tensor:
    return -entropy_coef * entropy.mean()


def value_moves(
    value: torch.Tensor, old_value: torch.Tensor, value_clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean |V - V_old|, share of rows with |V - V_old| > value_clip) of a minibatch."""
    shift = (value.detach() - old_value).abs()
    return shift.mean(), (shift > value_clip).float().mean()


def explained_variance(value: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return 1.0 - F.mse_loss(value, target) / target.var()


# ---------------------------------------------------------------------------- batch prep


@torch.no_grad()
def advantages_and_targets(
    policy: NavRLPolicy,
    batch: TensorDictBase,
    cfg: PPOConfig,
    reducer: DataParallel | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised advantages and normalised value targets for a [N, T] batch.

    Updates the policy's ValueNorm with this batch's returns, as NavRL does once per
    iteration; a batch with a non-finite return leaves it alone, because one NaN there would
    poison every later value target. With a `reducer`, the normalisation and the ValueNorm
    update use the statistics of every rank's batch.
    """
    value_norm = policy.value_norm
    next_value = policy.state_value(batch.get("next"))
    advantages, returns = compute_gae(
        reward=batch.get(("next", "agents", "reward")),
        terminated=batch.get(("next", "terminated")),
        truncated=batch.get(("next", "truncated")),
        value=value_norm.denormalize(batch.get("state_value")),
        next_value=value_norm.denormalize(next_value),
        gamma=cfg.gamma,
        lmbda=cfg.lmbda,
        cut_truncation=cfg.gae_cut_truncation,
    )
    if reducer is not None:
        advantages = reducer.normalize(advantages)
        if reducer.all_finite(returns):
            value_norm.update(returns, moments=reducer.mean_and_mean_sq(returns))
        return advantages, value_norm.normalize(returns)
    advantages = (advantages - advantages.mean()) / advantages.std().clamp(min=1e-7)
    if bool(torch.isfinite(returns).all()):  # one host sync per update
        value_norm.update(returns)
    return advantages, value_norm.normalize(returns)


def update_data(
    batch: TensorDictBase, advantages: torch.Tensor, targets: torch.Tensor
) -> TensorDictBase:
    """The entries of a [N, T] rollout that the update reads, with advantage and target."""
    keys = [(*OBS_KEY, k) for k in ("state", "lidar", "dynamic_obstacle")]
    data = batch.select(*keys, ("agents", "action_normalized"), "sample_log_prob", "state_value")
    data.set("advantage", advantages)
    data.set("target", targets)
    return data


def minibatch_indices(
    num_rows: int, num_minibatches: int, generator: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    """[num_minibatches, size] row indices: a random permutation, remainder dropped."""
    size = num_rows // num_minibatches
    if size == 0:
        raise ValueError(
            f"{num_minibatches} minibatches need at least as many rows, got {num_rows}"
        )
    source = generator.device if generator is not None else device
    perm = torch.randperm(num_rows, generator=generator, device=source).to(device)
    return perm[: size * num_minibatches].view(num_minibatches, size)


# A minibatch source turns the [N, T] training batch into the epochs' minibatches, each
# flat [B]: (data, cfg, generator, device, release) → iterator. `release`, when given, is
# called once the source no longer reads `data` (the rollout buffer can be refilled).
MinibatchSource = Callable[
    [TensorDictBase, PPOConfig, torch.Generator | None, torch.device, Callable[[], None] | None],
    Iterator[TensorDictBase],
]


def frame_minibatches(
    data: TensorDictBase,
    cfg: PPOConfig,
    generator: torch.Generator | None,
    device: torch.device,
    release: Callable[[], None] | None = None,
) -> Iterator[TensorDictBase]:
    """NavRL's sampling: every epoch, a random permutation of all N·T frames, cut into
    `cfg.minibatches` minibatches. Reads `data` to the end (never calls `release`)."""
    flat = data.reshape(-1)
    for _ in range(cfg.epochs):
        for idx in minibatch_indices(flat.shape[0], cfg.minibatches, generator, device):
            yield flat[idx]


def env_minibatches(
    data: TensorDictBase,
    cfg: PPOConfig,
    generator: torch.Generator | None,
    device: torch.device,
    release: Callable[[], None] | None = None,
) -> Iterator[TensorDictBase]:
    """Every epoch, a random permutation of the N envs cut into `cfg.minibatches` groups;
    a minibatch is its envs' T steps, flat. What `pipeline.compress_rollouts` samples
    (storage/compressed_rollout.py decodes only a minibatch's envs); uncompressed here,
    as the reference the compressed path must match bit for bit."""
    for envs in env_groups(data.batch_size[0], cfg, generator, device):
        yield data[envs].reshape(-1)


def env_groups(
    num_envs: int, cfg: PPOConfig, generator: torch.Generator | None, device: torch.device
) -> Iterator[torch.Tensor]:
    """cfg.epochs × cfg.minibatches groups of env indices (each epoch a permutation)."""
    for _ in range(cfg.epochs):
        yield from minibatch_indices(num_envs, cfg.minibatches, generator, device)


@torch.no_grad()
def approx_kl(policy: NavRLPolicy, batch: TensorDictBase, rows: int) -> torch.Tensor:
    """KL from the rollout's policy to `policy`, estimated on about `rows` frames spread
    evenly over the [N, T] batch: mean((r − 1) − log r) with r = π(a)/π_old(a) (Schulman's
    k3 estimator, never negative)."""
    flat = batch.reshape(-1)
    stride = max(1, flat.shape[0] // rows)
    sample = flat[torch.arange(0, flat.shape[0], stride, device=flat.device)]
    dist = policy.distribution(policy.observe(sample))
    action = sample.get(("agents", "action_normalized"))
    return kl_estimate(dist.log_prob(action) - sample.get("sample_log_prob"))


# ---------------------------------------------------------------------------- the update


def loss_inputs(mb: TensorDictBase) -> tuple[torch.Tensor, ...]:
    """The tensors of a flat minibatch that `tensor_losses` reads, in its order."""
    obs = mb.get(OBS_KEY)
    return (
        obs.get("state"),
        obs.get("lidar"),
        obs.get("dynamic_obstacle"),
        mb.get(("agents", "action_normalized")),
        mb.get("sample_log_prob"),
        mb.get("advantage"),
        mb.get("state_value"),
        mb.get("target"),
    )


def tensor_losses(
    policy: NavRLPolicy,
    state: torch.Tensor,
    lidar: torch.Tensor,
    dynamic_obstacle: torch.Tensor,
    action: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantage: torch.Tensor,
    old_value: torch.Tensor,
    target: torch.Tensor,
    entropy_coef: float | torch.Tensor,
    cfg: PPOConfig,
    reducer: DataParallel | None = None,
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """The LOSS_TERMS of one flat minibatch (`loss_inputs`) by name, its values V(s) and
    what it measures of the policy, on plain tensors (what torch.compile traces:
    ppo.compile). `entropy_coef` may be a device scalar (the CUDA-graph path,
    rl/fast_update.py).

    With `cfg.mirror` the losses are over the B rows and their reflections (rl/mirror.py),
    2B rows that share advantages, targets, old values and behaviour log-probs; the values
    returned are the B rows' own. The last tensor, detached, holds the KL from the
    rollout's policy over the B rows, then over their reflections (0 without the mirror),
    then the policy's entropy over the B rows."""
    rows = state.shape[0]
    if cfg.mirror:
        state, lidar, dynamic_obstacle, action, old_log_prob, advantage, old_value, target = (
            with_mirror(
                state, lidar, dynamic_obstacle, action, old_log_prob, advantage, old_value, target
            )
        )
    feature = policy.features(state, lidar, dynamic_obstacle)
    dist = policy.distribution(feature)
    value = policy.value(policy.critic_features(state, lidar, dynamic_obstacle, feature))
    log_prob = dist.log_prob(action)
    entropy = dist.entropy()
    terms = {
        "actor_loss": actor_loss(
            log_prob, old_log_prob, advantage, cfg.clip_ratio, dual_clip=cfg.dual_clip
        ),
        "critic_loss": critic_loss(
            value, old_value, target, cfg.value_clip, cfg.huber_delta, reducer
        ),
        "entropy_loss": entropy_loss(entropy, entropy_coef),
    }
    log_ratio = log_prob.detach() - old_log_prob
    own = kl_estimate(log_ratio[:rows])
    mirror = kl_estimate(log_ratio[rows:]) if cfg.mirror else torch.zeros_like(own)
    return terms, value[:rows], torch.stack((own, mirror, entropy.detach()[:rows].mean()))


# What `tensor_losses` returns: the named loss terms, the B rows' values, and what the
# minibatch measures of the policy (KLs, entropy).
Losses = tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]


@dataclass
class Step:
    """One minibatch's forward and backward pass (`minibatch_step`): its named loss terms,
    their sum, the B rows' values, what it measured (`tensor_losses`: the two KLs, the
    policy's entropy) and the three gradient norms before their clips. The optimisers have
    not stepped yet."""

    terms: dict[str, torch.Tensor]
    loss: torch.Tensor
    value: torch.Tensor
    measured: torch.Tensor
    norms: tuple[torch.Tensor, torch.Tensor, torch.Tensor]

    @property
    def names(self) -> tuple[str, ...]:
        """The names of `stats()`, in its order: the loss terms, then STEP_STATS."""
        return (*self.terms, *STEP_STATS)

    def finite(self) -> torch.Tensor:
        """True when the loss and every gradient norm are finite (a device bool)."""
        return torch.isfinite(self.loss + sum(self.norms))

    @torch.no_grad()
    def stats(self, mb: TensorDictBase, cfg: PPOConfig) -> torch.Tensor:
        """The step's statistics, one per `names`: its loss terms, gradient norms, what it
        measured of the policy, then what its values say of the critic (explained
        variance, value moves)."""
        explained_var = explained_variance(self.value, mb.get("target"))
        shift, clipped = value_moves(self.value, mb.get("state_value"), cfg.value_clip)
        terms = (t.detach().to(self.loss.dtype).reshape(()) for t in self.terms.values())
        return torch.stack((*terms, *self.norms, *self.measured, explained_var, shift, clipped))


def minibatch_step(
    policy: NavRLPolicy,
    optimizers: dict[str, torch.optim.Optimizer],
    mb: TensorDictBase,
    cfg: PPOConfig,
    losses: Losses,
    *,
    aux_loss: AuxLoss | None = None,
    reducer: DataParallel | None = None,
) -> Step:
    """The minibatch step every update path shares after its forward pass (`losses`:
    `tensor_losses` of `mb`, or its compiled form), up to the optimisers' step: any
    `aux_loss` terms, the gradients of the terms' sum (averaged over ranks with a
    `reducer`), and the clips. Nothing is read on the host. Gradients start as None."""
    for opt in optimizers.values():
        opt.zero_grad(set_to_none=True)
    terms, value, measured = losses
    if aux_loss is not None:
        extra = aux_loss(policy, mb)
        if clash := set(extra) & set(terms):
            raise ValueError(f"aux_loss terms {sorted(clash)} clash with PPO's own")
        terms = {**terms, **extra}
    loss = sum(terms.values())
    assert isinstance(loss, torch.Tensor)
    loss.backward()
    if reducer is not None:
        reducer.average_gradients([p for p in policy.parameters() if p.requires_grad], loss)
    return Step(terms, loss, value, measured, clip_gradients(policy, cfg))


def update(
    policy: NavRLPolicy,
    optimizers: dict[str, torch.optim.Adam],
    batch: TensorDictBase,
    cfg: PPOConfig,
    generator: torch.Generator | None = None,
    abort: threading.Event | None = None,
    reducer: DataParallel | None = None,
    aux_loss: AuxLoss | None = None,
    minibatches: MinibatchSource = frame_minibatches,
    release: Callable[[], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, float]:
    """cfg.epochs × cfg.minibatches gradient steps on one [N, T] rollout (NavRL's update:
    the "eager" path; rl/fast_update.py runs the same `minibatch_step` without its host
    reads).

    `minibatches` cuts the batch into minibatches: NavRL's uniform frames by default, or
    env groups (`env_minibatches`, or compressed: storage/compressed_rollout.py). A source
    that stops reading `batch` before the last minibatch calls `release` then.

    `aux_loss(policy, minibatch)`, called once per minibatch, returns extra named scalar
    terms that are added to the loss (the BC term of `offline.objective = "ppo+bc"`); each
    is reported by name, averaged over the applied steps, as PPO's own terms are.

    With a `reducer` (torch.distributed data parallelism, rl/data_parallel.py) this rank's
    rollout is its share of one global batch: batch statistics, the critic loss's max and
    the gradients of every minibatch are reduced over ranks, so N ranks compute the update
    one process would compute on all their rollouts.

    `progress(done, total)` is called after each minibatch step (a user watching a long
    update sees it move).

    `abort`, once set (a forced shutdown), ends the update at the next minibatch boundary,
    so the weights are never left half-stepped. With `cfg.target_kl`, a minibatch whose KL
    over its collected rows (every rank's mean; never its reflections, whose KL says how
    asymmetric the policy is, not how far it moved) is above `kl_stop_bar` ends the update
    before its optimiser step.

    Returns the means of the steps' statistics (`Step.names`: STAT_NAMES and any aux
    terms) over the applied steps (NaN if none was applied), `minibatch_updates`
    (applied), `nonfinite_updates` (skipped because the loss or a gradient norm was not
    finite; Adam's state is then left untouched) and `kl_stopped_steps` (the steps the KL
    early stop left out, that minibatch's included).
    """
    advantages, targets = advantages_and_targets(policy, batch, cfg, reducer)
    data = update_data(batch, advantages, targets)

    sums: torch.Tensor | None = None
    names: tuple[str, ...] = STAT_NAMES
    applied = skipped = kl_stopped = 0
    kl_bar = kl_stop_bar(cfg)
    total = cfg.epochs * cfg.minibatches
    for done, mb in enumerate(minibatches(data, cfg, generator, advantages.device, release)):
        if abort is not None and abort.is_set():
            break
        if progress is not None and done:
            progress(done, total)
        losses = tensor_losses(policy, *loss_inputs(mb), cfg.entropy_coef, cfg, reducer)
        step = minibatch_step(
            policy, optimizers, mb, cfg, losses, aux_loss=aux_loss, reducer=reducer
        )
        if kl_bar is not None:  # the collected rows' KL: how far the policy has moved
            kl = step.measured[0]
            mean_kl = kl if reducer is None else reducer.mean(kl.reshape(1))[0]
            if float(mean_kl) > kl_bar:  # a host sync, as the finite check below
                kl_stopped = total - applied - skipped
                break
        # One host sync per minibatch: a skipped step must not move Adam's moments.
        if not bool(step.finite()):
            skipped += 1
            continue
        for opt in optimizers.values():
            opt.step()
        applied += 1
        stats = step.stats(mb, cfg)
        if sums is None:
            names, sums = step.names, stats
        elif step.names != names:
            raise ValueError(
                f"loss terms {step.names} after {names}: aux_loss must name the same terms "
                "every minibatch"
            )
        else:
            sums = sums + stats

    if progress is not None:
        progress(applied + skipped + kl_stopped, total)
    for opt in optimizers.values():
        opt.zero_grad()
    if reducer is not None and sums is not None:  # applied is the same on every rank
        sums = reducer.mean(sums)
    means = (sums / applied).tolist() if sums is not None else [float("nan")] * len(names)
    return {
        **dict(zip(names, means, strict=True)),
        "minibatch_updates": applied,
        "nonfinite_updates": skipped,
        "kl_stopped_steps": kl_stopped,
    }
