"""benchmarks/device/gpu_session.sh's recipes: each one's config loads (CHECK=1).

The GPU session runs once in a while on a lent machine with minutes of device time: a
recipe whose TOML is wrong would cost that sitting. With CHECK=1 every learning.py the
script would launch only loads the recipe's configs and prints its curriculum stages, so
every recipe of the `learning` and `sweep` modes is checked here, on the CPU."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "benchmarks" / "device" / "gpu_session.sh"


def session(mode: str, out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(
        ["bash", str(SCRIPT), mode, "60"],
        cwd=REPO,
        env={**os.environ, "PATH": path, "DEV": "cpu", "CHECK": "1", "OUT": str(out), **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def checked(text: str) -> dict:
    """learning.py --check-config's JSON line."""
    lines = [line for line in text.splitlines() if line.startswith('{"config"')]
    assert len(lines) == 1, text[-2000:]
    return json.loads(lines[0])


def case_labels(start: str, end: str) -> list[str]:
    """The names a `case` of the script knows, between the lines `start` and `end`."""
    text = SCRIPT.read_text()
    body = text[text.index(start) :]
    body = body[: body.index(end)].replace("\\\n", " ")
    names: list[str] = []
    for label in re.findall(r"^\s+([a-z0-9_]+(?:\s*\|\s*[a-z0-9_]+)*)\)", body, re.M):
        names += [name.strip() for name in label.split("|")]
    return names


LEARNING_RECIPES = case_labels("case ${RECIPE:=", 'log "unknown RECIPE')
SWEEP_RECIPES = case_labels("    case $name in", 'log "unknown recipe')


def test_the_case_lists_are_read_off_the_script() -> None:
    assert len(LEARNING_RECIPES) >= 9 and "dense" in LEARNING_RECIPES
    assert len(SWEEP_RECIPES) >= 28
    assert "long_hops_hold_mb4_bar5_then_cross_mirror_stay_guard_r128_hold_dense" in SWEEP_RECIPES


@pytest.mark.parametrize("recipe", [*LEARNING_RECIPES, None])
def test_every_learning_recipe_loads(recipe: str | None, tmp_path: Path) -> None:
    env = {} if recipe is None else {"RECIPE": recipe}
    done = session("learning", tmp_path, **env)
    assert done.returncode == 0, done.stderr[-2000:]
    log = (tmp_path / "session.log").read_text()
    assert "end learning rc=0" in log, log[-3000:]
    stages = checked((tmp_path / "learning_gpu.log").read_text())
    assert stages["num_envs"] == 1024  # config/navrl.toml's, NavRL's
    if recipe in (None, "dense", "dense_const"):  # the CPU's best, moving obstacles after
        assert stages["stages"] == [
            "long hops",
            "crossings",
            "slow dynamic crossings",
            "navrl crossings",
        ]
        assert stages["target_stages"] == [3]
        assert (stages["num_obstacles"], stages["eval_num_obstacles"]) == (450, 350)
        assert stages["lr_schedule"] == ("linear" if recipe == "dense" else "constant")
        # the moving obstacles' stages floored at 250 pillars, none before them
        assert (stages["min_level"], stages["stage_min_levels"]) == (0, [None, None, 4, 4])


def test_an_unknown_learning_recipe_stops_the_session(tmp_path: Path) -> None:
    done = session("learning", tmp_path, RECIPE="no_such_recipe")
    assert done.returncode == 2
    assert "unknown RECIPE no_such_recipe" in (tmp_path / "session.log").read_text()


@pytest.mark.slow  # 29 learning.py processes (~6 s of CPU each): in make test-slow
def test_every_sweep_recipe_loads(tmp_path: Path) -> None:
    names = SWEEP_RECIPES
    work = tmp_path / "work"
    entries = [*names, f"{names[-1]}@3"]  # NAME@SEED too
    done = session("sweep", tmp_path, WORK=str(work), RECIPES=" ".join(entries))
    assert done.returncode == 0, done.stderr[-2000:]
    for entry in entries:
        tag = entry.replace("@", "_s")
        stages = checked((work / f"{tag}.out").read_text())
        assert stages["num_envs"] == 256 and stages["held_out_maps"] == 16
    assert (tmp_path / "sweep.tgz").exists()
    dense = checked(
        (
            work / "long_hops_hold_mb4_bar5_then_cross_mirror_stay_guard_r128_hold_dense.out"
        ).read_text()
    )
    assert (dense["num_obstacles"], dense["eval_num_obstacles"]) == (450, 350)
    assert (dense["num_maps"], dense["eval_num_maps"]) == (16, 16)


def test_the_maps256_recipe_trains_on_256_maps_and_evaluates_on_dense_s_16(
    tmp_path: Path,
) -> None:
    name = "long_hops_hold_mb4_bar5_then_cross_mirror_stay_guard_r128_hold_dense_maps256"
    work = tmp_path / "work"
    done = session("sweep", tmp_path, WORK=str(work), RECIPES=name)
    assert done.returncode == 0, done.stderr[-2000:]
    stages = checked((work / f"{name}.out").read_text())
    assert (stages["num_maps"], stages["eval_num_maps"]) == (256, 16)
    assert (stages["num_obstacles"], stages["eval_num_obstacles"]) == (450, 350)
    assert stages["held_out_maps"] == 16


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FORK": "/runs/a@260"}, "FORK=SRC@ITER needs KEEP and no RESUME"),
        ({"FORK": "/runs/a@260", "KEEP": "/k", "RESUME": "1"}, "needs KEEP and no RESUME"),
        ({"FORK": "/runs/a", "KEEP": "/k"}, "FORK=/runs/a: expected SRC@ITER"),
    ],
)
def test_a_sweep_fork_without_its_parts_stops_before_any_recipe(
    env: dict[str, str], message: str, tmp_path: Path
) -> None:
    done = session("sweep", tmp_path, WORK=str(tmp_path / "work"), RECIPES="levels", **env)
    assert done.returncode == 2
    log = (tmp_path / "session.log").read_text()
    assert message in log and "start recipe" not in log


@pytest.mark.parametrize(
    ("env", "threads"),
    [
        ({"CPUS": "2"}, 1),  # two recipes on two cores: one thread each
        ({"CPUS": "16"}, 2),  # the GPU machine: session 9's two
        ({"CPUS": "2", "TORCH_THREADS": "3"}, 3),  # asked for
    ],
)
def test_sweep_processes_hold_no_more_threads_than_the_cores(
    env: dict[str, str], threads: int, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    done = session("sweep", tmp_path, WORK=str(work), RECIPES="levels hops", **env)
    assert done.returncode == 0, done.stderr[-2000:]
    for tag in ("levels", "hops"):
        assert checked((work / f"{tag}.out").read_text())["torch_threads"] == threads


def test_a_sweep_fork_hands_learning_py_the_source_and_iteration(tmp_path: Path) -> None:
    keep, work = tmp_path / "keep", tmp_path / "work"
    src = tmp_path / "src"  # CHECK=1 stops before the copy: SRC need not exist
    done = session(
        "sweep", tmp_path, WORK=str(work), KEEP=str(keep), FORK=f"{src}@260", RECIPES="levels"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    stages = checked((work / "levels.out").read_text())
    assert stages["fork"] == {"from": str(src), "at": 260}
    assert not keep.exists()  # a check copies nothing
