"""`navrl-daemon dataset synth|info` as a user runs it: seeded files of both layouts and
image formats, a size given in GiB, and a bad file exits 65 naming file, key, expected
and found."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np

from tests.conftest import navrl_cli


def test_synth_then_info_both_layouts(tmp_path: Path) -> None:
    a, b, a2 = tmp_path / "a.h5", tmp_path / "b.h5", tmp_path / "a2.h5"
    for path, extra in (
        (a, ["--layout", "A", "--image-size", "16", "24"]),
        (b, ["--layout", "B", "--image-format", "CHW", "--wrist-aliases", "--image-size", "8"]),
        (a2, ["--layout", "A", "--image-size", "16", "24"]),
    ):
        done = navrl_cli(
            "dataset", "synth", str(path), "--samples", "30", "--seed", "4", "--json", *extra
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["samples"] == 30
    with h5py.File(a, "r") as fa, h5py.File(a2, "r") as fb:  # seeded: same bytes of data
        for key in ("actions", "observations/left_image", "observations/joint"):
            np.testing.assert_array_equal(fa[key][:], fb[key][:])
    done = navrl_cli("dataset", "info", str(a), str(b), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["transitions"] == 60
    fa_doc, fb_doc = doc["files"]
    assert fa_doc["layout"] == "A" and fa_doc["cameras"]["left_image"]["format"] == "HWC"
    assert fa_doc["cameras"]["left_image"]["size"] == [16, 24]
    assert fb_doc["layout"] == "B" and fb_doc["cameras"]["right_image"] == {
        "key": "/right_wrist_image", "format": "CHW", "size": [8, 8],
    }  # fmt: skip
    done = navrl_cli("dataset", "info", str(a), str(b), "--json", "--max-samples", "35")
    assert json.loads(done.stdout)["transitions"] == 35


def test_synth_by_size_and_bad_file_exits_65(tmp_path: Path) -> None:
    path = tmp_path / "sized.h5"
    done = navrl_cli(
        "dataset", "synth", str(path), "--gib", "0.002", "--image-size", "32", "--json"
    )
    assert done.returncode == 0, done.stderr
    size = json.loads(done.stdout)["bytes"]
    assert 0.9 * 0.002 * 2**30 < size < 1.2 * 0.002 * 2**30
    with h5py.File(path, "r+") as f:
        n = f["actions"].shape[0]
        del f["terminals"]
        f.create_dataset("terminals", data=np.zeros((n - 3, 1), bool))
    done = navrl_cli("dataset", "info", str(path))
    assert done.returncode == 65
    assert f"{path}: key /terminals: expected shape ({n}, 1)" in done.stderr
    assert f"found ({n - 3}, 1)" in done.stderr
    done = navrl_cli("dataset", "info", str(tmp_path / "missing.h5"))
    assert done.returncode == 65 and "missing.h5: not found" in done.stderr
