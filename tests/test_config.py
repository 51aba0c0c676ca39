"""Config: every error path exits 78 naming the key path; `config show` round-trips."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from navrl_daemon.config import (
    Config,
    NavigationConfig,
    load_config,
    parse_override,
    to_toml,
    validate,
)
from navrl_daemon.config.loader import MAX_DEPTH
from navrl_daemon.errors import ConfigError
from navrl_daemon.testing.crafted_config import nested_toml
from tests.conftest import REPO, navrl_cli


def test_defaults_are_navrl_numbers() -> None:
    cfg = Config()
    assert cfg.env.num_envs == 1024
    assert cfg.env.num_obstacles == 350
    assert cfg.env.num_dynamic_obstacles == 80
    assert cfg.env.max_episode_length == 2200
    assert (cfg.ppo.rollout_length, cfg.ppo.epochs, cfg.ppo.minibatches) == (32, 4, 16)
    assert cfg.ppo.actor_lr == cfg.ppo.feature_extractor_lr == 5e-4
    assert cfg.ppo.clip_ratio == 0.1 and cfg.ppo.entropy_coef == 1e-3


@pytest.mark.parametrize(
    "name", ["default.toml", "navrl.toml", "navrl-static.toml", "navrl-original.toml"]
)
def test_shipped_configs_validate(name: str) -> None:
    load_config(REPO / "config" / name, environ={})


def test_precedence_file_then_environment_then_overrides(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text("[env]\nnum_envs = 8\nnum_obstacles = 3\n[run]\nseed = 1\n")
    env = {"NAVRL_ENV__NUM_OBSTACLES": "5", "NAVRL_RUN__SEED": "2", "OTHER": "x"}
    cfg = load_config(f, ["run.seed=3", "run.device=cuda:1"], environ=env)
    assert cfg.env.num_envs == 8
    assert cfg.env.num_obstacles == 5
    assert cfg.run.seed == 3
    assert cfg.run.device == "cuda:1"


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("env.num_envs=64", ("env.num_envs", 64)),
        ("ppo.actor_lr=1e-3", ("ppo.actor_lr", 1e-3)),
        ("env.goal_distance=[1.5, 3]", ("env.goal_distance", [1.5, 3])),
        ("run.device=cuda:0", ("run.device", "cuda:0")),
        ('run.state_dir="/var/lib/navrl"', ("run.state_dir", "/var/lib/navrl")),
        ("env.navigation.smoothness_penalty=false", ("env.navigation.smoothness_penalty", False)),
        ("env.curriculum.0.spawn=local", ("env.curriculum.0.spawn", "local")),
    ],
)
def test_override_values_parse_as_toml(item: str, expected: tuple[str, object]) -> None:
    assert parse_override(item) == expected


def test_an_index_sets_one_entry_of_a_list_and_keeps_the_rest() -> None:
    """A lever on one curriculum stage is one override, not the whole list retyped."""
    recipe = REPO / "config" / "navrl.toml"
    base = load_config(recipe, environ={})
    overrides = [
        "env.curriculum.0.num_dynamic_obstacles=8",
        "env.curriculum.1.dynamic_speed_range=[0.3, 0.8]",
        "env.navigation.map_levels.1=60",
    ]
    env = {"NAVRL_ENV__CURRICULUM__2__MIN_LEVEL": "3"}
    cfg = load_config(recipe, overrides, environ=env)
    stages, before = cfg.env.curriculum, base.env.curriculum
    assert stages[0].num_dynamic_obstacles == 8 and before[0].num_dynamic_obstacles == 0
    assert stages[1].dynamic_speed_range == [0.3, 0.8]
    assert stages[2].min_level == 3 and before[2].min_level == 4
    assert cfg.env.navigation.map_levels == [0, 60, *base.env.navigation.map_levels[2:]]
    # everything not named is the file's
    assert [s.name for s in stages] == [s.name for s in before]
    assert stages[3] == before[3]
    assert cfg.model_copy(update={"env": base.env}) == base


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["env.curriculum.9.num_obstacles=1"], "env.curriculum: a list of 4 entries"),
        (["env.curriculum.name=x"], "env.curriculum: a list of 4 entries"),
        (["env.curriculum.0.promote.5=1"], "env.curriculum.0.promote: is not a list"),
        (["env.num_envs.0=1"], "env.num_envs: is a value"),
        (["env.curriculum.0.num_dynamic_obstacles=12"], "curriculum[0] (long hops)"),
    ],
)
def test_a_bad_index_is_config_error(overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(REPO / "config" / "navrl.toml", overrides, environ={})
    assert needle in str(err.value)


def test_an_index_into_a_list_the_config_does_not_hold_exits_78() -> None:
    """Without a config file the curriculum is the built-in empty default: nothing to index."""
    proc = navrl_cli("config", "show", "env.curriculum.0.num_obstacles=100")
    assert proc.returncode == 78
    assert "env.curriculum: is not a list the config holds" in proc.stderr


def test_round_trip_through_toml(tmp_path: Path) -> None:
    cfg = load_config(REPO / "config" / "default.toml", ["env.goal_distance=[1, 2.5]"], environ={})
    f = tmp_path / "resolved.toml"
    f.write_text(to_toml(cfg))
    assert load_config(f, environ={}) == cfg


# Each row: how the bad value is given, and what the message must name.
BAD = [
    (["env.bogus=1"], "env.bogus: unknown key"),
    (["bogus.key=1"], "bogus: unknown key"),
    (["env.num_envs=0"], "env.num_envs"),
    (["env.num_envs=-3"], "env.num_envs"),
    (['env.num_envs="many"'], "env.num_envs"),
    (["env.num_envs=1.5"], "env.num_envs"),
    (["env.navigation.smoothness_penalty=1"], "env.navigation.smoothness_penalty"),
    (["ppo.clip_ratio=2.0"], "ppo.clip_ratio"),
    (["ppo.gamma=0"], "ppo.gamma"),
    (["env.goal_distance=[4, 2]"], "goal_distance"),
    (["env.goal_distance=[1]"], "env.goal_distance"),
    (["env.num_dynamic_obstacles=7"], "env.num_dynamic_obstacles"),
    (["env.navigation.spawn=sideways"], "env.navigation.spawn"),
    (["run.device=gpu"], "run.device"),
    (["log.level=loud"], "log.level"),
    (["ppo.minibatches=5000", "env.num_envs=2"], "ppo.minibatches"),
    (["env=3"], "env"),
    (["pipeline.max_policy_lag=1", "pipeline.lease_pool=1"], "pipeline.lease_pool"),
    (["pipeline.max_policy_lag=2"], "pipeline.max_policy_lag"),
    (["ppo.target_kl=-0.01"], "ppo.target_kl"),
    (["ppo.dual_clip=1.05"], "ppo.dual_clip"),
    (["ppo.dual_clip=-3"], "ppo.dual_clip"),
    (['ppo.mirror_ratio="own"'], "ppo.mirror_ratio = 'own': removed"),
    (["ppo.mirror_ratio=2"], "ppo.mirror_ratio = 2: removed"),
    (['env.stage_switch="gradual"'], "env.stage_switch"),
    (["ppo.target_kl=2"], "ppo.target_kl"),
    (['ppo.target_kl="small"'], "ppo.target_kl"),
    (["ppo.target_kl=0.02", "pipeline.max_policy_lag=1"], "ppo.target_kl"),
    (["ppo.feature_extractor_max_grad_norm=-1"], "ppo.feature_extractor_max_grad_norm"),
    (["ppo.feature_extractor_max_grad_norm=inf"], "ppo.feature_extractor_max_grad_norm"),
    (["env.num_envs"], "expected KEY=VALUE"),
    (["=3"], "is not a dotted path"),
    (["env..num_envs=3"], "is not a dotted path"),
    (["0.num_envs=3"], "is not a dotted path"),
    (["env.num_envs=[1,"], "override env.num_envs"),
    (["env.num_envs="], "override env.num_envs: empty value"),
    (["env.num_envs=2", "env.num_envs.x=1"], "env.num_envs: is a value"),
    (["checkpoint.interval=20", "checkpoint.keep_every=30"], "keep_every (30) must be a multi"),
    (["checkpoint.interval=0", "checkpoint.keep_every=100"], "keep_every (100) must be a multi"),
    (["checkpoint.keep_every=-1"], "checkpoint.keep_every"),
]


@pytest.mark.parametrize(("overrides", "needle"), BAD)
def test_bad_override_is_config_error(overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides, environ={})
    assert needle in str(err.value)


def test_a_retired_key_at_its_kept_value_loads_as_without_it(tmp_path: Path) -> None:
    """A config saved while ppo.mirror_ratio existed (a state dir's config.toml holds
    `mirror_ratio = "behaviour"`) still loads, as the same config without the key; the
    value that was taken out exits 78 saying so."""
    saved = tmp_path / "config.toml"
    saved.write_text('[ppo]\nmirror = true\nmirror_ratio = "behaviour"\n')
    here = "run.state_dir=here"
    assert load_config(saved, [here], environ={}) == load_config(
        None, ["ppo.mirror=true", here], environ={}
    )
    proc = navrl_cli("config", "show", "--config", str(saved))
    assert proc.returncode == 0, proc.stderr
    assert "mirror_ratio" not in proc.stdout
    saved.write_text('[ppo]\nmirror = true\nmirror_ratio = "own"\n')
    proc = navrl_cli("config", "show", "--config", str(saved))
    assert proc.returncode == 78 and "ppo.mirror_ratio = 'own': removed" in proc.stderr


@pytest.mark.parametrize(("overrides", "needle"), BAD[::4])
def test_cli_exits_78_with_key_path(overrides: list[str], needle: str) -> None:
    proc = navrl_cli("config", "show", *overrides)
    assert proc.returncode == 78, proc.stderr
    assert needle in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[env]\nnum_envs = "64"\n', "env.num_envs"),
        ("[env]\nnum_obstacles = 3\nlidar = 2\n", "env.lidar: unknown key"),
        ("[ppo]\nepochs = 0\n", "ppo.epochs"),
        ("[env\nnum_envs = 3\n", "not valid TOML"),
        ("run = 5\n", "run"),
    ],
)
def test_bad_file_exits_78(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(text)
    proc = navrl_cli("config", "show", "--config", str(f))
    assert proc.returncode == 78
    assert needle in proc.stderr


def test_missing_file_exits_78(tmp_path: Path) -> None:
    proc = navrl_cli("config", "show", "--config", str(tmp_path / "nope.toml"))
    assert proc.returncode == 78
    assert "not found" in proc.stderr


def test_bad_environment_variable_exits_78() -> None:
    proc = navrl_cli("config", "show", env={"NAVRL_ENV__NUM_ENVS": "zero"})
    assert proc.returncode == 78
    assert "env.num_envs" in proc.stderr


def test_config_show_round_trips_through_cli(tmp_path: Path) -> None:
    first = navrl_cli("config", "show", "--config", "config/default.toml", "env.num_envs=16")
    assert first.returncode == 0, first.stderr
    f = tmp_path / "shown.toml"
    f.write_text(first.stdout)
    second = navrl_cli("config", "show", "--config", str(f))
    assert second.returncode == 0
    # The header line names where the values came from; the values round-trip.
    assert "config/default.toml" in first.stdout.splitlines()[0]
    assert str(f) in second.stdout.splitlines()[0]
    assert second.stdout.splitlines()[1:] == first.stdout.splitlines()[1:]


def test_usage_error_exits_2() -> None:
    assert navrl_cli("frobnicate").returncode == 2
    assert navrl_cli("eval", "--episodes", "many").returncode == 2


@pytest.mark.parametrize("kind", ["table", "array"])
@pytest.mark.parametrize("depth", [40, 500])
def test_config_nested_too_deep_exits_78(tmp_path: Path, kind: str, depth: int) -> None:
    """A file or an override nesting 500 levels deep was a RecursionError (exit 1) in the
    TOML parser; 40 levels parsed and went on to the backend. Both exit 78 saying so."""
    f = tmp_path / "deep.toml"
    f.write_text(f"[env]\noptions = {{x = {nested_toml(kind, depth)}}}\n")
    for args in (["--config", str(f)], [f"env.options.x={nested_toml(kind, depth)}"]):
        proc = navrl_cli("config", "show", *args)
        assert proc.returncode == 78, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr and "RecursionError" not in proc.stderr
        assert "nested" in proc.stderr and f"at most {MAX_DEPTH}" in proc.stderr, proc.stderr


def test_config_nesting_within_the_bound_loads() -> None:
    """Backend options a few levels deep, and a stored config's dict, load as before."""
    cfg = load_config(None, [f"env.options.x={nested_toml('table', MAX_DEPTH - 3)}"], environ={})
    assert cfg.env.options["x"]["a"]["a"]
    deep: object = 1
    for _ in range(2 * MAX_DEPTH):
        deep = [deep]
    with pytest.raises(ConfigError, match=f"at most {MAX_DEPTH}"):
        validate({"env": {"options": {"x": deep}}})


def test_total_frames_beyond_what_the_counters_hold_exits_78() -> None:
    """10**29 frames was accepted; the frame counters (checkpoints, metrics) hold 2**62."""
    assert load_config(None, [f"run.total_frames={2**62}"], environ={}).run.total_frames == 2**62
    proc = navrl_cli("config", "show", f"run.total_frames={10**29}")
    assert proc.returncode == 78, proc.stderr
    assert "run.total_frames" in proc.stderr and str(2**62) in proc.stderr


# The embedded backend's keys as a config written before [env.navigation] named them.
OLD_LAYOUT = """
[env]
num_envs = 8
num_maps = 2
spawn = "local"
map_levels = [0, 2, 4]
num_obstacles = 4

[[env.curriculum]]
spawn = "crossing"
min_level = 1
promote = {evals = 1}

[[env.curriculum]]
"""
NEW_LAYOUT = """
[env]
num_envs = 8
num_obstacles = 4

[env.navigation]
num_maps = 2
spawn = "local"
map_levels = [0, 2, 4]

[[env.curriculum]]
spawn = "crossing"
min_level = 1
promote = {evals = 1}

[[env.curriculum]]
"""
MOVED_NOTE = "config keys under their old names"


def loaded(path: Path, overrides: list[str], environ: dict[str, str]) -> tuple[Config, list[str]]:
    """The config and the moved-key notes its load logged."""
    with capture_logs() as logs:
        cfg = load_config(path, overrides, environ=environ)
    notes = [e for e in logs if e["event"].startswith(MOVED_NOTE)]
    return cfg, [", ".join(e["moved"]) for e in notes]


def test_old_names_load_as_the_new_layout_with_one_note_per_load(tmp_path: Path) -> None:
    """A file, a dotted override and a NAVRL_ variable that name env.navigation's keys
    the old way load to the config the new layout gives, each load noting every old name
    once in one line."""
    old, new = tmp_path / "old.toml", tmp_path / "new.toml"
    old.write_text(OLD_LAYOUT)
    new.write_text(NEW_LAYOUT)
    plain, notes = loaded(new, ["env.navigation.safety_weight=2.0"], {})
    assert notes == [] and plain.env.navigation.spawn == "local"
    assert plain.env.stage_env(0).navigation.spawn == "crossing"  # stages keep plain names
    cfg, notes = loaded(old, ["env.safety_weight=2.0"], {"NAVRL_ENV__RESET_MODE": '"indexed"'})
    assert cfg.model_copy(update={"run": plain.run}) == plain.model_copy(
        update={"env": plain.env.replaced(reset_mode="indexed")}
    )
    assert len(notes) == 1
    for key in ("num_maps", "spawn", "map_levels", "safety_weight", "reset_mode"):
        assert f"env.{key} -> env.navigation.{key}" in notes[0]
    # An old name in a later layer still wins over the new name in an earlier one.
    over, notes = loaded(new, ["env.num_maps=3", "env.map_levels.1=3"], {})
    assert over.env.navigation.num_maps == 3 and over.env.navigation.map_levels == [0, 3, 4]
    assert len(notes) == 1 and "env.map_levels -> env.navigation.map_levels" in notes[0]
    # A stored config (a checkpoint's, eval's) goes through validate alone: the same.
    data = tomllib.loads(OLD_LAYOUT)
    with capture_logs() as logs:
        stored = validate(data)
    assert stored.env == load_config(new, environ={}).env
    assert len([e for e in logs if e["event"].startswith(MOVED_NOTE)]) == 1
    assert "num_maps" in data["env"]  # the caller's dict is left as it was


def test_an_old_and_a_new_name_that_disagree_are_refused(tmp_path: Path) -> None:
    """Within one file (or stored config) the two names of a key must agree; across
    layers the later one wins (above)."""
    f = tmp_path / "c.toml"
    f.write_text("[env]\nnum_maps = 2\n[env.navigation]\nnum_maps = 3\n")
    with pytest.raises(ConfigError, match=r"env\.num_maps = 2 and env\.navigation\.num_maps = 3"):
        load_config(f, environ={})
    f.write_text("[env]\nnum_maps = 2\n[env.navigation]\nnum_maps = 2\n")
    assert load_config(f, environ={}).env.navigation.num_maps == 2
    moved_later = load_config(f, ["env.navigation.num_maps=4"], environ={})
    assert moved_later.env.navigation.num_maps == 4


def test_config_show_writes_the_new_layout_and_the_note_goes_to_stderr(tmp_path: Path) -> None:
    f = tmp_path / "old.toml"
    f.write_text(OLD_LAYOUT)
    done = navrl_cli("config", "show", "--config", str(f), "env.reach_hold=5")
    assert done.returncode == 0, done.stderr
    assert "[env.navigation]" in done.stdout and MOVED_NOTE not in done.stdout
    shown = tomllib.loads(done.stdout)
    assert shown["env"]["navigation"]["reach_hold"] == 5
    assert not set(shown["env"]) & set(NavigationConfig.model_fields)
    assert len([line for line in done.stderr.splitlines() if MOVED_NOTE in line]) == 1
    bad = tmp_path / "bad.toml"
    bad.write_text("[env]\nnum_maps = 2\n[env.navigation]\nnum_maps = 3\n")
    refused = navrl_cli("config", "show", "--config", str(bad))
    assert refused.returncode == 78 and "is the old name of" in refused.stderr
    assert "Traceback" not in refused.stderr
