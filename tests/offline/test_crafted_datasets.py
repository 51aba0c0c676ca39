"""Crafted HDF5 datasets through `dataset info`, as a user runs it: each is refused with
exit 65 naming the file, the dataset and the reason, never a traceback, and nothing is
read from another file (an external link, a virtual dataset, external storage) or
allocated for rows the file cannot hold."""

from __future__ import annotations

import pytest

from navrl_daemon.testing.crafted_files import Crafted, dataset_files
from tests.conftest import navrl_cli


@pytest.fixture(scope="module")
def crafted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Crafted]:
    return dataset_files(tmp_path_factory.mktemp("crafted-datasets"))


def test_the_valid_file_they_are_made_from_loads(crafted: dict[str, Crafted]) -> None:
    valid = next(iter(crafted.values())).path.parent / "valid.h5"
    proc = navrl_cli("dataset", "info", str(valid))
    assert proc.returncode == 0 and "40 transitions loaded" in proc.stdout, proc.stderr[-2000:]


def test_dataset_info_refuses_every_crafted_file(crafted: dict[str, Crafted]) -> None:
    failed = []
    for name, case in crafted.items():
        proc = navrl_cli("dataset", "info", str(case.path))
        err = proc.stderr
        message = f"dataset {case.path}: "
        if (
            proc.returncode != 65
            or "Traceback" in err
            or message not in err
            or case.reason not in err
        ):
            failed.append(f"{name}: exit {proc.returncode}: {err[-500:]}")
    assert failed == []
