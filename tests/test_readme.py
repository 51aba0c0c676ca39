"""The README as a newcomer reads it: every command, every exit code, figures from the docs."""

from __future__ import annotations

import argparse
import re

from navrl_daemon import errors
from navrl_daemon.cli import build_parser
from navrl_daemon.commands import status
from navrl_daemon.runtime.startup import EXIT_STARTUP_TIMEOUT
from tests.conftest import REPO

README = (REPO / "README.md").read_text()


def section(title: str) -> str:
    """The text under `## title`, up to the next `## ` heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.M | re.S)
    assert match, f"README has a section '## {title}'"
    return match.group(1)


def test_every_exit_code_has_a_row() -> None:
    kinds = [v for v in vars(errors).values() if isinstance(v, type)]
    codes = {kind.exit_code for kind in kinds if issubclass(kind, errors.NavrlError)}
    codes |= {0, EXIT_STARTUP_TIMEOUT, status.EXIT_UNHEALTHY, status.EXIT_NOT_RUNNING}
    rows = {int(n) for n in re.findall(r"^\| (\d+) \|", section("Exit codes"), re.M)}
    assert rows == codes


def test_every_command_is_listed() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    listed = set(re.findall(r"^navrl-daemon (\S+)", section("Commands"), re.M))
    assert listed == set(sub.choices)


def test_set_up_names_the_make_targets_and_two_gpu_commands() -> None:
    setup = section("Set-up")
    for target in ("make run", "make test", "make install"):
        assert target in setup
    gpu = setup.split("**On a GPU**")[1].split("```sh\n")[1].split("```")[0]
    assert len(gpu.strip().splitlines()) == 2 and "pip install torch" in gpu
    assert "navrl-daemon doctor" in setup


def test_the_figures_of_where_it_stands_are_in_the_docs() -> None:
    """Every figure (a decimal, a thousands figure, a `k` rate) is one the docs measured."""
    docs = "".join(
        (REPO / "docs" / name).read_text()
        for name in ("results.md", "training-navrl.md", "throughput.md")
    )
    figures = re.findall(r"\d+(?:[.,]\d+)+k?|\d+k\b", section("Where it stands"))
    assert len(figures) >= 10
    assert [f for f in figures if f not in docs] == []
