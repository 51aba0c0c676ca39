"""`make install` keeps a torch already in `.venv`; a venv without one gets the pinned one.

A GPU user installs their torch build into `.venv` first (README); the Makefile must not
swap it for constraints.txt's CPU pin. The torch here is a fake distribution built on the
fly (`torch 2.11.0+fake`, a wheel of a few hundred bytes) in a throwaway venv; the install
runs in a copy of the repository's install files, so the checkout's own `.venv` is never
touched. `make -n` shows the command the recipe would run (offline, fast); the slow checks
run the recipe itself with `pip install --dry-run --report` and read what pip would install
(they reach the package index: the recipe upgrades pip and resolves every dependency).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

FAKE_TORCH = "2.11.0+fake"
# A `make test` running these passes its own settings down; the make here starts clean.
MAKE_ENV = {
    k: v
    for k, v in os.environ.items()
    if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "TORCH_CONSTRAINT", "INSTALL_FLAGS")
}
INSTALL_FILES = ("Makefile", "constraints.txt", "pyproject.toml", "README.md")
PACKAGES = ("navrl_daemon", "examples")


def pinned_torch() -> str:
    """The version constraints.txt pins torch to (what a venv without torch gets)."""
    match = re.search(r"^torch==(\S+)$", (REPO / "constraints.txt").read_text(), re.M)
    assert match, "constraints.txt pins torch"
    return match.group(1)


def test_the_torch_floor_is_past_the_known_weights_only_bypasses() -> None:
    """torch below 2.10 has published `torch.load(weights_only=True)` bypasses, which the
    checkpoint and policy readers rely on; the GPU machines' 2.11 and the pin stay in.
    README states the same range."""
    import tomllib

    from packaging.requirements import Requirement

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    torch = next(Requirement(d) for d in deps if Requirement(d).name == "torch")
    assert not torch.specifier.contains("2.9.1") and not torch.specifier.contains("2.5.0")
    for admitted in ("2.10.0", "2.11.0", FAKE_TORCH, pinned_torch()):
        assert torch.specifier.contains(admitted), admitted
    spec = next(d for d in deps if d.startswith("torch")).removeprefix("torch")
    assert f"admits torch `{spec}`" in (REPO / "README.md").read_text()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The files `make install` reads, copied: a clone with no `.venv` yet."""
    root = tmp_path / "checkout"
    root.mkdir()
    for name in INSTALL_FILES:
        shutil.copy2(REPO / name, root / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in PACKAGES:
        shutil.copytree(REPO / name, root / name, ignore=ignore)
    return root


def fake_torch_wheel(directory: Path, version: str) -> Path:
    """A wheel named torch holding one module: what pip and importlib.metadata see of a
    torch build, without its gigabytes."""
    info = f"torch-{version}.dist-info"
    files = {
        "torch/__init__.py": f'__version__ = "{version}"\n',
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }

    def record(text: str) -> str:
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        return f"sha256={digest.decode()},{len(text.encode())}"

    files[f"{info}/RECORD"] = "".join(f"{p},{record(t)}\n" for p, t in files.items()) + (
        f"{info}/RECORD,,\n"
    )
    wheel = directory / f"torch-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel


def make_venv(root: Path, *, with_pip: bool, torch: str | None) -> Path:
    """`root/.venv`, as `python3 -m venv .venv` makes it, with the fake torch if asked."""
    venv = root / ".venv"
    flags = [] if with_pip else ["--without-pip"]
    subprocess.run([sys.executable, "-m", "venv", *flags, str(venv)], check=True, timeout=120)
    if torch is not None:
        wheel = fake_torch_wheel(root.parent, torch)
        pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
        subprocess.run(
            [*pip, "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
            check=True,
            timeout=120,
        )
    return venv


def torch_in(venv: Path) -> str | None:
    probe = "from importlib.metadata import version; print(version('torch'))"
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, timeout=60
    )
    return done.stdout.strip() if done.returncode == 0 else None


def planned_install(root: Path) -> str:
    """The pip line of the install recipe, as `make -n install` prints it."""
    done = subprocess.run(
        ["make", "-n", "install"],
        cwd=root,
        env=MAKE_ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if "-e '.[dev]'" in line]
    assert len(lines) == 1, done.stdout
    return lines[0]


def test_make_pins_torch_only_in_a_venv_without_one(checkout: Path) -> None:
    # CI's clean clone: no venv, so no torch: constraints.txt's pin
    assert "-c constraints.txt" in planned_install(checkout)
    # a venv made by hand, nothing in it yet: the pin too
    venv = make_venv(checkout, with_pip=False, torch=None)
    assert "-c constraints.txt" in planned_install(checkout)
    shutil.rmtree(venv)
    # the GPU user's venv with their torch: held at that version, the pin not applied
    make_venv(checkout, with_pip=False, torch=FAKE_TORCH)
    line = planned_install(checkout)
    assert f"'torch=={FAKE_TORCH}'" in line and "constraints.txt" not in line


def dry_run(root: Path, *make_vars: str) -> tuple[dict[str, str], str]:
    """`make install` with pip's --dry-run: {name: version} of what pip would install, and
    what make printed."""
    (root / ".venv" / ".installed").unlink(missing_ok=True)
    report = root / "report.json"
    done = subprocess.run(
        ["make", "install", f"INSTALL_FLAGS=--dry-run --report={report}", *make_vars],
        cwd=root,
        env=MAKE_ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc: dict[str, Any] = json.loads(report.read_text())
    planned = {item["metadata"]["name"]: item["metadata"]["version"] for item in doc["install"]}
    return planned, done.stdout


@pytest.mark.slow
def test_make_install_keeps_a_torch_already_in_the_venv(checkout: Path) -> None:
    venv = make_venv(checkout, with_pip=True, torch=FAKE_TORCH)
    planned, printed = dry_run(checkout)
    assert "navrl-daemon" in planned and "torchrl" in planned  # a real resolution
    assert "torch" not in planned
    assert torch_in(venv) == FAKE_TORCH
    assert f"installed with torch {FAKE_TORCH}; its CUDA and GPUs: " in printed
    # what the recipe did before: constraints.txt's pin replaces the user's torch
    swapped, _ = dry_run(checkout, "TORCH_CONSTRAINT=-c constraints.txt")
    assert swapped["torch"].split("+")[0] == pinned_torch()


@pytest.mark.slow
def test_make_install_in_a_clean_clone_gets_the_pinned_torch(checkout: Path) -> None:
    planned, _ = dry_run(checkout)  # make creates .venv, as on CI
    assert (checkout / ".venv" / "bin" / "python").exists()
    assert planned["torch"].split("+")[0] == pinned_torch()
