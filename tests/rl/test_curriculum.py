"""env.curriculum: the config's validation and the promotion rule (rl/curriculum.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from navrl_daemon.config import Config, load_config, to_toml
from navrl_daemon.errors import ConfigError
from navrl_daemon.rl.curriculum import Curriculum, Progress
from tests.conftest import TINY, navrl_cli

STAGES = (
    'env.curriculum=[{name = "open", num_obstacles = 0, num_dynamic_obstacles = 0,'
    " goal_distance = [1.0, 2.0], promote = {reach_goal = 0.8, collision = 0.1, evals = 2}},"
    ' {name = "slow", dynamic_speed_range = [0.2, 0.5], promote = {reach_goal = 0.5}},'
    ' {name = "full"}]'
)


def config(*overrides: str) -> Config:
    return load_config(None, [*TINY, *overrides], environ={})


def result(iteration: int, reach: float, collision: float = 0.0, stage: int = 0) -> dict:
    return {
        "iteration": iteration,
        "reach_goal": reach,
        "collision": collision,
        "curriculum_stage": stage,
    }


# ------------------------------------------------------------------------------ config


def test_stages_replace_only_their_keys_and_round_trip_through_toml(tmp_path: Path) -> None:
    cfg = config(STAGES)
    open_field, slow, full = (cfg.env.stage_env(i) for i in range(3))
    assert (open_field.num_obstacles, open_field.num_dynamic_obstacles) == (0, 0)
    assert open_field.goal_distance == [1.0, 2.0]
    assert open_field.field_size == cfg.env.field_size  # not a stage key: the section's
    assert slow.navigation.dynamic_speed_range == [0.2, 0.5] and slow.num_obstacles == 4
    assert full == cfg.env.model_copy(update={"curriculum": []})
    # The second stage's rule takes the defaults it left out.
    assert cfg.env.curriculum[1].promote is not None
    assert cfg.env.curriculum[1].promote.evals == 2
    path = tmp_path / "resolved.toml"
    path.write_text(to_toml(cfg))
    assert load_config(path, environ={}) == cfg


def test_no_curriculum_is_an_empty_list_and_the_default() -> None:
    assert config().env.curriculum == []
    assert "curriculum = []" in to_toml(config())


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        ("[{num_obstacles = 0}, {}]", "curriculum[0]: needs a promote rule"),
        ("[{promote = {}}, {promote = {}}]", "curriculum[1]: the last stage has nowhere"),
        (
            "[{name = 'x', num_dynamic_obstacles = 12, promote = {}}, {}]",
            "curriculum[0] (x): num_dynamic_obstacles: must be a multiple of 8",
        ),
        (
            "[{goal_distance = [3.0, 1.0], promote = {}}, {}]",
            "goal_distance: [min, max] with min <= max",
        ),
        ("[{num_envs = 4}]", "env.curriculum[0].num_envs: unknown key; allowed here: name,"),
        (
            "[{promote = {reach_goal = 1.5}}, {}]",
            "env.curriculum[0].promote.reach_goal: Input should be less than or equal to 1",
        ),
        ("[{promote = {evals = 0}}, {}]", "env.curriculum[0].promote.evals"),
        ("[{max_episode_length = 0}]", "max_episode_length: Input should be greater"),
    ],
)
def test_a_bad_curriculum_is_a_config_error_naming_the_stage(stages: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        config(f"env.curriculum={stages}")
    assert message in str(err.value)


def test_a_bad_curriculum_exits_78_on_the_command_line() -> None:
    proc = navrl_cli("config", "show", "env.curriculum=[{num_obstacles = 0}, {}]")
    assert proc.returncode == 78
    assert "env: curriculum[0]: needs a promote rule" in proc.stderr


# ------------------------------------------------------------------------------ the rule


def test_promotes_after_the_evals_in_a_row_and_a_failure_resets_the_count() -> None:
    c = Curriculum(config(STAGES).env)  # stage 0: reach >= 0.8, collision <= 0.1, 2 in a row
    assert c.observe(result(10, 0.9)) is None
    assert c.progress == Progress(stage=0, streak=1, last_eval=10)
    assert c.observe(result(20, 0.9, collision=0.2)) is None  # too many collisions
    assert c.progress.streak == 0
    assert c.observe(result(30, 0.8)) is None  # the bounds are inclusive
    promotion = c.observe(result(40, 1.0, collision=0.1))
    assert promotion is not None
    assert (promotion.iteration, promotion.from_stage, promotion.to_stage) == (40, 0, 1)
    assert promotion.result == {"reach_goal": 1.0, "collision": 0.1}
    assert c.progress == Progress(stage=1, streak=0, last_eval=40)
    assert c.applied == 0  # the producer applies it


def test_a_rank_follows_rank_0s_stage_forward_only() -> None:
    c = Curriculum(config(STAGES).env)
    c.observe(result(10, 0.9))
    c.follow(0)
    assert c.progress == Progress(stage=0, streak=1, last_eval=10)  # nothing to follow
    c.follow(1)
    assert c.progress == Progress(stage=1, streak=0, last_eval=10)
    c.follow(0)  # never backwards
    c.follow(99)  # never past the last stage
    assert c.stage == c.last


def test_holds_while_the_rule_is_not_met() -> None:
    c = Curriculum(config(STAGES).env)
    for i in range(1, 50):
        assert c.observe(result(i, 0.79)) is None
    assert c.progress == Progress(stage=0, streak=0, last_eval=49)


def test_nan_results_fail_the_rule() -> None:
    c = Curriculum(config(STAGES).env)
    c.observe(result(1, 0.9))
    c.observe(result(2, math.nan))
    assert c.progress.streak == 0


def test_results_from_another_stage_or_seen_before_do_not_count() -> None:
    c = Curriculum(config(STAGES).env)
    c.observe(result(1, 1.0))
    c.observe(result(1, 1.0))  # the same evaluation again
    assert c.progress.streak == 1
    c.observe(result(2, 1.0, stage=1))  # evaluated before a promotion was known, say
    assert c.progress == Progress(stage=0, streak=1, last_eval=2)
    assert c.observe(result(3, 1.0)) is not None


def test_the_last_stage_never_promotes() -> None:
    c = Curriculum(config(STAGES).env)
    c.load_state_dict({"stage": 2, "streak": 0, "last_eval": 0, "applied": 2})
    for i in range(1, 5):
        assert c.observe(result(i, 1.0, stage=2)) is None
    assert c.stage == 2


def test_replay_counts_results_up_to_the_checkpoint_the_last_of_each_iteration() -> None:
    c = Curriculum(config(STAGES).env)
    c.observe(result(10, 0.9))  # counted before the checkpoint
    rows = [
        result(10, 0.9),  # already counted
        result(20, 0.1),  # a crashed run's evaluation of iteration 20 ...
        result(30, 0.9),  # ... and of 30, past the checkpoint: not counted
        result(20, 0.95),  # the resumed run's evaluation of 20: this one counts
    ]
    promotions = c.replay(rows, upto=20)
    assert [p.to_stage for p in promotions] == [1]
    assert c.progress == Progress(stage=1, streak=0, last_eval=20)


def test_state_round_trips_and_a_shortened_curriculum_clamps() -> None:
    c = Curriculum(config(STAGES).env)
    c.observe(result(5, 0.9))
    c.applied = 0
    state = c.state_dict()
    assert state == {"stage": 0, "streak": 1, "last_eval": 5, "applied": 0}
    again = Curriculum(config(STAGES).env)
    again.load_state_dict(state)
    assert (again.progress, again.applied) == (c.progress, c.applied)
    two = Curriculum(config("env.curriculum=[{promote = {}}, {}]").env)
    two.load_state_dict({"stage": 2, "streak": 1, "last_eval": 9, "applied": 2})
    assert (two.stage, two.progress.streak, two.applied) == (1, 0, 1)


def test_an_empty_curriculum_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        Curriculum(config().env)


# ------------------------------------------------------------------------------ the env


def test_each_stage_builds_its_own_env() -> None:
    c = Curriculum(config(STAGES).env)
    open_field = c.build_env(0, device="cpu", seed=0)
    full = c.build_env(2, device="cpu", seed=0)
    assert open_field.dynamic.count == 0 and len(open_field.pillars.boxes(0)) == 0  # type: ignore[attr-defined]
    assert full.dynamic.count == 8 and full.pillars.height.shape[1] == 4  # type: ignore[attr-defined]
    slow = c.build_env(1, device="cpu", seed=0, num_envs=3, layout="navrl")
    assert slow.batch_size == (3,) and slow.dynamic.speed_range == (0.2, 0.5)  # type: ignore[attr-defined]


def test_a_promotion_keeps_each_envs_density_level() -> None:
    """With env.navigation.map_levels, the next stage's env starts each env at the level it
    reached."""
    two = (
        'env.curriculum=[{name = "slow", dynamic_speed_range = [0.2, 0.5],'
        " promote = {reach_goal = 0.5}}, {}]"
    )
    c = Curriculum(config(two, "env.navigation.map_levels=[0,2,4]").env)
    before = c.build_env(0, device="cpu", seed=0)
    before.level = torch.tensor([0, 1, 2, 2, 1, 0, 2, 1])  # type: ignore[attr-defined]
    after = c.build_env(1, device="cpu", seed=0, previous=before)
    assert after.level.tolist() == [0, 1, 2, 2, 1, 0, 2, 1]  # type: ignore[attr-defined]
    after.reset()  # a fresh start of every episode moves no level
    assert after.level.tolist() == [0, 1, 2, 2, 1, 0, 2, 1]  # type: ignore[attr-defined]
    plain = Curriculum(config(two).env).build_env(1, device="cpu", seed=0, previous=before)
    assert plain.level.tolist() == [0] * 8  # type: ignore[attr-defined]


def test_a_stage_with_a_higher_min_level_moves_the_envs_below_it_up() -> None:
    """A stage's min_level is a floor for the levels kept from the stage before: envs
    below it move up to it, the others keep theirs."""
    two = 'env.curriculum=[{name = "levels", promote = {reach_goal = 0.5}}, {min_level = 1}]'
    c = Curriculum(config(two, "env.navigation.map_levels=[0,2,4]").env)
    before = c.build_env(0, device="cpu", seed=0)
    before.level = torch.tensor([0, 1, 2, 2, 1, 0, 2, 1])  # type: ignore[attr-defined]
    after = c.build_env(1, device="cpu", seed=0, previous=before)
    assert after.level.tolist() == [1, 1, 2, 2, 1, 1, 2, 1]  # type: ignore[attr-defined]


def test_a_stage_of_short_episodes_is_evaluated_for_eval_max_steps() -> None:
    """A stage may train on short episodes; an `eval.max_steps` above them still evaluates
    episodes that long (NavRL's crossing needs its whole 2,200 steps). Without it, the
    stage's own episode length holds."""
    from navrl_daemon.rl.curriculum import StageEvaluation
    from navrl_daemon.rl.policy import make_policy

    short = (
        'env.curriculum=[{name = "hops", num_obstacles = 0, num_dynamic_obstacles = 0,'
        " max_episode_length = 10, promote = {reach_goal = 0.5}}, {}]"
    )
    lengths = {}
    for max_steps in (0, 25):
        cfg = config(short, f"eval.max_steps={max_steps}", "eval.num_envs=4")
        torch.manual_seed(0)
        evaluation = StageEvaluation(cfg, Curriculum(cfg.env), "cpu")
        result = evaluation(make_policy(cfg, "cpu"))
        assert result["curriculum_stage"] == 0 and result["collision"] == 0.0
        lengths[max_steps] = result["episode_len"]
    assert lengths[0] == 10.0  # the untrained policy hovers to the stage's time-out
    assert lengths[25] == 25.0


def test_a_stage_evaluation_tells_progress_on_both_map_sets() -> None:
    """The evaluator's stop check rides on `progress` (stages/evaluator.py): it reaches the
    training maps' and the held-out maps' evaluations, and an exception it raises ends
    the evaluation there."""
    from navrl_daemon.rl.curriculum import StageEvaluation
    from navrl_daemon.rl.evaluate import CHECK_EVERY
    from navrl_daemon.rl.policy import make_policy

    stages = 'env.curriculum=[{name = "a", promote = {reach_goal = 0.5}}, {}]'
    cfg = config(stages, "eval.max_steps=64", "eval.num_envs=4", "eval.held_out_seed=1000")
    cfg = cfg.model_copy(update={"env": cfg.env.model_copy(update={"max_episode_length": 64})})
    evaluation = StageEvaluation(cfg, Curriculum(cfg.env), "cpu")
    torch.manual_seed(0)
    policy = make_policy(cfg, "cpu")
    told: list[int] = []
    evaluation(policy, progress=lambda steps, _done: told.append(steps))
    # The untrained policy hovers to the time-out: each evaluation checks 64/16 times.
    assert told == [16, 32, 48, 64] * 2

    class Stop(Exception):
        pass

    def stop(steps: int, _done: int) -> None:
        raise Stop(steps)

    with pytest.raises(Stop) as stopped:
        evaluation(policy, progress=stop)
    assert stopped.value.args == (CHECK_EVERY,)


# ------------------------------------------------------------------------------ the switch

# Hops, then crossings of longer episodes: only per-episode keys differ.
HOPS_THEN_CROSSINGS = (
    'env.curriculum=[{name = "hops", goal_distance = [1.0, 2.0], max_episode_length = 30,'
    ' promote = {reach_goal = 0.5}}, {name = "crossings", spawn = "crossing"}]'
)


@pytest.mark.parametrize(
    ("overrides", "carries"),
    [
        ((HOPS_THEN_CROSSINGS,), False),  # env.stage_switch = "reset", the default
        ((HOPS_THEN_CROSSINGS, "env.stage_switch=episodes"), True),
        ((STAGES, "env.stage_switch=episodes"), False),  # obstacle counts differ
        (
            (
                'env.curriculum=[{name = "a", promote = {reach_goal = 0.5}}, {min_level = 1}]',
                "env.navigation.map_levels=[0,2,4]",
                "env.stage_switch=episodes",
            ),
            False,  # min_level moves envs to denser maps mid-episode
        ),
        (
            (
                'env.curriculum=[{name = "a", safety_weight = 2.0, reach_hold = 4,'
                " spawn_height = [1.0, 2.0], promote = {reach_goal = 0.5}}, {}]",
                "env.stage_switch=episodes",
            ),
            True,
        ),
    ],
    ids=["reset", "per-episode-keys", "obstacles", "min-level", "reward-and-ends"],
)
def test_episodes_carry_over_a_switch_only_between_stages_of_the_same_world(
    overrides: tuple[str, ...], carries: bool
) -> None:
    c = Curriculum(config(*overrides).env)
    assert c.carries_episodes(0, 1) is carries
    assert c.carries_episodes(1, 1) is (c.env.stage_switch == "episodes")


class _Holder:
    """What use_stage reads and writes of a Collector: its env, running td and config."""

    def __init__(self, cfg: Config, env, td) -> None:  # type: ignore[no-untyped-def]
        self.cfg, self.env, self.td = cfg, env, td


def _fly(env, td, steps: int, seed: int = 0):  # type: ignore[no-untyped-def]
    """`steps` auto-reset steps of a fixed random policy; the td to go on from."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        action = (torch.rand(env.num_envs, 1, 3, generator=gen) * 2 - 1) * 1.5
        td.set(("agents", "action"), action)
        _, td = env.step_and_maybe_reset(td)
    return td


def test_a_carried_switch_lets_the_episodes_in_flight_finish_then_spawns_the_new_stages() -> None:
    """With env.stage_switch = "episodes" the new stage's env takes over the old one's
    state and the running td: no episode restarts at the switch; each env's next episode
    starts by the new stage's rule (a crossing: on the border). "reset" restarts all."""
    from navrl_daemon.rl.curriculum import use_stage

    half = 10.0 / 2  # TINY's field
    for switch in ("episodes", "reset"):
        cfg = config(HOPS_THEN_CROSSINGS, f"env.stage_switch={switch}")
        c = Curriculum(cfg.env)
        env = c.build_env(0, device="cpu", seed=0)
        held = _Holder(cfg, env, None)
        held.td = _fly(env, env.reset(), 12)
        before = {k: v.clone() for k, v in env.state_tensors().items()}
        td = held.td
        carried = use_stage(held, c, 1, c.carries_episodes(0, 1))  # type: ignore[arg-type]
        assert carried is (switch == "episodes") and c.applied == 1
        new = held.env
        assert new is not env and new.cfg.navigation.spawn == "crossing"
        if not carried:
            assert new.step_count.tolist() == [0] * 8
            continue
        assert held.td is td
        after = new.state_tensors()
        assert all(torch.equal(before[k], after[k]) for k in before), "state not carried"
        start = new.start.clone()
        _fly(new, held.td, 51, seed=1)  # the new stage's 50 steps: every episode ended
        restarted = ~torch.isclose(new.start, start).all(-1)
        assert restarted.all(), "an episode of the old stage never ended"
        on_border = new.start[:, :2].abs().amax(-1) >= half
        assert on_border.all(), new.start


def test_a_stage_evaluation_says_whether_it_can_be_recorded() -> None:
    """`log.video_interval` asks the evaluation whether its env records the drones' paths
    (stages/evaluator.py: `RecordedEvaluate`); at a stage, the stage's eval env answers."""
    from navrl_daemon.rl.curriculum import StageEvaluation

    stages = 'env.curriculum=[{name = "a", promote = {reach_goal = 0.5}}, {}]'
    cfg = config(stages, "eval.num_envs=4")
    assert StageEvaluation(cfg, Curriculum(cfg.env), "cpu").recordable
