"""The shipped NavRL configs: config/navrl.toml (the recipe for NavRL's full task), its
static form config/navrl-static.toml and NavRL's own settings config/navrl-original.toml.

They load as a user loads them (`config show`), the original holds the values that
docs/navrl-task.md gives for NavRL, and the recipe trains through every one of its
curriculum stages in a real daemon at a CPU size (promotions forced by rules every
evaluation meets)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from navrl_daemon.config import PromotionRule, load_config, to_toml
from tests.conftest import REPO, navrl_cli

CONFIGS = ("navrl.toml", "navrl-static.toml", "navrl-original.toml")
RECIPE = REPO / "config" / "navrl.toml"


def dotted(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


@pytest.mark.parametrize("name", CONFIGS)
def test_each_config_loads_with_config_show(name: str) -> None:
    done = navrl_cli("config", "show", "--config", f"config/{name}")
    assert done.returncode == 0, done.stderr[-2000:]
    shown = tomllib.loads(done.stdout)
    assert shown["env"]["num_envs"] == 1024  # NavRL's scale; a CPU passes env.num_envs=256


def test_the_recipe_holds_its_curriculum_as_toml_stages() -> None:
    raw = tomllib.loads(RECIPE.read_text())
    stages = raw["env"]["curriculum"]  # [[env.curriculum]] tables, not one inline string
    assert [s["name"] for s in stages] == [
        "long hops",
        "crossings",
        "slow dynamic crossings",
        "navrl crossings",
    ]
    cfg = load_config(RECIPE, [], environ={})
    # The target is NavRL's full task, evaluated as NavRL evaluates: 350 pillars, 80 moving
    # obstacles at NavRL's speeds, the crossing layout over the whole episode.
    last = cfg.env.stage_env(len(stages) - 1)
    assert (last.num_dynamic_obstacles, last.navigation.dynamic_speed_range) == (80, [0.5, 1.5])
    assert (cfg.eval.num_obstacles, cfg.eval.layout, cfg.eval.max_steps) == (350, "navrl", 2200)
    assert cfg.env.curriculum[-1].promote is None
    # The moving obstacles come after the static stages, on a density floor of 250 pillars.
    assert [cfg.env.stage_env(i).num_dynamic_obstacles for i in range(4)] == [0, 0, 40, 80]
    floors = [
        cfg.env.navigation.map_levels[cfg.env.stage_env(i).navigation.min_level] for i in range(4)
    ]
    assert floors == [0, 0, 250, 250]


def test_the_static_form_is_the_recipe_without_moving_obstacles() -> None:
    recipe = load_config(RECIPE, [], environ={})
    static = load_config(REPO / "config" / "navrl-static.toml", [], environ={})
    assert static.env.num_dynamic_obstacles == 0
    assert [s.name for s in static.env.curriculum] == ["long hops", "crossings"]
    for i in range(2):  # the same two static stages as the recipe's first two
        assert static.env.stage_env(i).model_dump() == recipe.env.stage_env(i).model_dump() | {
            "num_dynamic_obstacles": 0
        }
    assert static.ppo.lr_schedule == "linear" and recipe.ppo.lr_schedule == "constant"
    assert static.eval == recipe.eval


def navrl_values() -> dict[str, Any]:
    """docs/navrl-task.md §0's table: NavRL's value for each key that holds one here."""
    text = (REPO / "docs" / "navrl-task.md").read_text()
    section = text[text.index("## 0. Configuration values") : text.index("## 1. ")]
    values: dict[str, Any] = {}
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) != 3 or not cells[2].startswith("`"):
            continue
        keys = re.findall(r"`([a-z_]+(?:\.[a-z_]+)+)`", cells[2])
        value = cells[0]
        if value.startswith("["):  # a [min, max] range
            found: list[Any] = [json.loads(value[: value.index("]") + 1])]
        else:
            found = [float(n) for n in re.findall(r"\d+(?:\.\d+)?(?:e-?\d+)?", value)]
            found = found[: len(keys)] if len(found) >= len(keys) else found * len(keys)
        values.update(zip(keys, found, strict=True))
    return values


def test_the_original_holds_navrl_s_values_as_docs_navrl_task_gives_them() -> None:
    expected = navrl_values()
    # every row of §0 that names a key: scale, episode, obstacles, PPO, cadence
    assert len(expected) >= 15, expected
    cfg = load_config(REPO / "config" / "navrl-original.toml", [], environ={})
    for key, value in expected.items():
        assert dotted(cfg, key) == value, key
    # The code that trained NavRL's checkpoint (docs/navrl-task.md, "differs on purpose").
    assert (cfg.env.navigation.smoothness_penalty, cfg.ppo.gae_cut_truncation) == (False, False)
    assert (
        cfg.env.curriculum == []
        and cfg.env.navigation.spawn == "border"
        and cfg.env.navigation.num_maps == 1
    )
    assert cfg.ppo.lr_schedule == "constant" and not cfg.ppo.mirror


def test_the_recipe_trains_through_every_stage_switch_at_a_cpu_size(tmp_path: Path) -> None:
    cfg = load_config(RECIPE, [], environ={})
    for stage in cfg.env.curriculum[:-1]:  # every evaluation passes: promoted at each one
        stage.promote = PromotionRule(reach_goal=0.0, collision=1.0, evals=1)
    forced = tmp_path / "navrl-forced.toml"
    forced.write_text(to_toml(cfg))
    state = tmp_path / "state"
    iterations = 6  # evaluations after iterations 1, 2, 3 promote; 3 more at the last stage
    done = navrl_cli(
        "run",
        "--config",
        str(forced),
        "--state-dir",
        str(state),
        "run.device=cpu",
        "run.torch_threads=1",
        "env.num_envs=8",
        "ppo.rollout_length=8",
        "ppo.epochs=1",
        "ppo.minibatches=2",
        "eval.num_envs=4",
        "eval.max_steps=20",
        "eval.interval=1",
        "log.summary_interval=1",
        "metrics.port=0",
        f"run.total_frames={iterations * 64}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(x) for x in done.stderr.splitlines() if x.startswith("{")]
    promotions = [
        (e["from_stage"], e["to_stage"], e["name"])
        for e in events
        if e["event"] == "curriculum promotion"
    ]
    assert promotions == [
        (0, 1, "crossings"),
        (1, 2, "slow dynamic crossings"),
        (2, 3, "navrl crossings"),
    ]
    history = [json.loads(x) for x in (state / "history.jsonl").read_text().splitlines()]
    assert len(history) == iterations
    assert history[-1]["curriculum_stage"] == 3
    # On the moving obstacles no env flies below the floor (250 pillars, level 4 of 7).
    for row in history:
        if row["curriculum_stage"] >= 2:
            assert sum(row["level_shares"][:4]) == 0, row["level_shares"]
    results = [json.loads(x) for x in (state / "eval" / "results.jsonl").read_text().splitlines()]
    assert [r["curriculum_stage"] for r in results][:3] == [0, 1, 2]
    assert all("held_out_reach_goal" in r for r in results)  # eval.held_out_seed = 1000
