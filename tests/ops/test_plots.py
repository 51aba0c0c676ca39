"""`eval --plot`: the NavRL checkpoint's evaluation drawn from above, checked pixel by pixel."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from navrl_daemon.cli import main
from navrl_daemon.config import load_config
from navrl_daemon.ops.plots import (
    DPI,
    FIGURE_SIZE_IN,
    MAP_AXES,
    OUTCOME_COLOURS,
    trajectory_plot,
)
from navrl_daemon.rl.eval_config import eval_steps
from navrl_daemon.rl.evaluate import evaluate, evaluate_recorded
from navrl_daemon.rl.evaluations import make_eval_env
from navrl_daemon.rl.policy import make_policy
from navrl_daemon.rl.rollout import STAT_KEYS
from navrl_daemon.storage.policy_file import load_any_policy_state
from tests.conftest import REPO, TINY, navrl_cli

NAVRL_TOML = REPO / "config" / "navrl-original.toml"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# A smaller field than NavRL's 40 m, so the crossing ends within the eval: the outcomes
# reached, collided and timed out all occur with the published policy.
SMALL_FIELD = [
    "env.field_size=12",
    "env.num_obstacles=40",
    "env.num_dynamic_obstacles=16",
    "env.max_episode_length=700",
]


def plot_eval(checkpoint: Path, out: Path, *overrides: str) -> dict:
    done = navrl_cli(
        "eval",
        "--config",
        str(NAVRL_TOML),
        "--checkpoint",
        str(checkpoint),
        "--episodes",
        "12",
        "--plot",
        str(out),
        "--json",
        "run.device=cpu",
        *overrides,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def colour_pixels(image: np.ndarray, hex_colour: str, tolerance: int = 8) -> int:
    rgb = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(image[..., :3].astype(int) - rgb).max(-1) <= tolerance).sum())


def map_region(image: np.ndarray) -> np.ndarray:
    """The map axes' pixels (figure fractions → pixels, y from the top), spines cut off."""
    height, width = image.shape[:2]
    left, bottom, w, h = MAP_AXES
    x0, x1 = round(left * width) + 3, round((left + w) * width) - 3
    y0, y1 = round((1 - bottom - h) * height) + 3, round((1 - bottom) * height) - 3
    return image[y0:y1, x0:x1]


def check_plot(png: Path, result: dict) -> None:
    assert png.read_bytes().startswith(PNG_SIGNATURE)
    with Image.open(png) as im:
        im.verify()
    with Image.open(png) as im:
        image = np.asarray(im.convert("RGB"))
    assert image.shape[:2] == (FIGURE_SIZE_IN[1] * DPI, FIGURE_SIZE_IN[0] * DPI)
    counts = result["outcomes"]
    assert sum(counts.values()) == result["episodes"] == 12
    assert counts["collided"] == round(result["collision"] * 12)
    field = map_region(image)
    for outcome, colour in OUTCOME_COLOURS.items():
        if counts[outcome]:
            # A path of that colour on the map (a few hundred pixels even for a short one).
            assert colour_pixels(field, colour) > 50, (outcome, counts)
        else:
            # Nowhere, not even in the legend: the colour means that outcome and no other.
            assert colour_pixels(image, colour) == 0, (outcome, counts)
    # Not blank: pillars in several shades of grey cover part of the map.
    drawn = (field < 245).any(-1).mean()
    grey = field[(field[..., 0] == field[..., 1]) & (field[..., 1] == field[..., 2])]
    shades = {int(v) for v in grey[:, 0] if 40 < v < 235}
    assert drawn > 0.03, drawn
    assert len(shades) >= 3, shades


def test_eval_plot_of_the_navrl_checkpoint_at_navrl_scale(
    navrl_checkpoint: Path, tmp_path: Path
) -> None:
    """NavRL's own config (40 m field, 350 pillars, 80 moving obstacles), cut short."""
    out = tmp_path / "navrl.png"
    result = plot_eval(navrl_checkpoint, out, "eval.max_steps=150")
    assert result["plot"] == str(out)
    assert result["outcomes"]["timed out"] > 0  # 150 steps are 2.4 s: most still flying
    check_plot(out, result)


def test_eval_plot_shows_every_outcome_in_its_colour(
    navrl_checkpoint: Path, tmp_path: Path
) -> None:
    out = tmp_path / "small.png"
    # eval.seed 2: 3 reached, 4 collided, 5 timed out with NavRL's checkpoint (measured);
    # it never leaves the height band (that colour: the next test).
    result = plot_eval(navrl_checkpoint, out, *SMALL_FIELD, "eval.seed=2")
    outcomes = dict(result["outcomes"])
    assert outcomes.pop("out of bounds") == 0
    assert all(n > 0 for n in outcomes.values()), outcomes
    check_plot(out, result)


def test_eval_plot_shows_drones_that_leave_the_height_band(
    navrl_checkpoint: Path, tmp_path: Path
) -> None:
    """NavRL's checkpoint with its z action pushed to full climb: every drone leaves the
    band above 4 m, neither collided nor timed out, and is drawn in that outcome's colour."""
    state = load_any_policy_state(navrl_checkpoint)
    alpha, beta = (f"actor.module.0.module.{k}_layer.bias" for k in ("alpha", "beta"))
    state[alpha][2], state[beta][2] = 20.0, -20.0
    climbing = tmp_path / "climbing.pt"
    torch.save(state, climbing)
    out = tmp_path / "climbing.png"
    result = plot_eval(climbing, out, *SMALL_FIELD)
    assert result["outcomes"]["out of bounds"] == 12, result["outcomes"]
    assert result["out_of_bounds"] == 1.0
    check_plot(out, result)


def test_plot_needs_an_env_that_records_paths(
    navrl_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "2d.png"
    args = ["--checkpoint", str(navrl_checkpoint), "--plot", str(out), "--episodes", "2"]
    code = main(["eval", *args, "env.backend=navrl-2d", "eval.max_steps=4"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "--plot" in err and "env.backend = 'navrl-2d' cannot record" in err
    assert "('navigation' can)" in err  # which backend can, as the registry says
    assert not out.exists()


def test_recording_changes_no_result() -> None:
    """Same numbers with and without the paths recorded (fresh envs: the moving obstacles
    are never reset, so a second evaluation on one env would differ anyway)."""
    cfg = load_config(None, [*TINY, "eval.num_envs=8", "env.navigation.num_maps=2"])
    torch.manual_seed(0)
    policy = make_policy(cfg, "cpu")
    plain = evaluate(make_eval_env(cfg, "cpu"), policy, seed=3, max_steps=eval_steps(cfg))
    recorded, traj = evaluate_recorded(
        make_eval_env(cfg, "cpu"), policy, seed=3, max_steps=eval_steps(cfg)
    )
    assert recorded == plain
    n, steps = cfg.eval.num_envs, int(traj.steps.max())
    assert traj.positions.shape == (steps + 1, n, 3) and traj.goal.shape == (n, 3)
    # Each drone's path ends where its first episode ended: its length matches the stats.
    assert torch.equal(traj.steps.float(), traj.stats[:, STAT_KEYS.index("episode_len")])
    # Map 0's scene only: its moving obstacles and pillars.
    assert traj.num_maps == 2 and traj.map_id.tolist() == [0, 1] * (n // 2)
    assert traj.dynamic.shape == (steps + 1, cfg.env.num_dynamic_obstacles, 3)
    assert traj.pillars.shape[1] == 5 and len(traj.outcomes()) == n
    assert trajectory_plot(traj, "two maps").startswith(PNG_SIGNATURE)
