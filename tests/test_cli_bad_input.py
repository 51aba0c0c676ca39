"""Input at fault gets a named error and its exit code, never a traceback; a run refused at
start-up leaves the state dir's `config.toml` (the last real run's) as it was.

In-process through `cli.main`, as a user's command line would go: a traceback would be an
exception here, and no case needs a fresh interpreter (each is refused in well under a
second once torch is imported)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from navrl_daemon import cli
from tests.conftest import TINY

SHORT = [*TINY, "run.total_frames=64", "eval.interval=0"]


@pytest.fixture
def refused(capsys: pytest.CaptureFixture[str]) -> Callable[..., str]:
    def check(code: int, *args: str, needles: tuple[str, ...] = ()) -> str:
        got = cli.main(list(args))
        err = capsys.readouterr().err
        assert got == code, err[-3000:]
        for needle in needles:
            assert needle in err, err[-3000:]
        return err

    return check


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory this process cannot write: mode 0555, or for root (whom modes do not
    stop) a read-only tmpfs mount; skipped where neither works."""
    path = tmp_path / "read-only"
    path.mkdir()
    path.chmod(0o555)
    mounted = False
    if os.access(path, os.W_OK):
        mount = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)],
            capture_output=True,
            text=True,
        )
        if mount.returncode != 0:
            pytest.skip(f"cannot make a read-only dir as root here: {mount.stderr.strip()}")
        mounted = True
    try:
        yield path
    finally:
        if mounted:
            subprocess.run(["umount", str(path)], check=False)
        with contextlib.suppress(OSError):
            path.chmod(0o755)


def test_a_config_file_that_is_not_utf8_exits_78(tmp_path: Path, refused) -> None:
    config = tmp_path / "bad.toml"
    config.write_bytes(b"[run]\nseed = 0  # caf\xe9 in latin-1\n")
    needles = (f"config file {config}: not UTF-8 text", "byte 0xe9")
    for command in (["run", "--state-dir", str(tmp_path / "s")], ["config", "show"]):
        refused(78, *command, "--config", str(config), needles=needles)


def test_a_state_dir_that_is_a_file_exits_78_naming_it(tmp_path: Path, refused) -> None:
    state = tmp_path / "state"
    state.write_text("a file where the state dir should be")
    refused(78, "run", "--state-dir", str(state), *SHORT, needles=(f"state dir {state}",))


def test_a_lock_path_that_is_a_directory_exits_78(tmp_path: Path, refused) -> None:
    (tmp_path / "lock").mkdir()
    needle = f"lock file {tmp_path / 'lock'}: is a directory"
    refused(78, "run", "--state-dir", str(tmp_path), *SHORT, needles=(needle,))


def test_a_read_only_state_dir_exits_78_naming_it(read_only_dir: Path, refused) -> None:
    refused(78, "run", "--state-dir", str(read_only_dir), *SHORT, needles=(str(read_only_dir),))
    sub = read_only_dir / "sub"
    needle = f"state dir {sub}: cannot create it"
    refused(78, "run", "--state-dir", str(sub), *SHORT, needles=(needle,))


def test_nan_in_env_options_exits_78(tmp_path: Path, refused) -> None:
    options = "env.options={gain=nan, limits=[1.0, inf]}"
    needle = "env.options: gain = nan: must be a finite number"
    for command in (["run", "--state-dir", str(tmp_path)], ["config", "show"]):
        refused(78, *command, *SHORT, options, needles=(needle,))
    assert not (tmp_path / "config.toml").exists()


def test_environment_variable_errors_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, refused
) -> None:
    cases = {
        "NAVRL_ENV__NUM_ENVS": ("abc", "env.num_envs: Input should be a valid integer"),
        "NAVRL_ENV__NUM_ENV": ("64", "env.num_env: unknown key"),
        "NAVRL_PPO__CLIP_RATIO": ("-1.0", "ppo.clip_ratio: Input should be greater than 0"),
    }
    for name, (value, needle) in cases.items():
        with monkeypatch.context() as env:
            env.setenv(name, value)
            refused(78, "config", "show", needles=(needle, f"environment variable {name}"))


def test_a_run_refused_at_start_up_leaves_config_toml_alone(tmp_path: Path, refused) -> None:
    recorded = "# the resolved config of the last run that started\n"
    (tmp_path / "config.toml").write_text(recorded)
    state = ["run", "--state-dir", str(tmp_path), *SHORT, "run.seed=7"]

    # 78 at start-up: a backend that cannot be loaded.
    refused(78, *state, "env.backend=no_such_sim", needles=("no_such_sim",))
    assert (tmp_path / "config.toml").read_text() == recorded

    # 65 at start-up: checkpoints there, none of them valid.
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "ckpt-000000003.nrc").write_bytes(b"NRC1 but not a checkpoint")
    refused(65, *state)
    assert (tmp_path / "config.toml").read_text() == recorded


def test_sizes_far_beyond_the_machine_exit_78_before_allocating(tmp_path: Path, refused) -> None:
    # About 3.5 TB of rollout buffers: more than any machine this runs on has free.
    huge = ["env.num_envs=1048576", "ppo.rollout_length=1000"]
    needles = (
        "the rollout buffers (pipeline.lease_pool = 2 x ppo.rollout_length = 1000 x "
        "env.num_envs = 1048576",
        "GB available",
        "lower env.num_envs or ppo.rollout_length",
    )
    refused(78, "run", "--state-dir", str(tmp_path), *SHORT, *huge, needles=needles)
    assert not (tmp_path / "config.toml").exists()
