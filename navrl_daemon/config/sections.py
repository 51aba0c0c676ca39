"""The config's sections: one pydantic model per TOML table, and `Config`, the whole.

The model defaults are NavRL's own numbers (docs/navrl-task.md); `config/default.toml`
shrinks the task so it learns on a CPU in minutes. Every error names the key path and what
is allowed, and maps to exit 78 through `ConfigError`.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from navrl_daemon.config.execution_plan import (
    NOT_FAST,
    NOT_GRAPH,
    collect_path,
    compile_step,
    update_path,
)
from navrl_daemon.errors import ConfigError

ENV_PREFIX = "NAVRL_"
# A dotted key path as overrides and NAVRL_ variables name it (`ppo.lr`, `env.num_envs`);
# a number picks an entry of a list the config already holds (`env.curriculum.0.spawn`).
KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.([A-Za-z_][A-Za-z0-9_]*|[0-9]+))*$")

PosInt = Annotated[int, Field(ge=1)]
NonNegInt = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Prob = Annotated[float, Field(gt=0, le=1)]
Range = Annotated[list[PosFloat], Field(min_length=2, max_length=2)]  # [min, max]
ARCHIVE_KEY_FILTER = r"^[^=\s]+=(none|shuffle|delta|delta\+shuffle)$"
# A backend name, or an importable "package.module:factory".
BACKEND_PATTERN = r"^[A-Za-z0-9_.-]+(:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*)?$"


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)


# The longest file name (one path component) Linux file systems take: NAME_MAX.
NAME_MAX_BYTES = 255


def state_dir_problem(path: str) -> str | None:
    """Why `path` cannot be a state dir whatever is on disk, or None. Checked before
    anything is made: no system call takes a NUL byte, TensorBoard writes the path as
    UTF-8 (a byte that is not UTF-8 reaches Python as a surrogate escape), and no file
    system takes a component longer than NAME_MAX_BYTES."""
    shown = os.fsencode(path).decode("utf-8", "backslashreplace").replace("\0", "\\x00")
    if "\0" in path:
        return f"{shown}: holds a NUL byte, which no path can"
    try:
        path.encode("utf-8")
    except UnicodeEncodeError as err:
        byte = os.fsencode(path[err.start : err.end])[0]
        return f"{shown}: byte 0x{byte:02x} is not UTF-8 (TensorBoard writes paths as UTF-8)"
    for part in Path(path).parts:
        if len(part.encode()) > NAME_MAX_BYTES:
            return (
                f"{shown}: a component of {len(part.encode())} bytes, longer than a file "
                f"name may be ({NAME_MAX_BYTES} bytes)"
            )
    return None


class RunConfig(Section):
    # Seeds the weights, the maps and the action sampling: the same seed, the same run.
    # At most 2**63 - 1: what TOML (config.toml) holds; ranks add their rank to it for
    # torch.manual_seed, which takes up to 2**64 - 1.
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0
    # "cpu", "cuda", "cuda:N", or "auto" (cuda when torch sees a GPU, else cpu).
    device: Annotated[str, Field(pattern=r"^(auto|cpu|cuda(:\d+)?)$")] = "auto"
    # Environment frames to train on (over all envs); the run stops there (NavRL: 1.2 G).
    # At most 2**62, far past any run: frame counts stay within int64 (TensorBoard's steps
    # are), with room for the rollout that crosses the limit.
    total_frames: Annotated[int, Field(ge=1, le=2**62)] = 1_200_000_000
    # Checkpoints, history, evaluations, exports and the lock live here (--state-dir).
    # Not set: runs/<the config file's name without .toml>, runs/builtin without a file,
    # so that two configs never share one by accident.
    state_dir: str = "runs/builtin"
    # Resume a state dir whose checkpoint trained other env.*, ppo.* or run.seed values
    # (fine-tuning on a new task); without it such a resume is refused (exit 78).
    allow_config_change: bool = False
    # After SIGINT/SIGTERM, seconds the stages get to finish and flush before exit.
    shutdown_timeout_s: PosFloat = 60.0
    # 0 keeps torch's default intra-op thread count.
    torch_threads: NonNegInt = 0
    # glibc's mmap threshold, fixed: allocations this large are mapped on their own and
    # unmapped when freed, so RSS follows what the daemon holds (runtime/heap.py; a
    # threshold in MALLOC_MMAP_THRESHOLD_ or GLIBC_TUNABLES wins). With a checkpoint every
    # iteration 1 MiB took the default config's RSS from +13 to -0.4 MB/h for 0-2 % of CPU
    # frames/s; 128 KiB cost 5-30 % (docs/long-runs.md). 0: glibc's dynamic threshold.
    mmap_threshold_bytes: Annotated[int, Field(ge=0, le=32 * 1024 * 1024)] = 1024 * 1024
    # A start-up that has not finished its first iteration after this many seconds logs its
    # phase and every thread's stack and exits 70, for systemd to restart it (0: no limit).
    # Building NavRL-scale maps, CUDA graphs and a compiled update fit well inside it.
    startup_timeout_s: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 600.0

    @field_validator("state_dir")
    @classmethod
    def _usable_state_dir(cls, v: str) -> str:
        problem = state_dir_problem(v)
        if problem is not None:
            raise ValueError(problem)
        return v


class PromotionRule(Section):
    # An evaluation passes when reach_goal >= reach_goal and collision <= collision; `evals`
    # passes in a row at this stage move training to the next one (docs/training-navrl.md).
    reach_goal: Annotated[float, Field(ge=0.0, le=1.0)] = 0.8
    collision: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0
    evals: Annotated[int, Field(ge=1, le=1_000_000)] = 2


class CurriculumStage(Section):
    """One stage of `env.curriculum`: these env keys replace the env section's while the
    stage lasts (unset keys keep the section's value; the embedded backend's own keys, by
    their plain names here, replace `[env.navigation]`'s); `promote` says when it ends."""

    name: str = ""
    num_obstacles: int | None = None
    num_dynamic_obstacles: int | None = None
    dynamic_speed_range: list[float] | None = None
    goal_distance: list[float] | None = None
    spawn: Literal["border", "local", "crossing"] | None = None
    spawn_margin: float | None = None
    spawn_height: list[float] | None = None
    max_episode_length: int | None = None
    reach_hold: int | None = None
    crossing_share: float | None = None
    min_level: int | None = None
    safety_weight: float | None = None
    promote: PromotionRule | None = None

    @model_serializer(mode="wrap")
    def _without_unset(self, handler: Any) -> dict[str, Any]:
        # Unset keys mean "the env section's value"; TOML has no null to write them as.
        return {k: v for k, v in handler(self).items() if v is not None}

    def env_overrides(self) -> dict[str, Any]:
        skip = ("name", "promote")
        return {k: v for k, v in self.model_dump().items() if k not in skip}


class NavigationConfig(Section):
    """`[env.navigation]`: the keys only the embedded backend ("navigation") reads; another
    backend ignores them. A curriculum stage sets them by their plain names."""

    # Envs are split round-robin over this many independently generated maps.
    num_maps: Annotated[int, Field(ge=1, le=1024)] = 1
    # Flat ring around the field that is still ground for the LiDAR.
    border_width: Annotated[float, Field(ge=0.0, le=100.0)] = 5.0
    # [min, max] speed of the moving obstacles, m/s.
    dynamic_speed_range: Range = [0.5, 1.5]
    # Ours (embedded env): an episode ends as a time-out (truncated: the value bootstraps)
    # once the drone has been within 0.5 m of its goal for this many steps in a row, so
    # training frames go to new flights instead of hovering at the goal until
    # env.max_episode_length. 0: NavRL, where reaching the goal never ends an episode.
    # Evaluations always fly NavRL's rule.
    reach_hold: Annotated[int, Field(ge=0, le=10_000_000)] = 0
    # "border": NavRL's starts/goals on the four sides, env.spawn_margin outside the field.
    # "local": start anywhere free, goal at a horizontal distance drawn from env.goal_distance.
    # "crossing" (ours): like "border", but the goal is always on the opposite side, so
    # every episode crosses the field as NavRL's evaluation layout does.
    spawn: Literal["border", "local", "crossing"] = "border"
    # Ours, with spawn = "border": the share of episodes whose goal is on the side opposite
    # the start (they cross the field, as NavRL's evaluation does); the rest draw the goal's
    # side independently, as NavRL. 0: NavRL's rule (which crosses a quarter of the time).
    # With spawn = "local": the share of episodes that cross the field from a border point
    # to one on the opposite side (as with spawn = "crossing") instead of a hop in the
    # field; 0: every episode is a hop.
    crossing_share: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    # [min, max] altitude of starts and goals, m.
    spawn_height: Range = [0.5, 2.5]
    # NavRL's later reward fix; false reproduces the code of the published checkpoint.
    smoothness_penalty: bool = True
    # Ours: the weight of the reward's safety terms (the mean log clearance over the LiDAR
    # beams, and over the observed moving obstacles). 1.0: NavRL. Larger values pay more
    # for distance from pillars; 0 drops the terms. Evaluations fly NavRL's 1.0.
    safety_weight: Annotated[float, Field(ge=0.0, le=100.0)] = 1.0
    # Acceleration limit of the point-mass flight model, in g (NavRL's drone: 3.4).
    thrust_to_weight: Annotated[float, Field(gt=1.0, le=20.0)] = 3.4
    # Embedded env's auto-reset: "indexed" (torchrl's; host reads the done flags each step,
    # resets only the finished envs), "masked" (no host sync; spawns and one more LiDAR
    # cast for all envs each step), "auto": masked when the steps are captured
    # (env.collect_path), else indexed, the faster one op by op (docs/throughput.md).
    reset_mode: Literal["auto", "indexed", "masked"] = "auto"
    # Density levels per env (ours; empty: NavRL, every env flies its whole map): pillar
    # counts, ascending, each the first k pillars of the env's map (a prefix is itself a
    # valid map: each pillar is placed against the earlier ones only). Every env starts at
    # level 0; after an episode that reached its goal it moves up one level, after a
    # collision down one (env/navigation/env.py). Evaluations fly the whole map.
    map_levels: list[NonNegInt] = []
    # Ours, with map_levels: the lowest level (an index into map_levels) an env may be at.
    # Envs below it move up to it (at the start, at a new curriculum stage, on a resume);
    # a collision there keeps the env there. The last index puts every env on its whole
    # map. 0: levels go all the way down.
    min_level: NonNegInt = 0

    @model_validator(mode="after")
    def _ranges(self) -> NavigationConfig:
        for name in ("dynamic_speed_range", "spawn_height"):
            lo, hi = getattr(self, name)
            if lo > hi:
                raise ValueError(f"{name}: [min, max] with min <= max, got [{lo}, {hi}]")
        return self

    @model_validator(mode="after")
    def _levels_and_spawns(self) -> NavigationConfig:
        levels = self.map_levels
        if any(b <= a for a, b in itertools.pairwise(levels)):
            raise ValueError(f"map_levels: pillar counts in ascending order, got {levels}")
        if self.min_level and self.min_level >= len(levels):
            raise ValueError(
                f"min_level: an index into map_levels (0 to {max(len(levels) - 1, 0)}), "
                f"got {self.min_level}"
                + ("" if levels else "; without map_levels there is one level, 0")
            )
        if self.crossing_share > 0 and self.spawn == "crossing":
            raise ValueError(
                'crossing_share: mixes crossings into spawn = "border" or "local"; '
                'spawn = "crossing" crosses every time'
            )
        return self


class EnvConfig(Section):
    # "navigation" (embedded), "isaac", a name registered under the `navrl_daemon.backends`
    # entry-point group, or "module:factory" (navrl_daemon/env/backends.py resolves it and
    # says what each supports).
    backend: Annotated[str, Field(pattern=BACKEND_PATTERN)] = "navigation"
    # Backend-specific settings, passed through to the backend, which validates them.
    options: dict[str, Any] = {}
    # Drones trained in parallel (one env each).
    num_envs: Annotated[int, Field(ge=1, le=1_048_576)] = 1024
    # Side of the square pillar field (NavRL: 40 m, x,y in [-20, 20]).
    field_size: Annotated[float, Field(ge=2.0, le=1000.0)] = 40.0
    # Static pillars per map.
    num_obstacles: Annotated[int, Field(ge=0, le=20_000)] = 350
    # Moving obstacles per map (a multiple of 8: NavRL's 8 size categories).
    num_dynamic_obstacles: Annotated[int, Field(ge=0, le=8_000)] = 80
    # Steps before an episode is cut (truncated); at dt 0.016 s, 2200 steps are 35.2 s.
    max_episode_length: Annotated[int, Field(ge=1, le=10_000_000)] = 2200
    # Distance outside the field where "border"/"crossing" starts and goals lie, m.
    spawn_margin: Annotated[float, Field(ge=0.0, le=100.0)] = 4.0
    # [min, max] horizontal start-to-goal distance of spawn = "local", m.
    goal_distance: Range = [2.0, 4.0]
    # Largest commanded speed per axis, m/s (the Beta action (0,1) maps to +-action_limit).
    action_limit: PosFloat = 2.0
    # Simulation step, s.
    dt: Annotated[float, Field(gt=0.0, le=1.0)] = 0.016
    # First-order velocity tracking that stands in for Isaac's Lee controller (1/2.2 s).
    velocity_time_constant: Annotated[float, Field(gt=0.0, le=10.0)] = 0.45
    # How rollout and evaluation steps run, never what they compute (docs/throughput.md):
    # "eager" op by op; "cuda_graph" policy + env step + masked reset captured once as a
    # CUDA graph and replayed (embedded env); "auto" cuda_graph on CUDA for the embedded
    # env unless navigation.reset_mode = "indexed", else eager.
    collect_path: Literal["auto", "eager", "cuda_graph"] = "auto"
    # Training stages, easiest first, promoted on evaluations (rl/curriculum.py); empty:
    # train on this section as it is.
    curriculum: list[CurriculumStage] = []
    # What a promotion does to the episodes in flight (ours): "reset" every env starts a
    # new episode of the new stage at once; "episodes" each env finishes the episode it is
    # flying and starts the new stage's at its next reset, so the stage's starts come in
    # as episodes end instead of all in one rollout. Only where the two stages differ in
    # keys that take effect at an episode's start or end (rl/curriculum.py: spawns,
    # goal distance, episode length, reach hold, safety weight); a stage that changes the
    # world (obstacles, min_level) resets, as with "reset".
    stage_switch: Literal["reset", "episodes"] = "reset"
    # The embedded backend's own keys (`[env.navigation]`).
    navigation: NavigationConfig = NavigationConfig()

    @field_validator("options")
    @classmethod
    def _finite_options(cls, v: dict[str, Any]) -> dict[str, Any]:
        # A NaN or infinity here is a typo no backend means; TOML out refuses it too.
        for key, value in _walk(v):
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{key} = {value}: must be a finite number")
        return v

    @model_validator(mode="after")
    def _capturable(self) -> EnvConfig:
        try:  # what this section alone says; the device is checked with the run's, and
            # what the backend can capture where the backend is resolved (env/backends.py)
            collect_path(self, None, captured=None)
        except ConfigError as err:
            raise ValueError(str(err)) from None
        return self

    @field_validator("num_dynamic_obstacles")
    @classmethod
    def _dyn_multiple_of_8(cls, v: int) -> int:
        if v % 8:
            raise ValueError(f"must be a multiple of 8 (8 obstacle categories), got {v}")
        return v

    @model_validator(mode="after")
    def _ranges(self) -> EnvConfig:
        lo, hi = self.goal_distance
        if lo > hi:
            raise ValueError(f"goal_distance: [min, max] with min <= max, got [{lo}, {hi}]")
        return self

    @model_validator(mode="after")
    def _levels_in_map(self) -> EnvConfig:
        levels = self.navigation.map_levels
        if levels and levels[-1] > self.num_obstacles:
            raise ValueError(
                f"navigation.map_levels: a level is a prefix of the map's num_obstacles = "
                f"{self.num_obstacles} pillars, got {levels[-1]}"
            )
        return self

    @model_validator(mode="after")
    def _curriculum(self) -> EnvConfig:
        last = len(self.curriculum) - 1
        for i, stage in enumerate(self.curriculum):
            where = f"curriculum[{i}]" + (f" ({stage.name})" if stage.name else "")
            if i < last and stage.promote is None:
                raise ValueError(f"{where}: needs a promote rule (every stage but the last)")
            if i == last and stage.promote is not None:
                raise ValueError(f"{where}: the last stage has nowhere to promote to; drop promote")
            try:
                self.stage_env(i)
            except ValidationError as err:
                problems = [(".".join(map(str, e["loc"])), e["msg"]) for e in err.errors()]
                text = "; ".join(f"{loc}: {msg}" if loc else msg for loc, msg in problems)
                raise ValueError(f"{where}: {text.replace('Value error, ', '')}") from None
        return self

    def stage_env(self, index: int) -> EnvConfig:
        """This section with curriculum stage `index`'s keys in place (no curriculum)."""
        return self.replaced(curriculum=[], **self.curriculum[index].env_overrides())

    def replaced(self, **keys: Any) -> EnvConfig:
        """This section, validated, with `keys` replaced; they are named as a curriculum
        stage names them (`plain`): the embedded backend's go to `navigation`."""
        data = self.model_dump()
        for key, value in keys.items():
            section = data["navigation"] if key in NavigationConfig.model_fields else data
            section[key] = value
        return EnvConfig.model_validate(data)

    def plain(self) -> dict[str, Any]:
        """Every key of this section by its plain name, `navigation`'s among them."""
        data = self.model_dump()
        return {**data.pop("navigation"), **data}


class PPOConfig(Section):
    # NavRL's training_frame_num: steps per env per iteration.
    rollout_length: Annotated[int, Field(ge=1, le=100_000)] = 32
    # Passes over each rollout per update.
    epochs: Annotated[int, Field(ge=1, le=1000)] = 4
    # Minibatches each rollout is cut into per epoch.
    minibatches: Annotated[int, Field(ge=1, le=100_000)] = 16
    # Adam learning rate of the actor head.
    actor_lr: PosFloat = 5e-4
    # NavRL's critic optimiser reads actor.learning_rate; ours does the same.
    feature_extractor_lr: PosFloat = 5e-4
    # PPO's policy-ratio clip.
    clip_ratio: Prob = 0.1
    # Dual-clip PPO (Ye et al., AAAI 2020): on rows with a negative advantage the objective
    # is also held at or above dual_clip x A, so a row whose ratio is already far above 1
    # (off-policy: with ppo.mirror, a reflection the policy finds far likelier than the
    # collected action) no longer pulls with a gradient as large as its ratio. 0: off
    # (NavRL's clip alone); else > 1, e.g. 3.
    dual_clip: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 0.0
    # Clip of the value prediction's change (normalised units).
    value_clip: PosFloat = 0.1
    # Weight of the entropy bonus.
    entropy_coef: Annotated[float, Field(ge=0.0, le=1.0)] = 1e-3
    # Discount factor.
    gamma: Prob = 0.99
    # GAE's lambda.
    lmbda: Annotated[float, Field(ge=0.0, le=1.0)] = 0.95
    # Gradients are clipped to this norm (actor and critic separately).
    max_grad_norm: PosFloat = 5.0
    # The shared feature extractor's (LiDAR CNN, obstacle MLP, trunk) gradients clipped to
    # this norm as well, on their own; 0: NavRL's update, which leaves them unclipped (the
    # norm is reported either way: feature_extractor_grad_norm).
    feature_extractor_max_grad_norm: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 0.0
    # KL early stop: once a minibatch's KL from the rollout's policy, measured on its rows
    # before its step, exceeds 1.5 x target_kl, that step and the rest of the update's are
    # skipped (Spinning Up's and Stable-Baselines3's rule). 0: NavRL's update, every step
    # taken. Each update's KL is reported either way (kl, kl_stopped_steps).
    target_kl: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    # Huber loss threshold of the critic.
    huber_delta: PosFloat = 10.0
    # At a time-out, bootstrap from V(s_T) and cut the GAE recursion; false: NavRL's GAE.
    gae_cut_truncation: bool = True
    # Consecutive updates with a non-finite loss that are skipped before training stops.
    max_nonfinite_updates: Annotated[int, Field(ge=0, le=1_000_000)] = 3
    # "constant": NavRL's fixed learning rates. "linear": every lr decays to
    # lr_final_fraction times its value over schedule_frames (rl/schedules.py).
    # "kl_adaptive" (rsl_rl's rule, for large batches): after each update every lr is
    # divided by 1.5 when the update moved the policy by more than 2 x desired_kl (KL
    # from the rollout's policy), multiplied by 1.5 when by less than desired_kl / 2,
    # keeping the actor's within [lr_min, lr_max].
    lr_schedule: Literal["constant", "linear", "kl_adaptive"] = "constant"
    # With lr_schedule = "kl_adaptive": the KL per update the learning rates aim for.
    desired_kl: Annotated[float, Field(gt=0.0, le=1.0)] = 0.01
    # With lr_schedule = "kl_adaptive": the lowest actor lr the adaptation may set.
    lr_min: PosFloat = 1e-5
    # With lr_schedule = "kl_adaptive": the highest actor lr the adaptation may set.
    lr_max: PosFloat = 1e-2
    # With lr_schedule = "linear": the fraction of each lr reached at schedule_frames.
    lr_final_fraction: Annotated[float, Field(ge=0.0, le=1.0)] = 0.1
    # "constant": NavRL's entropy_coef. "linear": entropy_coef to entropy_coef_final.
    entropy_schedule: Literal["constant", "linear"] = "constant"
    # With entropy_schedule = "linear": the entropy_coef reached at schedule_frames.
    entropy_coef_final: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    # Trained frames over which the schedules run, then hold their final value; fixed
    # rather than run.total_frames, so raising total_frames on a resume keeps the schedule.
    schedule_frames: PosInt = 1_200_000_000
    # Train on every minibatch twice over: as collected and reflected left-right across the
    # goal direction (rl/mirror.py), sharing advantages and targets; twice the update's
    # work, no more frames. Off: NavRL's update.
    mirror: bool = False
    # The critic head reads a copy of the feature extractor of its own (LiDAR CNN, obstacle
    # MLP, trunk), trained by the critic's loss alone at the critic's lr and clipped with
    # it, so the value loss no longer moves the actor's features. A checkpoint without one
    # (NavRL's, or a run before) starts it as a copy of the shared extractor; turned off,
    # a state dir with one exits 78. Exports keep NavRL's layout (the actor's path). Off:
    # NavRL's shared trunk.
    separate_critic: bool = False
    # How the update runs, never what it computes (rl/fast_update.py, docs/throughput.md):
    # "eager" NavRL's loop; "fused" no host sync per minibatch, fused Adam; "cuda_graph"
    # the fused step captured as a CUDA graph; "auto" cuda_graph on CUDA, else eager.
    update_path: Literal["auto", "eager", "fused", "cuda_graph"] = "auto"
    # torch.compile (inductor) the minibatch step's forward pass and losses, and so their
    # backward, on the "fused" and "cuda_graph" paths: fewer, fused kernels per step. The
    # first update compiles (about a minute); the eager path cannot (exit 78).
    compile: bool = False
    # How the LiDAR CNN's convolutions run (rl/lidar_cnn.py): "matmul" a few matrix
    # products per layer, "native" torch's conv2d, "auto" matmul on the CPU (the CPU recipe's
    # compiled update 1.36x as fast, docs/throughput.md) and native elsewhere. The same
    # maths: only the order of float sums differs.
    lidar_conv: Literal["auto", "native", "matmul"] = "auto"


class PipelineConfig(Section):
    # 0: collect rollout i+1 only with the weights trained on rollout i (NavRL, on-policy);
    # 1: collect rollout i+1 while the trainer trains on rollout i.
    max_policy_lag: Annotated[int, Field(ge=0, le=1)] = 0
    # Preallocated rollout buffers; lag 1 needs 2 to overlap collection and training
    # (1 with compress_rollouts, which hands the buffer back before the epochs).
    lease_pool: Annotated[int, Field(ge=1, le=64)] = 2
    # Train on an LZ4-compressed copy of each rollout, in minibatches of whole envs
    # (storage/compressed_rollout.py; docs/archive.md says when it pays). Off: NavRL's
    # uniform-frame minibatches from the rollout buffer.
    compress_rollouts: bool = False
    # Threads that compress and decode those copies.
    compress_workers: Annotated[int, Field(ge=1, le=64)] = 2
    # CUDA: the trainer's kernels on a stream of their own, waiting only for the rollout
    # they train on (an event the producer records), so with max_policy_lag = 1 the GPU
    # runs an update beside the next rollout instead of after it (docs/throughput.md).
    # Off: one stream for both, as before. Nothing changes on a CPU.
    trainer_stream: bool = False


class EvalConfig(Section):
    # Evaluate every N iterations (0 = never during `run`).
    interval: NonNegInt = 1000
    # With an interval, evaluate the first iteration of a run from scratch too: a number
    # within minutes, not after N CPU iterations.
    first_iteration: bool = True
    # Drones evaluated, one first episode each.
    num_envs: Annotated[int, Field(ge=1, le=1_048_576)] = 64
    # "navrl": NavRL's crossing layout; "train": the training spawn rule under eval.seed.
    layout: Literal["navrl", "train"] = "navrl"
    # Seed of the eval env: every evaluation sees the same starts and goals.
    seed: NonNegInt = 0
    # Steps an evaluation runs; 0 = env.max_episode_length. Above it, the evaluation's
    # episodes last that long (a curriculum stage with short episodes still evaluates the
    # whole crossing); below it, the evaluation stops early.
    max_steps: NonNegInt = 0
    # The maps evaluated on: -1 the training maps (run.seed's); any other seed draws maps
    # training never flies (unless it equals run.seed).
    map_seed: Annotated[int, Field(ge=-1)] = -1
    # Maps the evaluation's drones are split over (drone i on map i % num_maps); 0:
    # env.num_maps.
    num_maps: Annotated[int, Field(ge=0, le=1024)] = 0
    # Also evaluate every time on maps of this seed (-1: off); reported beside the main
    # numbers with a `held_out_` prefix (e.g. held_out_reach_goal).
    held_out_seed: Annotated[int, Field(ge=-1)] = -1
    # Pillars of the evaluation's maps; 0: env.num_obstacles. Another count draws each map
    # with that many pillars from the same seed (the generator's heights come first, so
    # they are not the first pillars of the training maps): training can fly denser maps
    # (map_levels above the count) while every evaluation stays at NavRL's 350.
    num_obstacles: Annotated[int, Field(ge=0, le=20_000)] = 0


class CheckpointConfig(Section):
    # Snapshot every N iterations (0 = only the final one at shutdown).
    interval: NonNegInt = 100
    # Snapshots waiting for the writer; a full queue drops the oldest waiting one.
    queue_size: Annotated[int, Field(ge=1, le=64)] = 2
    # 0: LZ4 fast mode; 3..16: LZ4 HC (smaller, slower: docs/checkpoints.md).
    compression_level: Annotated[int, Field(ge=0, le=16)] = 0
    # Threads that serialise and compress snapshots.
    workers: Annotated[int, Field(ge=1, le=64)] = 1
    # The newest N checkpoint files are kept; older ones go (except keep_best's).
    keep_last: Annotated[int, Field(ge=1, le=100_000)] = 5
    # Also keep the N checkpoints with the best eval reach_goal (0 = off): by default the
    # best one survives however many newer ones come (`checkpoints export --best`).
    keep_best: Annotated[int, Field(ge=0, le=100_000)] = 1
    # Also keep, for good, every checkpoint whose iteration is a multiple of N (0 = off):
    # milestones to roll a run back to or fork it from (benchmarks/learning.py --fork-at).
    # A multiple of `interval`, so that snapshots land on them.
    keep_every: NonNegInt = 0
    # A second copy of the run's resume point (newest checkpoint, history, evaluations,
    # exported policies, config): a folder for this run alone on another disk or a network
    # file system, or an fsspec URL (the `mirror` extra). Replaced atomically at each
    # mirrored checkpoint; a run whose state dir is empty or behind it resumes from it.
    # "" = off (docs/long-runs.md).
    mirror: str = ""
    # Mirror every N-th interval checkpoint (1 = each); the one a stop writes always goes.
    mirror_every: Annotated[int, Field(ge=1, le=1_000_000)] = 1

    @model_validator(mode="after")
    def _milestones_land(self) -> CheckpointConfig:
        if self.keep_every and (self.interval == 0 or self.keep_every % self.interval):
            raise ValueError(
                f"keep_every ({self.keep_every}) must be a multiple of interval "
                f"({self.interval}): no snapshot would land on those iterations"
            )
        return self


class ArchiveConfig(Section):
    # Archive every N-th rollout (0 = off); rollouts go to STATE_DIR/archive/.
    interval: NonNegInt = 0
    # Threads that compress segments (LZ4 releases the GIL).
    workers: Annotated[int, Field(ge=1, le=64)] = 2
    # 0: LZ4 fast mode; 3..16: LZ4 HC (docs/archive.md has the measured trade-off).
    level: Annotated[int, Field(ge=0, le=16)] = 0
    # File format written: 2 packs every key of a segment in one blob (smaller, faster to
    # read); 1 is design §6's one blob dataset per key. Readers read both.
    format: Literal[1, 2] = 2
    # "episode": each segment (one env's T steps) is one LZ4 frame; "frame": each step is.
    mode: Literal["episode", "frame"] = "episode"
    # Filter before LZ4 for float keys (others: none); delta filters need episode mode.
    filter: Literal["none", "shuffle", "delta", "delta+shuffle"] = "none"
    # Per-key overrides, first match wins: "PATTERN=FILTER", fnmatch on a/b/c key paths.
    key_filters: list[Annotated[str, Field(pattern=ARCHIVE_KEY_FILTER)]] = []
    # A file past this size is closed (marked complete) and the next one started.
    max_file_bytes: Annotated[int, Field(ge=1 << 20)] = 1 << 30
    # The archive files together stay under this (see on_full).
    max_total_bytes: Annotated[int, Field(ge=1 << 20)] = 20 << 30
    # When a rollout finds no room. "rotate": the oldest finished files no reader holds are
    # deleted to make room under max_total_bytes and 512 MiB free on the disk (the newest
    # rollouts are kept; for weeks unattended); an archiver that is behind skips the
    # rollout. "drop": nothing is ever deleted; a rollout that does not fit, or finds the
    # archiver behind, is skipped. "block": like "drop", but a full queue holds up the
    # producer instead. Skipped rollouts count in navrl_archive_dropped_total.
    on_full: Literal["rotate", "drop", "block"] = "rotate"
    # Rollouts that may wait for the archiver.
    queue_size: Annotated[int, Field(ge=1, le=64)] = 1

    @model_validator(mode="after")
    def _consistent(self) -> ArchiveConfig:
        if self.mode == "frame":
            deltas = [f for f in [self.filter, *self.key_filters] if "delta" in f]
            if deltas:
                raise ValueError(
                    f'delta filters work along time and need mode = "episode", got {deltas}'
                )
        if self.max_total_bytes < self.max_file_bytes:
            raise ValueError(
                f"max_total_bytes ({self.max_total_bytes}) must be >= max_file_bytes "
                f"({self.max_file_bytes})"
            )
        return self


class PrefetchConfig(Section):
    # HDF5 dataset files or globs (layout A/B, design §6), read in this order.
    paths: list[str] = []
    # "auto" detects A (/observations/...) or B (root) per file; "archive": rollout archives.
    layout: Literal["auto", "A", "B", "archive"] = "auto"
    # Batches kept ready ahead of the trainer (each one a shared-memory slot).
    depth: Annotated[int, Field(ge=1, le=64)] = 4
    # Reader processes (h5py serialises calls within one process). Archives: 1 decodes in
    # the daemon's process, 2+ in that many decode processes (docs/archive.md).
    workers: Annotated[int, Field(ge=1, le=64)] = 2
    # Images are resized on the CPU to image_size x image_size.
    image_size: Annotated[int, Field(ge=8, le=4096)] = 224
    # Samples per batch.
    batch_size: Annotated[int, Field(ge=1, le=65_536)] = 256
    # Seed of the sample order.
    seed: NonNegInt = 0
    # Upper bound of each image dataset's HDF5 chunk cache in each worker.
    chunk_cache_bytes: Annotated[int, Field(ge=1 << 20, le=1 << 34)] = 64 << 20


class OfflineConfig(Section):
    # "bc": behaviour cloning from prefetched batches, no env (docs/datasets.md);
    # "ppo+bc": PPO plus bc_coef * BC loss on rollout-archive batches.
    objective: Literal["none", "bc", "ppo+bc"] = "none"
    # Weight of the BC loss under "ppo+bc".
    bc_coef: Annotated[float, Field(ge=0.0, le=1e6, allow_inf_nan=False)] = 1.0
    # Gradient steps of a purely offline run (0: until a signal).
    steps: NonNegInt = 0
    # Transitions loaded from prefetch.paths, files in order (0: all).
    max_samples: NonNegInt = 0
    # Adam learning rate of a purely offline run ("ppo+bc" uses the ppo section's).
    lr: PosFloat = 1e-3


class DistributedConfig(Section):
    """Only read when a launcher (torchrun) starts this process as one of several ranks."""

    # A collective that waits longer than this (a rank hung or gone) stops the run, non-zero.
    timeout_s: Annotated[float, Field(ge=5.0, le=86_400.0)] = 300.0
    # Every N iterations the ranks compare parameter checksums (0 = never).
    check_interval: NonNegInt = 50


class MetricsConfig(Section):
    # Serve /metrics and /healthz (Prometheus, `status`).
    enabled: bool = True
    # Loopback by default: the endpoint has no authentication.
    address: str = "127.0.0.1"
    # 0 picks a free port (logged at start-up).
    port: Annotated[int, Field(ge=0, le=65535)] = 9841
    # /healthz answers 503 once no iteration has completed for this long.
    stall_after_s: PosFloat = 600.0
    # After reaching run.total_frames (or a clean stop), keep serving /metrics this long
    # with state "finished" (or "stopped"), so Prometheus records it (more than the scrape
    # interval; the shipped systemd env file sets 35 s for a 15 s scrape). 0: exit at once.
    final_scrape_s: Annotated[float, Field(ge=0.0, le=3600.0)] = 0.0


class LogConfig(Section):
    # Lowest level logged.
    level: Literal["debug", "info", "warning", "error"] = "info"
    # "json": one JSON object per line (journald); "console": readable, with a progress
    # bar and a table per summary; "auto": console on a terminal, else json.
    format: Literal["auto", "json", "console"] = "auto"
    # A progress summary (log, history.jsonl, TensorBoard) every N iterations, or sooner
    # when summary_seconds have passed since the last one.
    summary_interval: PosInt = 10
    # Also a summary at the end of the first iteration this many seconds after the last
    # one, whichever comes first (0: every summary_interval iterations only): slow
    # iterations still report every minute.
    summary_seconds: Annotated[float, Field(ge=0.0, le=86_400.0)] = 60.0
    # Write the summaries and evaluations as TensorBoard event files too, in
    # STATE_DIR/tensorboard (`tensorboard --logdir STATE_DIR/tensorboard`).
    tensorboard: bool = True
    # The first evaluation and every N-th after it are flown recorded and logged as a video
    # (an animated GIF, top-down and side view, as `eval --video`) to TensorBoard and W&B;
    # 0: none. Off by default: drawing costs CPU (docs/usage.md). Embedded env only.
    video_interval: NonNegInt = 0
    # Log to Weights & Biases too (`pip install -e '.[wandb]'`): the summaries and
    # evaluations (x-axis `frames`), the config, the videos, and export/policy.pt as an
    # artifact at the end. Files in STATE_DIR/wandb; a resumed run continues the same W&B run.
    wandb: bool = False
    # The W&B project the run goes to.
    wandb_project: str = "navrl-daemon"
    # The W&B entity (a user or team) that owns the project; "": your default one.
    wandb_entity: str = ""
    # The run's name in W&B ("": W&B makes one up).
    wandb_run_name: str = ""
    # "online" (after `wandb login`), "offline" (files only; `wandb sync` them later), or
    # "": W&B's own choice (the WANDB_MODE variable, else online).
    wandb_mode: Literal["", "online", "offline"] = ""


class Config(Section):
    run: RunConfig = RunConfig()
    env: EnvConfig = EnvConfig()
    ppo: PPOConfig = PPOConfig()
    pipeline: PipelineConfig = PipelineConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    archive: ArchiveConfig = ArchiveConfig()
    prefetch: PrefetchConfig = PrefetchConfig()
    offline: OfflineConfig = OfflineConfig()
    distributed: DistributedConfig = DistributedConfig()
    metrics: MetricsConfig = MetricsConfig()
    log: LogConfig = LogConfig()

    @model_validator(mode="after")
    def _batch_splits(self) -> Config:
        frames = self.env.num_envs * self.ppo.rollout_length
        if self.ppo.minibatches > frames:
            raise ValueError(
                f"ppo.minibatches: at most env.num_envs * ppo.rollout_length = {frames}, "
                f"got {self.ppo.minibatches}"
            )
        pipeline = self.pipeline
        one_buffer = pipeline.lease_pool < 2 and not pipeline.compress_rollouts
        if pipeline.max_policy_lag > 0 and one_buffer:
            raise ValueError(
                "pipeline.lease_pool: max_policy_lag = 1 overlaps collection and training "
                f"and needs at least 2 buffers (or compress_rollouts = true), got "
                f"{pipeline.lease_pool}"
            )
        if pipeline.compress_rollouts and self.ppo.minibatches > self.env.num_envs:
            raise ValueError(
                "ppo.minibatches: pipeline.compress_rollouts cuts minibatches out of whole "
                f"envs, so at most env.num_envs = {self.env.num_envs}, got {self.ppo.minibatches}"
            )
        return self

    @model_validator(mode="after")
    def _offline(self) -> Config:
        objective = self.offline.objective
        if objective != "none" and not self.prefetch.paths:
            raise ValueError(
                f'prefetch.paths: offline.objective = "{objective}" needs at least one '
                "dataset file or glob"
            )
        if objective == "ppo+bc" and self.prefetch.layout != "archive":
            raise ValueError(
                'prefetch.layout: offline.objective = "ppo+bc" clones recorded navigation '
                'actions and needs "archive" (rollout archives), got '
                f'"{self.prefetch.layout}"'
            )
        return self

    @model_validator(mode="after")
    def _update_path(self) -> Config:
        # What this config alone says about the learner; the learner checks again with
        # what it is built with (a distributed run's reducer, the device "auto" gave).
        why_not = NOT_FAST["env_groups"] if self.pipeline.compress_rollouts else None
        why_not_graph = NOT_GRAPH["aux_loss"] if self.offline.objective == "ppo+bc" else None
        device = None if self.run.device == "auto" else self.run.device.split(":")[0]
        try:
            path = update_path(
                self.ppo.update_path, device, why_not=why_not, why_not_graph=why_not_graph
            )
            if device is not None or self.ppo.update_path == "eager":  # else: the learner
                compile_step(self.ppo.compile, path.value)
        except ConfigError as err:
            raise ValueError(str(err)) from None
        return self

    @model_validator(mode="after")
    def _kl_adaptive(self) -> Config:
        ppo = self.ppo
        if ppo.lr_schedule != "kl_adaptive":
            return self
        if not ppo.lr_min <= ppo.actor_lr <= ppo.lr_max:
            raise ValueError(
                f"ppo.actor_lr: the kl_adaptive schedule starts from it and keeps it within "
                f"[lr_min, lr_max] = [{ppo.lr_min}, {ppo.lr_max}], got {ppo.actor_lr}"
            )
        if self.pipeline.compress_rollouts:
            raise ValueError(
                'ppo.lr_schedule: "kl_adaptive" measures the KL on the rollout after the '
                "update; pipeline.compress_rollouts hands the rollout back before it ends"
            )
        return self

    @model_validator(mode="after")
    def _dual_clip(self) -> Config:
        if 0.0 < self.ppo.dual_clip <= 1.0 + self.ppo.clip_ratio:
            raise ValueError(
                f"ppo.dual_clip: 0 (off) or above 1 + ppo.clip_ratio = "
                f"{1.0 + self.ppo.clip_ratio}, got {self.ppo.dual_clip}"
            )
        return self

    @model_validator(mode="after")
    def _target_kl(self) -> Config:
        if self.ppo.target_kl > 0 and self.pipeline.max_policy_lag > 0:
            raise ValueError(
                "ppo.target_kl: with pipeline.max_policy_lag = 1 the rollout's policy is one "
                "update behind, so a first minibatch's KL already holds the last update's "
                "move and the early stop would skip whole updates; set one of them to 0"
            )
        return self

    @model_validator(mode="after")
    def _collect_path(self) -> Config:
        device = None if self.run.device == "auto" else self.run.device
        try:
            collect_path(self.env, device, captured=None)
        except ConfigError as err:
            raise ValueError(str(err)) from None
        return self

    @property
    def frames_per_iteration(self) -> int:
        return self.env.num_envs * self.ppo.rollout_length


# ---------------------------------------------------------------------------- loading


def _walk(value: Any, where: str = "") -> Iterable[tuple[str, Any]]:
    """Every leaf of nested tables and lists, with its dotted path."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, f"{where}[{i}]")
    else:
        yield where, value


def resolve_device(cfg: Config) -> str:
    if cfg.run.device != "auto":
        return cfg.run.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
