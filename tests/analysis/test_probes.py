"""The policy probes of analysis/probes.py: LiDAR use, goal-distance use, path statistics per
outcome and the share of training frames spent at the goal."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import anyio
import pytest
import torch

from navrl_daemon.analysis.probes import (
    PASS_OFFSETS,
    collision_approach,
    collision_hazard,
    goal_distance_use,
    goal_hover_share,
    lidar_use,
    path_stats,
    pillar_pass,
    pillar_pass_env,
)
from navrl_daemon.config import load_config
from navrl_daemon.env import make_env
from navrl_daemon.env.navigation.geometry import goal_to_world, yaw_of
from navrl_daemon.rl.evaluate import Trajectories, evaluate
from navrl_daemon.rl.evaluations import make_eval_env
from navrl_daemon.rl.policy import OBS_KEY, NavRLPolicy

_OVERRIDES = [
    "run.device=cpu",
    "env.field_size=12.0",
    "env.num_obstacles=30",
    "env.num_dynamic_obstacles=0",
    "env.max_episode_length=60",
    "env.spawn_margin=0.5",  # starts at the field edge: pillars within range
    "eval.num_envs=6",
]


def _cfg():
    return load_config(None, _OVERRIDES, environ={})


def _policy(seed: int) -> NavRLPolicy:
    torch.manual_seed(seed)
    policy = NavRLPolicy()
    with torch.no_grad():  # heads large enough that the features move the action
        for layer in (policy.beta_head.alpha_layer, policy.beta_head.beta_layer):
            layer.weight.normal_(0.0, 1.0)
    return policy


def test_a_policy_that_cannot_see_flies_the_same_blind_with_no_action_gap():
    """With the LiDAR branch's output fixed (its last layer and norm zeroed), the scan
    cannot move the action: blind numbers equal the real ones, the gap is 0."""
    cfg = _cfg()
    policy = _policy(0)
    cnn = policy.feature_extractor.module[0].module
    with torch.no_grad():
        cnn[-2].weight.zero_()
        cnn[-2].bias.zero_()
    env = make_eval_env(cfg, "cpu")
    probe = lidar_use(env, policy, seed=0, max_steps=60)
    for k in ("reach_goal", "collision", "truncated"):
        assert probe[f"blind_{k}"] == probe[k]
    assert probe["action_gap_mps"] == 0.0 and probe["action_gap_near_mps"] == 0.0


def test_a_policy_that_reads_its_lidar_shows_a_gap_and_the_real_numbers_are_navrls_eval():
    cfg = _cfg()
    policy = _policy(1)
    env = make_eval_env(cfg, "cpu")
    probe = lidar_use(env, policy, seed=0, max_steps=60)
    plain = evaluate(env, policy, seed=0, max_steps=60)
    assert {k: probe[k] for k in ("reach_goal", "collision")} == {
        k: plain[k] for k in ("reach_goal", "collision")
    }
    assert probe["action_gap_mps"] > 0.0
    assert 0.0 <= probe["near_step_share"] <= 1.0


def test_a_goal_distance_cap_beyond_the_field_changes_nothing_and_a_short_one_does():
    """Capped above every distance in the field the flight is the evaluation's, number for
    number; capped at 1 m the policy reads other states and flies otherwise."""
    cfg = _cfg()
    policy = _policy(1)
    env = make_eval_env(cfg, "cpu")
    plain = evaluate(env, policy, seed=0, max_steps=60)
    capped = goal_distance_use(env, policy, [1000.0, 1.0], seed=0, max_steps=60)
    assert set(capped) == {"1000", "1"}
    assert capped["1000"] == plain
    assert capped["1"]["return"] != plain["return"]


def test_path_stats_against_a_hand_made_flight():
    """Two drones: one climbs 0 → 3 m straight up over 3 steps and reaches its goal; one
    flies 2 steps of 1 m along x and collides."""
    positions = torch.zeros(4, 2, 3)
    positions[:, 0, 2] = torch.tensor([0.0, 1.0, 2.0, 3.0])
    positions[1:, 1, 0] = torch.tensor([1.0, 2.0, 2.0])
    stats = torch.zeros(2, 5)
    stats[0, 2] = 1.0  # reach_goal
    stats[1, 3] = 1.0  # collision
    traj = Trajectories(
        positions=positions,
        steps=torch.tensor([3, 2]),
        goal=torch.tensor([[0.0, 0.0, 3.0], [4.0, 0.0, 0.0]]),
        map_id=torch.zeros(2, dtype=torch.long),
        stats=stats,
        dynamic=torch.zeros(4, 0, 3),
        dynamic_size=torch.zeros(0, 3),
        pillars=torch.zeros(0, 5),
        field_size=10.0,
        num_maps=1,
    )
    out = path_stats(traj, dt=0.5)
    reached, collided = out["reached"], out["collided"]
    assert reached["episodes"] == 1.0 and collided["episodes"] == 1.0
    assert reached["mean_z_m"] == 1.5 and reached["max_z_m"] == 3.0
    assert reached["above_2_5m_share"] == 0.25
    assert reached["speed_mps"] == 3.0 / 1.5 and reached["path_over_straight"] == 1.0
    assert collided["speed_mps"] == 2.0 / 1.0 and collided["path_over_straight"] == 0.5
    assert collided["end_distance_xy_m"] == 2.0 and "timed out" not in out


def _flights(positions, steps, goal, collided) -> Trajectories:
    stats = torch.zeros(len(steps), 5)
    stats[:, 3] = torch.tensor(collided, dtype=torch.float32)  # collision
    stats[:, 2] = 1.0 - stats[:, 3]  # the others reached
    return Trajectories(
        positions=positions,
        steps=torch.tensor(steps),
        goal=torch.tensor(goal),
        map_id=torch.zeros(len(steps), dtype=torch.long),
        stats=stats,
        dynamic=torch.zeros(positions.shape[0], 0, 3),
        dynamic_size=torch.zeros(0, 3),
        pillars=torch.zeros(0, 5),
        field_size=50.0,
        num_maps=1,
    )


def test_collision_hazard_counts_metres_flown_until_each_end():
    """Drone 0 flies 4 m along x (1 m per step) and collides, its goal 25 m away; drone 1
    flies 2 m and reaches its goal 2 m away, then is reset far away (not flown); drone 2
    flies 3 m to a goal 15 m away and collides."""
    positions = torch.zeros(5, 3, 3)
    positions[:, 0, 0] = torch.arange(5.0)
    positions[1:3, 1, 1] = torch.tensor([1.0, 2.0])
    positions[3:, 1, 1] = 100.0  # after its end: an auto-reset jump that is not flight
    positions[:4, 2, 0] = torch.arange(4.0)
    positions[4, 2, 0] = 50.0
    goal = [[25.0, 0.0, 0.0], [0.0, 2.0, 0.0], [15.0, 0.0, 0.0]]
    traj = _flights(positions, [4, 2, 3], goal, [1.0, 0.0, 1.0])
    out = collision_hazard(traj)
    assert out["episodes"] == 3 and out["collisions"] == 2
    assert out["metres_flown"] == 9.0
    assert out["collisions_per_100m"] == 100.0 * 2 / 9.0
    by = out["by_distance_m"]
    assert by["0-10"] == {"episodes": 1.0, "collision": 0.0}
    assert by["10-20"] == {"episodes": 1.0, "collision": 1.0}
    assert by["20-30"] == {"episodes": 1.0, "collision": 1.0}
    assert by["30-"] == {"episodes": 0.0, "collision": None}


def test_collision_approach_tells_head_on_from_glancing_hits():
    """A pillar box from x 2 to 3, y -1 to 1 (1.5 m tall). Drone 0 flies along x into its
    face (head-on, ends 0.25 m from it); drone 1 slides along y past its side, 0.2 m from
    it (glancing); drone 2 comes in at 60 degrees (oblique); drone 3 collides 2 m from
    any pillar (not a pillar's); drone 4 reaches its goal (not counted)."""
    positions = torch.zeros(6, 5, 3)
    positions[:, 0, 0] = torch.linspace(0.75, 1.75, 6)
    positions[:, 1, 0] = 1.8
    positions[:, 1, 1] = torch.linspace(-2.0, -0.5, 6)
    positions[:, 2, 0] = torch.linspace(1.125, 1.75, 6)  # 60 degrees off the face's normal
    positions[:, 2, 1] = torch.linspace(-1.0825, 0.0, 6)
    positions[:, 3, 0] = -3.0
    traj = _flights(positions, [5, 5, 5, 5, 5], [[9.0, 0.0, 0.0]] * 5, [1, 1, 1, 1, 0])
    box = torch.tensor([[2.0, -1.0, 3.0, 1.0, 1.5]])
    out = collision_approach(traj, [box], dt=0.1)
    assert {k: out[k] for k in ("head_on", "oblique", "glancing", "not_a_pillar")} == {
        "head_on": 1,
        "oblique": 1,
        "glancing": 1,
        "not_a_pillar": 1,
    }
    assert out["pillar_height_m_median"] == 1.5
    # speeds over the last 5 steps of 0.1 s: 2.0, 3.0 and 2.5 m/s
    assert out["speed_mps_median"] == 2.5


def test_pillar_pass_a_drone_that_flies_straight_hits_every_pillar_on_its_line():
    """A policy that flies straight at the goal (no steering) hits the 0.8 m pillar at
    every offset up to 0.4 m; the scene's env is one drone per offset."""
    env = pillar_pass_env(_scene_cfg())
    assert env.batch_size[0] == env.num_maps == len(PASS_OFFSETS)
    out = pillar_pass(env, _Straight(), starts=(3.0,), beyond=3.0)
    row = out["by_start_m"]["3"]
    assert all(row["collided"]) and out["collisions"] == len(PASS_OFFSETS)
    assert set(row["side"]) == {0} and out["one_side_share"] is None  # none got past
    assert out["shortest_beam_m"] < 0.3  # the collision rule: a beam under 0.3 m


def test_pillar_pass_a_drone_that_veers_one_way_passes_on_that_side():
    """A policy that flies forward and sideways at once passes every offset on one side;
    the scene is replayed exactly (same numbers on a second flight)."""
    env = pillar_pass_env(_scene_cfg())
    out = pillar_pass(env, _Straight(sideways=1.0), starts=(3.0,), beyond=3.0)
    row = out["by_start_m"]["3"]
    assert not any(row["collided"]) and out["one_side_share"] == 1.0
    assert len(set(row["side"])) == 1 and row["side"][0] != 0
    assert out == pillar_pass(env, _Straight(sideways=1.0), starts=(3.0,), beyond=3.0)


def test_pillar_pass_refuses_an_env_that_is_not_its_scene():
    env = make_env(_cfg().env, num_envs=4, layout="navrl")
    with pytest.raises(ValueError, match="one drone and one map per offset"):
        pillar_pass(env, _Straight())


def _scene_cfg():
    return _cfg().env.model_copy(update={"max_episode_length": 1000})  # no time-out


class _Straight:
    """Flies at 1 m/s towards the goal in the goal frame, plus `sideways` m/s to its left."""

    action_limit = 2.0

    def __init__(self, sideways: float = 0.0) -> None:
        self.sideways = sideways

    def act(self, td, deterministic=False, generator=None):
        direction = td.get((*OBS_KEY, "direction"))  # [n,1,3]
        v = torch.tensor([1.0, self.sideways, 0.0]).expand_as(direction)
        td.set(("agents", "action"), goal_to_world(v, yaw_of(direction)))
        return td


class _Still:
    """Commands zero velocity: a drone stays where it is."""

    def act(self, td, deterministic=False, generator=None):
        n = td.batch_size[0]
        td.set(("agents", "action"), torch.zeros(n, 1, 3))
        return td


def test_the_hover_share_counts_the_frames_flown_at_the_goal():
    """Drones that start on their goal and hold still spend every frame there (and reach
    it in every episode that ends); drones 3-4 m from it none."""
    results = {}
    for name, distance in (("on_goal", "[0.05, 0.1]"), ("away", "[3.0, 4.0]")):
        cfg = load_config(
            None,
            [
                *_OVERRIDES,
                "env.navigation.spawn=local",
                f"env.goal_distance={distance}",
                "env.navigation.spawn_height=[1.0, 1.0]",
                "env.num_envs=6",
            ],
            environ={},
        )
        env = make_env(cfg.env, seed=0)
        results[name] = goal_hover_share(env, _Still(), steps=200, seed=0)
    on_goal, away = results["on_goal"], results["away"]
    assert on_goal["frames_at_goal"] == 1.0 and away["frames_at_goal"] == 0.0
    # 60-step episodes over the last 100 steps: every env ends one or two, all time-outs.
    assert 6 <= on_goal["episodes"] <= 12 and on_goal["reached"] == on_goal["episodes"]
    assert away["episodes"] >= 6 and away["reached"] == 0


def test_diagnose_reports_the_hover_share_at_a_checkpoints_levels(tmp_path: Path):
    from navrl_daemon.pipeline.daemon import serve
    from tests.conftest import TINY

    levels = ["env.navigation.map_levels=[0, 2, 4]", "env.num_dynamic_obstacles=0"]
    cfg = load_config(None, [*TINY, *levels, "run.total_frames=128"], environ={})
    anyio.run(serve, cfg, tmp_path / "state")
    ckpt = sorted((tmp_path / "state" / "checkpoints").glob("*.nrc"))[-1]
    (row,) = _diagnose(ckpt, tmp_path, ["--pillars", "--hover-share", "20"], [*TINY, *levels])
    assert row["probe"] == "hover_share" and row["saved_levels"] is True
    assert 0.0 <= row["frames_at_goal"] <= 1.0 and row["steps"] == 20


def test_diagnose_flies_a_checkpoint_on_the_maps_of_its_own_run(tmp_path: Path):
    """A `.nrc` holds its run's config: its `train` rows fly that run's maps (run.seed = 3,
    2 maps), whatever the command line's seed; a `.pt` holds none and flies the command
    line's. The same policy on the same maps flies the same numbers."""
    from navrl_daemon.pipeline.daemon import serve
    from navrl_daemon.storage.policy_file import load_any_policy
    from tests.conftest import TINY

    run = ["run.seed=3", "env.navigation.num_maps=2"]
    cfg = load_config(None, [*TINY, *run, "run.total_frames=128"], environ={})
    anyio.run(serve, cfg, tmp_path / "state")
    ckpt = sorted((tmp_path / "state" / "checkpoints").glob("*.nrc"))[-1]
    policy, snap = load_any_policy(ckpt)  # what diagnose.py reads: the policy and its run
    assert snap is not None and snap["config"]["run"]["seed"] == 3
    policy_file = tmp_path / "policy.pt"
    torch.save(policy, policy_file)
    again, none = load_any_policy(policy_file)
    assert none is None and all(torch.equal(again[k], v) for k, v in policy.items())
    options = ["--pillars", "4", "--layouts", "train"]
    saved = _diagnose(ckpt, tmp_path, options, TINY)  # no seed on the command line
    told = _diagnose(policy_file, tmp_path, ["--maps", "train", *options], [*TINY, *run])
    other = _diagnose(policy_file, tmp_path, ["--maps", "train", *options], TINY)
    assert [(r["maps"], r["maps_seed"]) for r in saved] == [("train", 3), ("held_out", 1000)]
    assert told[0]["maps_seed"] == 3 and other[0]["maps_seed"] == 0
    numbers = ("reach_goal", "collision", "return", "episode_len")
    assert {k: told[0][k] for k in numbers} == {k: saved[0][k] for k in numbers}
    assert other[0]["return"] != saved[0]["return"]  # other maps, another flight


def test_diagnose_hazard_and_probe_rows_keep_the_evaluations_numbers(tmp_path: Path):
    """--hazard and --probe share one recorded flight per row; its numbers are the plain
    evaluation's."""
    policy_file = tmp_path / "policy.pt"
    torch.save(_policy(3).state_dict(), policy_file)  # it flies: some drones collide
    options = ["--pillars", "30", "--layouts", "navrl", "train", "--maps", "train"]
    plain = _diagnose(policy_file, tmp_path, options, _OVERRIDES)
    probed = _diagnose(policy_file, tmp_path, ["--hazard", "--probe", *options], _OVERRIDES)
    assert [r["layout"] for r in probed] == ["navrl", "train"]
    numbers = ("reach_goal", "collision", "return", "episode_len", "episodes")
    for before, row in zip(plain, probed, strict=True):
        assert "hazard" not in before and "paths" not in before
        assert {k: row[k] for k in numbers} == {k: before[k] for k in numbers}
        # the recorded flight's outcomes per drone (from its paths) are the evaluation's
        assert row["outcomes"] == before["outcomes"] and len(row["outcomes"]) == row["episodes"]
        assert row["outcomes"].count("C") == round(row["collision"] * row["episodes"])
        assert row["outcomes"].count("R") == round(row["reach_goal"] * row["episodes"])
        h = row["hazard"]
        assert h["collisions"] == round(row["collision"] * row["episodes"])
        kinds = ("head_on", "oblique", "glancing", "not_a_pillar")
        assert sum(h["approach"][k] for k in kinds) == h["collisions"]
        assert sum(b["episodes"] for b in h["by_distance_m"].values()) == row["episodes"]
    navrl, train = probed
    assert sum(p["episodes"] for p in navrl["paths"].values()) == navrl["episodes"]
    assert "paths" not in train and "lidar_use" in navrl
    assert train["hazard"]["metres_flown"] > 0.0 and train["hazard"]["collisions"] > 0, train


def test_evaluation_outcomes_per_drone_are_its_numbers_and_its_paths():
    """`evaluate_outcomes`' codes count what `evaluate` averages, and name for each drone
    what the recorded flight of the same drones shows (`Trajectories.outcomes`)."""
    from navrl_daemon.rl.evaluate import evaluate_outcomes, evaluate_recorded

    cfg = _cfg().model_copy(update={"eval": _cfg().eval.model_copy(update={"num_envs": 12})})
    for seed in (3, 4):
        policy = _policy(seed)
        env = make_eval_env(cfg, "cpu")
        result, codes = evaluate_outcomes(env, policy, seed=0, max_steps=60)
        assert result == evaluate(env, policy, seed=0, max_steps=60)
        assert len(codes) == 12 and set(codes) <= set("RCOT")
        for code, key in (("R", "reach_goal"), ("C", "collision"), ("O", "out_of_bounds")):
            assert codes.count(code) == round(result[key] * 12), (codes, result)
        _, flown = evaluate_recorded(env, policy, seed=0, max_steps=60)
        assert codes == flown.codes()  # what diagnose.py writes for a recorded flight
    assert "C" in codes or "O" in codes or "T" in codes  # not all reached: a real test


def test_paired_compares_two_checkpoints_drone_by_drone(tmp_path: Path):
    """benchmarks/paired.py on diagnose.py's output of two policies flown on the same
    drones: each shared row compared, its counts those of the rows' outcomes; a file
    without outcomes, or a baseline no checkpoint matches, exits 65 saying so."""
    files = {}
    for name, seed in (("navrl_like.pt", 3), ("mine.pt", 4)):
        files[name] = tmp_path / name
        torch.save(_policy(seed).state_dict(), files[name])
    out = tmp_path / "diag.json"
    options = ["--pillars", "30", "--layouts", "navrl", "--maps", "train", "held_out"]
    options += ["--held-out-maps", "2", "--out", str(out)]
    proc = _script("diagnose.py", "--checkpoint", *map(str, files.values()), *options, *_OVERRIDES)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["results"]

    def paired(*args: str) -> subprocess.CompletedProcess[str]:
        return _script("paired.py", *args)

    proc = paired(str(out), "--against", "navrl_like", "--out", str(tmp_path / "p.json"))
    assert proc.returncode == 0, proc.stderr
    comparisons = json.loads((tmp_path / "p.json").read_text())["comparisons"]
    assert sorted((c["a"], c["b"], c["maps"]) for c in comparisons) == [
        (str(files["mine.pt"]), str(files["navrl_like.pt"]), m) for m in ("held_out", "train")
    ]
    for c in comparisons:
        mine = next(r for r in rows[c["a"]] if r["maps"] == c["maps"])["outcomes"]
        base = next(r for r in rows[c["b"]] if r["maps"] == c["maps"])["outcomes"]
        reach = c["reach_goal"]
        assert reach["only_a"] == sum(x == "R" != y for x, y in zip(mine, base, strict=True))
        assert reach["only_b"] == sum(y == "R" != x for x, y in zip(mine, base, strict=True))
        assert reach["share_a"] == mine.count("R") / len(mine)
        collided = c["collision"]
        assert collided["only_b"] == sum(y == "C" != x for x, y in zip(mine, base, strict=True))
    # seed 3's policy collides where seed 4's does not: the drones are told apart
    assert any(c["collision"]["only_b"] for c in comparisons)

    # the baseline flown in another run among moving obstacles: other drones, not paired
    doc = json.loads(out.read_text())
    for name, dynamic in (("mine.pt", 0), ("navrl_like.pt", 8)):
        part = {**doc, "results": {str(files[name]): doc["results"][str(files[name])]}}
        part["eval"] = {**doc["eval"], "dynamic_obstacles": dynamic}
        (tmp_path / f"{name}.json").write_text(json.dumps(part))
    proc = paired(
        str(tmp_path / "mine.pt.json"),
        str(tmp_path / "navrl_like.pt.json"),
        "--against",
        "navrl_like",
    )
    assert proc.returncode == 65 and "no row" in proc.stderr, proc.stderr

    proc = paired(str(out), "--against", "nothing_like_it")
    assert (
        proc.returncode == 65 and "no checkpoint's path contains 'nothing_like_it'" in proc.stderr
    )
    doc = json.loads(out.read_text())
    for checkpoint_rows in doc["results"].values():
        for row in checkpoint_rows:
            del row["outcomes"]  # as diagnose.py wrote it before outcomes were kept
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    proc = paired(str(old), "--against", "navrl_like")
    assert proc.returncode == 65 and "no per-drone outcomes" in proc.stderr


def _diagnose(checkpoint: Path, tmp_path: Path, options: list[str], overrides: list[str]):
    """benchmarks/diagnose.py on one checkpoint, as a user runs it: its rows. The overrides
    come after `--out`, so that no list-valued option takes them."""
    out = tmp_path / "diag.json"
    proc = _script(
        "diagnose.py", "--checkpoint", str(checkpoint), *options, "--out", str(out), *overrides
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())["results"][str(checkpoint)]


def _script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """benchmarks/NAME run as a user runs it, from the repository root
    (navrl_daemon/testing/forked.py)."""
    from navrl_daemon.testing import forked

    return forked.run_script(f"benchmarks/{name}", list(args), timeout=300)
