"""benchmarks/device/gpu_session.sh's recipes load (CHECK=1), and its modes hand
learning.py what they say.

The GPU session runs once in a while on a lent machine with minutes of device time: a
recipe that does not load would cost that sitting. A recipe is a config file plus a few
overrides; with CHECK=1 every learning.py the script would launch only loads them and
prints what it would run, so the `learning` and `sweep` modes are checked here, on the
CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "benchmarks" / "device" / "gpu_session.sh"


def session(mode: str, out: Path, budget: int = 60, **env: str) -> subprocess.CompletedProcess[str]:
    """The script with CHECK=1 (configs only) unless `env` says CHECK="" (a real run)."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(
        ["bash", str(SCRIPT), mode, str(budget)],
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


def test_learning_runs_the_shipped_recipe_at_its_own_size(tmp_path: Path) -> None:
    done = session("learning", tmp_path, SMALL="")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "end learning rc=0" in (tmp_path / "session.log").read_text()
    checked_ = checked((tmp_path / "learning.out").read_text())
    assert checked_["num_envs"] == 1024  # config/navrl.toml's: NavRL's
    assert checked_["stages"] == [
        "long hops",
        "crossings",
        "slow dynamic crossings",
        "navrl crossings",
    ]
    # the config's own evaluation cadence, on which the promotions are decided
    assert checked_["eval_interval"] == 20
    assert (checked_["num_obstacles"], checked_["eval_num_obstacles"]) == (450, 350)


def test_a_recipe_is_a_config_file_plus_extra_overrides(tmp_path: Path) -> None:
    done = session(
        "learning",
        tmp_path,
        RECIPE="config/navrl-static.toml",
        # a lever on one stage is an override too
        EXTRA="run.seed=7 ppo.lr_schedule=constant env.curriculum.0.num_dynamic_obstacles=16",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    checked_ = checked((tmp_path / "learning.out").read_text())
    assert checked_["stages"] == ["long hops", "crossings"]
    assert (checked_["seed"], checked_["lr_schedule"]) == (7, "constant")
    assert [count for count, _ in checked_["stage_dynamic_obstacles"]] == [16, 0]


def test_a_missing_recipe_file_stops_the_session(tmp_path: Path) -> None:
    done = session("sweep", tmp_path, WORK=str(tmp_path / "w"), RECIPES="config/nope.toml")
    assert done.returncode == 2
    log = (tmp_path / "session.log").read_text()
    assert "no recipe file config/nope.toml" in log and "start recipe" not in log


def test_a_sweep_runs_each_file_and_seed_at_the_cpu_size(tmp_path: Path) -> None:
    work = tmp_path / "work"
    entries = "config/navrl.toml@1 config/navrl.toml@2 config/navrl-static.toml"
    done = session("sweep", tmp_path, WORK=str(work), RECIPES=entries, SMALL="")
    assert done.returncode == 0, done.stderr[-2000:]
    runs = {tag: checked((work / f"{tag}.out").read_text()) for tag in ("navrl_s1", "navrl_s2")}
    assert [run["seed"] for run in runs.values()] == [1, 2]
    static = checked((work / "navrl-static.out").read_text())
    for run in (*runs.values(), static):
        assert run["num_envs"] == 256 and run["held_out_maps"] == 16
    assert (tmp_path / "sweep.tgz").exists()


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
    done = session("sweep", tmp_path, WORK=str(tmp_path / "work"), **env)
    assert done.returncode == 2
    log = (tmp_path / "session.log").read_text()
    assert message in log and "start recipe" not in log


@pytest.mark.parametrize(
    ("env", "threads"),
    [
        ({"CPUS": "2"}, 1),  # two recipes on two cores: one thread each
        ({"CPUS": "16"}, 2),  # the GPU machine: at most two
        ({"CPUS": "2", "TORCH_THREADS": "3"}, 3),  # asked for
    ],
)
def test_sweep_processes_hold_no_more_threads_than_the_cores(
    env: dict[str, str], threads: int, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    recipes = "config/navrl.toml@0 config/navrl.toml@1"
    done = session("sweep", tmp_path, WORK=str(work), RECIPES=recipes, **env)
    assert done.returncode == 0, done.stderr[-2000:]
    for tag in ("navrl_s0", "navrl_s1"):
        assert checked((work / f"{tag}.out").read_text())["torch_threads"] == threads


def test_a_sweep_fork_hands_learning_py_the_source_and_iteration(tmp_path: Path) -> None:
    keep, work = tmp_path / "keep", tmp_path / "work"
    src = tmp_path / "src"  # CHECK=1 stops before the copy: SRC need not exist
    done = session("sweep", tmp_path, WORK=str(work), KEEP=str(keep), FORK=f"{src}@260")
    assert done.returncode == 0, done.stderr[-2000:]
    stages = checked((work / "navrl.out").read_text())
    assert stages["fork"] == {"from": str(src), "at": 260}
    assert not keep.exists()  # a check copies nothing


@pytest.mark.slow  # a real CPU run of the learning mode at the smoke size (~2 minutes)
def test_a_cpu_smoke_run_of_the_learning_mode_writes_its_json(tmp_path: Path) -> None:
    # 5 iterations of 128 frames, the budget a cap for a loaded machine's start-up
    done = session("learning", tmp_path, budget=300, CHECK="", FRAMES="640", LIMIT_SCALE="2")
    assert done.returncode == 0, done.stderr[-2000:]
    log = (tmp_path / "session.log").read_text()
    assert "end learning rc=0" in log, log[-3000:]
    result = json.loads((tmp_path / "learning.json").read_text())
    assert result["curve"] and result["final"] is not None
