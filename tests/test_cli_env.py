"""`env check` / `env list` and `run` with other backends, as a user runs them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import structlog

from navrl_daemon.cli import main
from tests.conftest import REPO, TINY, navrl_cli
from tests.env.planted_faults import FAULTS


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Iterator[Callable[..., tuple[int, str, str]]]:
    """`main(argv)` in-process (the function `python -m navrl_daemon` calls), for the cheap
    cases: (exit code, stdout, stderr). structlog's global set-up is restored afterwards."""
    saved = structlog.get_config()

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out = capsys.readouterr()
        return code, out.out, out.err

    yield run
    structlog.configure(**saved)


def test_env_check_example_backend_in_a_fresh_process() -> None:
    # A process that has looked up no backend yet (navrl_daemon/testing/forked.py) finds "navrl-2d"
    # through the installed entry point, not through anything registered in this one.
    proc = navrl_cli(
        "env", "check", "--backend", "navrl-2d", "--json", "--steps", "10", *TINY, process=True
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and report["backend"] == "navrl-2d" and report["device"] == "cpu"
    assert {r["status"] for r in report["results"]} == {"pass"}
    assert report["throughput"]["num_envs"] == 8 and report["throughput"]["steps"] == 10
    assert report["throughput"]["steps_per_second"] > 0


def test_env_check_embedded_backend_text(cli) -> None:
    code, out, _ = cli("env", "check", "--steps", "5", *TINY)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "backend navigation on cpu"
    assert all(line.startswith("  pass  ") for line in lines[1:14])
    assert " steps/s x 8 envs = " in lines[14] and lines[15] == "ok"


@pytest.mark.parametrize(("fault", "check"), sorted(FAULTS.items()))
def test_env_check_names_a_planted_fault_and_exits_1(cli, fault: str, check: str) -> None:
    code, out, _ = cli("env", "check", "--backend", f"tests.env.planted_faults:{fault}", *TINY)
    assert code == 1
    lines = out.splitlines()
    assert [line.split()[1] for line in lines if line.startswith("  fail")] == [check]
    assert lines[-1] == f"FAILED: {check}"
    assert "steps/s" not in out  # no throughput for a failing backend


@pytest.mark.parametrize(("fault", "check"), sorted(FAULTS.items()))
def test_run_refuses_a_planted_fault_with_78(tmp_path: Path, fault: str, check: str) -> None:
    backend = f"tests.env.planted_faults:{fault}"
    proc = navrl_cli(
        "run", "--state-dir", str(tmp_path), *TINY, "run.total_frames=64", f"env.backend={backend}"
    )
    assert proc.returncode == 78, proc.stderr
    error = proc.stderr.splitlines()
    start = error.index(
        f"navrl-daemon: error: env.backend = {backend!r} fails the env contract "
        "(`navrl-daemon env check` for the full report):"
    )
    assert [line.split(":")[0].strip() for line in error[start + 1 :]] == [check]
    assert not (tmp_path / "export").exists()  # nothing trained


def test_run_trains_with_the_example_backend(tmp_path: Path) -> None:
    proc = navrl_cli(
        "run", "--state-dir", str(tmp_path), *TINY, "run.total_frames=256", "env.backend=navrl-2d"
    )
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    progress = [r for r in records if r["event"] == "progress"]
    assert [r["iteration"] for r in progress] == [1, 2, 3, 4]
    assert all(r["stage"] == "trainer" for r in progress)
    exported = [r for r in records if r["event"] == "policy exported"]
    assert exported and exported[0]["frames"] == 256
    assert 'backend = "navrl-2d"' in (tmp_path / "config.toml").read_text()
    # It checkpoints like the embedded backend, env state included, and resumes from it.
    written = [r["iteration"] for r in records if r["event"] == "checkpoint written"]
    assert written == [4]  # the final snapshot (checkpoint.interval is 100 by default)
    again = navrl_cli(
        "run", "--state-dir", str(tmp_path), *TINY, "run.total_frames=384", "env.backend=navrl-2d"
    )
    assert again.returncode == 0, again.stderr
    resumed = [json.loads(x) for x in again.stderr.splitlines() if '"resumed from' in x]
    assert resumed and resumed[0]["iteration"] == 4 and resumed[0]["env_restored"] is True


def test_run_with_isaac_but_no_isaac_sim_exits_78(tmp_path: Path) -> None:
    proc = navrl_cli("run", "--state-dir", str(tmp_path), *TINY, "env.backend=isaac")
    assert proc.returncode == 78
    assert "--extra-index-url https://pypi.nvidia.com" in proc.stderr
    assert "docs/backends.md 'Env backends and Isaac Sim'" in proc.stderr
    assert "## Env backends and Isaac Sim" in (REPO / "docs" / "backends.md").read_text()


def test_env_list_and_unknown_backend(cli) -> None:
    code, out, _ = cli("env", "list", "--json")
    assert code == 0
    listed = {b["name"]: b for b in json.loads(out)}
    assert list(listed) == ["navigation", "isaac", "navrl-2d"]
    assert listed["navrl-2d"]["origin"] == "entry point (navrl-daemon)"
    code, _, err = cli("env", "check", "--backend", "no-such-backend", *TINY)
    assert code == 78 and "registered: navigation, isaac, navrl-2d" in err
