"""Density levels per env (`env.navigation.map_levels`), the spawn mix
(`env.navigation.crossing_share`) and the evaluation's maps (`eval.map_seed`,
`eval.num_maps`, `eval.held_out_seed`, `eval.num_obstacles`)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from navrl_daemon.config import load_config
from navrl_daemon.env.contract import STAT_KEYS
from navrl_daemon.env.navigation import NavigationEnv
from navrl_daemon.rl.eval_config import evaluation_key
from navrl_daemon.rl.evaluations import Evaluations, make_eval_env
from navrl_daemon.rl.policy import NavRLPolicy
from tests.conftest import navrl_cli

LEVELS = [0, 10, 30, 60]


def small(*overrides: str):
    return load_config(
        None,
        [
            "run.device=cpu",
            "env.num_envs=8",
            "env.field_size=20.0",
            "env.num_obstacles=60",
            "env.num_dynamic_obstacles=0",
            "env.max_episode_length=40",
            "env.navigation.num_maps=2",
            "eval.num_envs=4",
            *overrides,
        ],
        environ={},
    )


def levels_env(*overrides: str) -> NavigationEnv:
    return NavigationEnv(small(f"env.navigation.map_levels={LEVELS}", *overrides).env, seed=3)


def test_a_level_flies_the_first_pillars_of_its_map():
    """The LiDAR of an env at level l sees exactly the boxes of its map's first
    map_levels[l] pillars (the overwrite cut made among those pillars only)."""
    env = levels_env()
    env.reset()
    plain = NavigationEnv(small().env, seed=3)  # the same maps, no levels
    assert torch.equal(plain.pillars.corner_px, env.pillars.corner_px)
    pose = (torch.tensor([[1.0, 0.5, 1.0]]).expand(8, 3), torch.zeros(8))
    for level, count in enumerate(LEVELS):
        env.level = torch.full((8,), level)
        prefix = [env.pillars.boxes(m, count) for m in range(2)]
        plain.set_pillars(prefix)
        scan = env.lidar.distances(*pose, env.slot)
        assert torch.equal(scan, plain.lidar.distances(*pose, plain.map_id))
    full = [plain.pillars.boxes(m) for m in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(prefix, full, strict=True))  # top = whole map


def test_a_prefix_keeps_the_spacing_rule_and_its_own_overlaps():
    env = levels_env()
    boxes = env.pillars.boxes(0, 10)
    assert len(boxes) >= 10  # every one of the 10 pillars is (partly) visible
    assert len(env.pillars.boxes(0, 0)) == 0


def _end_episodes(env: NavigationEnv, reach: list[float], collision: list[float]) -> None:
    """Envs whose episodes just ended with these stats, reset as torchrl's auto-reset does."""
    env.episode_stats[:, STAT_KEYS.index("reach_goal")] = torch.tensor(reach)
    env.episode_stats[:, STAT_KEYS.index("collision")] = torch.tensor(collision)
    env.episode_stats[:, STAT_KEYS.index("episode_len")] = 5.0
    every = torch.ones(8, 1, dtype=torch.bool)
    env.reset(TensorDict({"_reset": every}, batch_size=[8]))


def test_levels_move_up_on_reaching_down_on_collision_and_stay_on_time_outs():
    env = levels_env()
    env.reset()
    assert env.level.tolist() == [0] * 8
    env.level = torch.tensor([0, 0, 1, 2, 3, 3, 2, 1])
    _end_episodes(
        env,
        reach=[1, 0, 1, 0, 1, 0, 0, 1],
        collision=[0, 1, 0, 1, 0, 1, 0, 1],
    )
    assert env.level.tolist() == [1, 0, 2, 1, 3, 2, 2, 1]
    assert env.level_shares() == [0.125, 0.375, 0.375, 0.125]
    # Counted at the level each episode was flown at: [ended, reached, collided].
    assert env.level_outcomes() == [[2, 1, 1], [2, 2, 1], [2, 0, 1], [2, 1, 1]]
    assert env.level_outcomes() == [[0, 0, 0]] * 4  # read once


def test_masked_resets_move_only_the_envs_whose_episode_ended():
    """The masked auto-reset (no host sync) moves the same levels as the indexed one,
    and only where an episode ended this step."""
    moved = {}
    for mode in ("indexed", "masked"):
        env = levels_env(f"env.navigation.reset_mode={mode}", "env.max_episode_length=1")
        td = env.reset()
        goal = env.goal.clone()
        # Four drones at their goal (reached when the one-step episode ends), four not.
        start = torch.where(torch.arange(8)[:, None] < 4, goal, goal + torch.tensor([3.0, 0, 0]))
        td = env.place_drones(start, goal)
        td.set(("agents", "action"), torch.zeros(8, 1, 3))
        env.step_and_maybe_reset(td)
        moved[mode] = env.level.tolist(), env.level_outcomes()
    assert moved["indexed"] == moved["masked"]
    levels, outcomes = moved["masked"]
    assert levels == [1, 1, 1, 1, 0, 0, 0, 0]
    assert outcomes == [[8, 4, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]]


def test_levels_are_part_of_the_env_state_and_old_states_load():
    env = levels_env()
    env.reset()
    env.level = torch.tensor([0, 1, 2, 3, 3, 2, 1, 0])
    state = env.state_dict_env()
    other = levels_env()
    other.load_state_dict_env(state)
    assert torch.equal(other.level, env.level)
    del state["level"]  # a state saved before env.navigation.map_levels existed
    other.load_state_dict_env(state)
    assert other.level.tolist() == [0] * 8


def test_a_min_level_is_a_floor_for_new_envs_collisions_and_loaded_states():
    """env.navigation.min_level: fresh envs start at it, a collision there keeps the env there (one
    above it moves down to it), a reach still moves up, and a state saved with a lower
    floor loads with its envs below the floor moved up to it."""
    env = levels_env("env.navigation.min_level=2")
    env.reset()
    assert env.level.tolist() == [2] * 8
    env.level = torch.tensor([2, 2, 3, 3, 2, 3, 2, 3])
    _end_episodes(
        env,
        reach=[1, 0, 0, 1, 0, 0, 0, 0],
        collision=[0, 1, 1, 0, 0, 0, 1, 1],
    )
    assert env.level.tolist() == [3, 2, 2, 3, 2, 3, 2, 2]
    low = levels_env()
    low.level = torch.tensor([0, 1, 2, 3, 3, 2, 1, 0])
    env.load_state_dict_env(low.state_dict_env())
    assert env.level.tolist() == [2, 2, 2, 3, 3, 2, 2, 2]
    top = levels_env(f"env.navigation.min_level={len(LEVELS) - 1}")  # every env on its whole map
    assert torch.equal(top.slot, top.map_id * len(LEVELS) + len(LEVELS) - 1)


def test_without_levels_every_env_flies_its_whole_map():
    env = NavigationEnv(small().env, seed=3)
    assert env.level_counts == [60] and torch.equal(env.slot, env.map_id)


def test_crossing_share_one_puts_every_goal_opposite_its_start():
    env = NavigationEnv(small("env.navigation.crossing_share=1.0", "env.num_envs=256").env, seed=1)
    env.reset()
    s = 20.0 / 2 + 4.0
    start, goal = env.start[:, :2], env.goal[:, :2]
    # A border point has one coordinate at +-S; the opposite side has the other sign.
    on_y = start[:, 1].abs() == s
    assert torch.all(torch.where(on_y, goal[:, 1] == -start[:, 1], goal[:, 0] == -start[:, 0]))


def test_a_crossing_share_mixes_crossings_into_navrls_rule():
    env = NavigationEnv(small("env.navigation.crossing_share=0.5", "env.num_envs=4096").env, seed=1)
    env.reset()
    s = 14.0
    start, goal = env.start[:, :2], env.goal[:, :2]
    opposite = ((start + goal).abs() < 1e-4) | ((start - goal).abs() > 2 * s - 1e-4)
    crossing = opposite.any(-1)
    # 0.5 always + 0.5 x NavRL's quarter chance of the opposite side = 0.625.
    assert 0.58 < crossing.float().mean() < 0.67


def test_a_crossing_share_mixes_crossings_into_local_hops():
    """With spawn = "local", a crossing_share of the episodes cross the field from a
    border point to the opposite side; the rest are hops within the field."""
    hops = ("env.navigation.spawn=local", "env.goal_distance=[2.0, 6.0]", "env.num_envs=4096")
    env = NavigationEnv(small(*hops, "env.navigation.crossing_share=0.3").env, seed=1)
    env.reset()
    s = 20.0 / 2 + 4.0
    start, goal = env.start[:, :2], env.goal[:, :2]
    crossing = start.abs().amax(-1) == s
    assert 0.27 < crossing.float().mean() < 0.33
    c_start, c_goal = start[crossing], goal[crossing]
    on_y = c_start[:, 1].abs() == s
    assert torch.all(
        torch.where(on_y, c_goal[:, 1] == -c_start[:, 1], c_goal[:, 0] == -c_start[:, 0])
    )
    h_start, h_goal = start[~crossing], goal[~crossing]
    assert torch.all(h_start.abs() <= 10.0) and torch.all(h_goal.abs() <= 10.0)
    assert torch.all((h_goal - h_start).norm(dim=-1) <= 6.0 + 1e-4)
    # Episodes that end draw anew: the mix holds over resets too.
    ended = env.start.clone()
    env.reset()
    assert not torch.equal(ended, env.start)
    assert 0.27 < (env.start[:, :2].abs().amax(-1) == s).float().mean() < 0.33


def test_a_curriculum_stage_sets_the_crossing_share():
    stage = '{name = "hops", spawn = "local", crossing_share = 0.25, promote = {reach_goal = 0.5}}'
    cfg = small(f'env.curriculum=[{stage}, {{name = "navrl"}}]')
    assert cfg.env.stage_env(0).navigation.crossing_share == 0.25
    assert cfg.env.stage_env(1).navigation.crossing_share == 0.0


def test_the_evaluation_flies_the_whole_map_of_the_chosen_seed():
    cfg = small(
        f"env.navigation.map_levels={LEVELS}", "env.navigation.min_level=2", "eval.num_maps=3"
    )
    train = make_eval_env(cfg, "cpu")
    assert train.level_counts == [60] and train.num_maps == 3
    plain = NavigationEnv(small("env.navigation.num_maps=3").env, seed=0)  # run.seed's maps
    assert torch.equal(train.pillars.corner_px, plain.pillars.corner_px)
    held_out = make_eval_env(small("eval.map_seed=1000"), "cpu")
    assert not torch.equal(held_out.pillars.corner_px, NavigationEnv(small().env).pillars.corner_px)


def test_the_evaluation_can_fly_fewer_pillars_than_training():
    """eval.num_obstacles: training flies 60-pillar maps with a level above 30, every
    evaluation (main and held out) the 30-pillar maps of the same seeds."""
    cfg = small(
        "env.navigation.map_levels=[0, 30, 60]", "eval.num_obstacles=30", "eval.held_out_seed=7"
    )
    assert NavigationEnv(cfg.env).pillars.corner_px.shape[1] == 60
    for seed in (None, 7):
        env = make_eval_env(cfg, "cpu", map_seed=seed)
        plain = NavigationEnv(small("env.num_obstacles=30").env, seed=seed or 0)
        assert env.level_counts == [30]
        assert torch.equal(env.pillars.corner_px, plain.pillars.corner_px)
        assert torch.equal(env.pillars.height, plain.pillars.height)
    unset = small("env.navigation.map_levels=[0, 30, 60]")
    assert make_eval_env(unset, "cpu").pillars.corner_px.shape[1] == 60  # 0: the env's count


def test_an_evaluation_is_the_same_whether_its_pillar_count_is_named_or_not():
    """evaluation_key compares what is flown: eval.num_obstacles = 0 and the env's own
    count fly the same maps; another count does not."""
    assert evaluation_key(small()) == evaluation_key(small("eval.num_obstacles=60"))
    assert evaluation_key(small()) != evaluation_key(small("eval.num_obstacles=30"))


def test_held_out_evaluations_are_reported_beside_the_main_ones():
    torch.manual_seed(0)
    policy = NavRLPolicy()
    plain = Evaluations(small(), "cpu")(policy)
    both = Evaluations(small("eval.held_out_seed=1000"), "cpu")(policy)
    assert {k: v for k, v in both.items() if not k.startswith("held_out_")} == plain
    assert {f"held_out_{k}" for k in plain} == {k for k in both if k.startswith("held_out_")}


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["env.navigation.map_levels=[100,50]"], "map_levels: pillar counts in ascending order"),
        (["env.navigation.map_levels=[100,400]"], "map_levels: a level is a prefix"),
        (["env.navigation.map_levels=[-1,5]"], "env.navigation.map_levels"),
        (
            ["env.navigation.map_levels=[0,50]", "env.navigation.min_level=2"],
            "min_level: an index into map_levels",
        ),
        (["env.navigation.min_level=1"], "without map_levels there is one level"),
        (["env.curriculum=[{min_level = 1}]"], "min_level: an index into map_levels"),
        (["env.navigation.crossing_share=1.5"], "env.navigation.crossing_share"),
        (
            ["env.navigation.crossing_share=0.5", "env.navigation.spawn=crossing"],
            "crossing_share: mixes crossings",
        ),
        (
            ['env.curriculum=[{spawn = "crossing", crossing_share = 0.5}]'],
            "crossing_share: mixes crossings",
        ),
        (["eval.map_seed=-2"], "eval.map_seed"),
        (["eval.held_out_seed=-5"], "eval.held_out_seed"),
        (["eval.num_maps=-1"], "eval.num_maps"),
        (["eval.num_obstacles=-1"], "eval.num_obstacles"),
        (["eval.num_obstacles=20001"], "eval.num_obstacles"),
    ],
)
def test_bad_values_exit_78_naming_the_key(overrides: list[str], needle: str):
    proc = navrl_cli("config", "show", *overrides)
    assert proc.returncode == 78, proc.stderr
    assert needle in proc.stderr


def test_a_run_reports_its_envs_levels_in_history_and_metrics(tmp_path):
    """Where the envs are is what a levels run is about: every history row carries the
    share of envs per level (they sum to 1; some envs leave level 0 once episodes reach
    their goals); without levels, rows have none (the gauge: tests/test_curriculum.py)."""
    import json

    import anyio

    from navrl_daemon.pipeline.daemon import serve
    from tests.conftest import TINY

    cfg = load_config(
        None,
        [
            *TINY,
            "env.num_envs=16",
            "env.num_dynamic_obstacles=0",
            "env.num_obstacles=8",
            "env.max_episode_length=6",  # short episodes: levels move within the run
            "env.goal_distance=[0.1, 0.3]",  # goals within reach at the start: some move up
            f"env.navigation.map_levels={[0, 4, 8]}",
            "run.total_frames=1280",  # 10 iterations of 128 frames
            "eval.interval=0",
        ],
        environ={},
    )
    anyio.run(serve, cfg, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    shares = [row["level_shares"] for row in rows]
    assert shares and all(len(s) == 3 and abs(sum(s) - 1) < 1e-3 for s in shares)
    assert any(s[0] < 1 for s in shares), shares  # envs left level 0
    # How each level's episodes ended, per row: episodes of 6 steps, 16 envs, 10 iterations
    # of 8 steps: every env ends an episode at least once per row.
    outcomes = [row["level_outcomes"] for row in rows]
    assert all(len(o) == 3 for o in outcomes)
    assert sum(level["episodes"] for o in outcomes for level in o) >= 16 * len(rows)
    for level in (lv for o in outcomes for lv in o):
        if level["episodes"]:
            assert 0 <= level["reach_goal"] <= 1 and 0 <= level["collision"] <= 1
        else:
            assert level["reach_goal"] is None and level["collision"] is None
    assert any(o[0]["reach_goal"] for o in outcomes), outcomes  # some reached at level 0
    without = load_config(None, [*TINY, "run.total_frames=128", "eval.interval=0"], environ={})
    anyio.run(serve, without, tmp_path / "plain")
    plain = (tmp_path / "plain" / "history.jsonl").read_text()
    assert "level_shares" not in plain and "level_outcomes" not in plain


def test_level_outcomes_count_the_episodes_training_counts_across_a_resume(tmp_path):
    """A full reset (the collector's start, a resume) abandons the episodes in flight: it
    ends none. So every row's level_outcomes hold exactly the episodes its training stats
    count, in a fresh run and after a resume (they once counted every env at the start)."""
    import json

    import anyio

    from navrl_daemon.pipeline.daemon import serve
    from tests.conftest import TINY

    def cfg(frames: int):
        return load_config(
            None,
            [
                *TINY,
                "env.num_envs=16",
                "env.num_dynamic_obstacles=0",
                "env.num_obstacles=8",
                "env.max_episode_length=12",
                "env.goal_distance=[0.1, 0.3]",
                f"env.navigation.map_levels={[0, 4, 8]}",
                f"run.total_frames={frames}",
                "eval.interval=0",
                "checkpoint.interval=4",
            ],
            environ={},
        )

    anyio.run(serve, cfg(512), tmp_path)  # 4 iterations of 8 steps
    anyio.run(serve, cfg(1024), tmp_path)  # resumed from iteration 4
    rows = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert any(row.get("resumed_from") == 4 for row in rows), rows
    counted = [sum(level["episodes"] for level in row["level_outcomes"]) for row in rows]
    assert counted == [row["train_episodes"] for row in rows]
    assert sum(counted) > 0  # 12-step episodes end within the run
