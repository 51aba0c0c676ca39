"""Multimodal datasets: layouts A and B, wrist aliases, HWC and CHW load and match a
direct h5py read; images resize like torch's float reference; every kind of bad file is a
DataError naming the file, the key, what was expected and what was found."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from navrl_daemon.errors import DataError
from navrl_daemon.offline.dataset_synth import SynthSpec, synth_policy, write_synth
from navrl_daemon.offline.datasets import (
    CAMERAS,
    ImageReader,
    MultimodalDataset,
    as_bchw,
    contiguous_runs,
    expand_paths,
    inspect_dataset,
    resize_images,
)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("datasets")
    specs = {
        "a_hwc": SynthSpec(samples=40, layout="A", image_format="HWC", height=20, width=24),
        "a_chw": SynthSpec(samples=40, layout="A", image_format="CHW", height=20, width=24),
        "b_alias": SynthSpec(
            samples=30, layout="B", image_format="CHW", height=16, width=16,
            wrist_aliases=True, chunk_rows=4, compression="lzf", seed=1,
        ),
    }  # fmt: skip
    out = {}
    for name, spec in specs.items():
        out[name] = root / f"{name}.h5"
        write_synth(out[name], spec, block_rows=7)  # several blocks: the seams are tested too
    return out


def direct_images(path: Path, index: int, size: int) -> torch.Tensor:
    """The reference: one h5py read per camera of one row, resized the same way."""
    df = inspect_dataset(path)
    with h5py.File(path, "r") as f:
        return torch.stack(
            [resize_images(as_bchw(f[c.path][index : index + 1], c.format), size)[0]
             for c in df.cameras]
        )  # fmt: skip


def test_layouts_aliases_and_image_formats_are_detected(files: dict[str, Path]) -> None:
    a, chw, b = (inspect_dataset(files[k]) for k in ("a_hwc", "a_chw", "b_alias"))
    assert (a.layout, a.cameras[0].format, a.cameras[0].path) == (
        "A", "HWC", "/observations/left_image",
    )  # fmt: skip
    assert chw.cameras[2].format == "CHW" and (chw.cameras[2].height, chw.cameras[2].width) == (
        20, 24,
    )  # fmt: skip
    assert b.layout == "B"
    assert [c.path for c in b.cameras] == [
        "/left_wrist_image",
        "/right_wrist_image",
        "/global_image",
    ]
    assert [c.name for c in b.cameras] == list(CAMERAS)
    assert (a.transitions, a.joint_dim, a.action_dim) == (40, 16, 4)


def test_lowdim_in_ram_matches_h5py_with_obs_n_plus_1(files: dict[str, Path]) -> None:
    paths = [files["a_hwc"], files["b_alias"]]
    data = MultimodalDataset.load(paths)
    assert len(data) == 70 and data.offsets.tolist() == [0, 40, 70]
    with h5py.File(paths[0], "r") as fa, h5py.File(paths[1], "r") as fb:
        joint = np.concatenate([fa["observations/joint"][:40], fb["joint"][:30]])
        next_joint = np.concatenate([fa["observations/joint"][1:], fb["joint"][1:]])
        actions = np.concatenate([fa["actions"][:], fb["actions"][:]])
        terminals = np.concatenate([fa["terminals"][:], fb["terminals"][:]])
    np.testing.assert_array_equal(data.joint, joint)
    np.testing.assert_array_equal(data.next_joint, next_joint)
    np.testing.assert_array_equal(data.actions, actions)
    np.testing.assert_array_equal(data.terminals, terminals)
    np.testing.assert_allclose(data.action_mean, actions.mean(0), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(data.action_std, actions.std(0), rtol=1e-5)
    got = data.lowdim(np.array([3, 45]))
    np.testing.assert_array_equal(got["action"].numpy(), actions[[3, 45]])


def test_max_samples_cuts_across_files(files: dict[str, Path]) -> None:
    data = MultimodalDataset.load([files["a_hwc"], files["b_alias"]], max_samples=52)
    assert len(data) == 52 and data.offsets.tolist() == [0, 40, 52]
    one = MultimodalDataset.load([files["a_hwc"], files["b_alias"]], max_samples=10)
    assert len(one) == 10 and len(one.files) == 1
    np.testing.assert_array_equal(one.actions, data.actions[:10])


def test_synth_actions_are_the_known_policy_of_the_observations(files: dict[str, Path]) -> None:
    with h5py.File(files["a_hwc"], "r") as f:
        means = np.concatenate(
            [f[f"observations/{c}"][:40].mean(axis=(1, 2)) / 255.0 for c in CAMERAS], axis=1
        )
        expected = synth_policy(f["observations/joint"][:40], means.astype(np.float32))
        np.testing.assert_allclose(f["actions"][:], expected, atol=1e-5)
    assert expected.std(axis=0).min() > 0.3  # not saturated: there is something to learn


def test_image_reader_matches_direct_reads_for_both_layouts(files: dict[str, Path]) -> None:
    data = MultimodalDataset.load([files["a_hwc"], files["b_alias"]])
    reader = ImageReader(data.files, data.offsets, size=12, cache_bytes=1 << 20)
    # Runs, a duplicate, both files, the first and last rows of each.
    indices = np.array([0, 1, 2, 7, 7, 20, 39, 40, 41, 55, 69])
    out = torch.zeros((len(indices), 3, 3, 12, 12), dtype=torch.uint8)
    reader.read_into(indices, out)
    reader.close()
    for row, i in enumerate(indices):
        path, local = (files["a_hwc"], i) if i < 40 else (files["b_alias"], i - 40)
        assert torch.equal(out[row], direct_images(path, int(local), 12)), f"index {i}"


def test_hwc_and_chw_files_of_one_seed_give_the_same_batches(files: dict[str, Path]) -> None:
    outs = []
    for key in ("a_hwc", "a_chw"):
        data = MultimodalDataset.load([files[key]])
        reader = ImageReader(data.files, data.offsets, size=10, cache_bytes=1 << 20)
        out = torch.zeros((5, 3, 3, 10, 10), dtype=torch.uint8)
        reader.read_into(np.array([0, 3, 4, 5, 39]), out)
        reader.close()
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    assert outs[0].float().std() > 10  # real pictures, not zeros


def test_resize_is_torch_float_antialias_within_one_level() -> None:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (4, 3, 37, 53), dtype=torch.uint8, generator=g)
    ref = F.interpolate(images.float(), size=(16, 16), mode="bilinear", antialias=True)
    got = resize_images(images.contiguous(memory_format=torch.channels_last), 16)
    assert got.shape == (4, 3, 16, 16) and got.dtype == torch.uint8
    assert (got.float() - ref.round().clamp(0, 255)).abs().max() <= 1
    flat = torch.full((1, 3, 40, 40), 77, dtype=torch.uint8)
    assert torch.equal(resize_images(flat, 8), torch.full((1, 3, 8, 8), 77, dtype=torch.uint8))
    assert torch.equal(resize_images(images[:, :, :16, :16], 16), images[:, :, :16, :16])


def test_contiguous_runs_cover_sorted_indices() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        idx = np.sort(rng.integers(0, 30, size=rng.integers(1, 20)))
        runs = contiguous_runs(idx)
        rebuilt = np.concatenate([np.arange(a, b) for _, a, b in runs])
        np.testing.assert_array_equal(rebuilt, idx)
        assert [p for p, _, _ in runs] == [0, *np.cumsum([b - a for _, a, b in runs])[:-1]]


# ---------------------------------------------------------------------------- bad input


def broken_copy(src: Path, dst: Path, edit: object) -> Path:
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        edit(f)  # type: ignore[operator]
    return dst


def _nan_actions(f: h5py.File) -> None:
    a = f["actions"][:]
    a[5, 2] = np.nan
    f["actions"][...] = a


def _replace(key: str, value: np.ndarray):  # type: ignore[no-untyped-def]
    def edit(f: h5py.File) -> None:
        del f[key]
        f.create_dataset(key, data=value)

    return edit


@pytest.mark.parametrize(
    ("name", "edit", "expected"),
    [
        ("missing", lambda f: f.__delitem__("actions"), ["key /actions", "found missing"]),
        (
            "missing_image",
            lambda f: f.__delitem__("observations/global_image"),
            ["key /observations/global_image", "found missing"],
        ),
        (
            "short_joint",
            _replace("observations/joint", np.zeros((40, 16), np.float32)),
            ["key /observations/joint", "expected 41 rows", "found 40"],
        ),
        (
            "short_rewards",
            _replace("rewards", np.zeros((39, 1), np.float32)),
            ["key /rewards", "expected shape (40, 1)", "found (39, 1)"],
        ),
        (
            "image_rank",
            _replace("observations/left_image", np.zeros((41, 8, 8), np.uint8)),
            ["key /observations/left_image", "expected 4 dimensions", "found shape (41, 8, 8)"],
        ),
        (
            "image_channels",
            _replace("observations/left_image", np.zeros((41, 8, 8, 4), np.uint8)),
            ["key /observations/left_image", "(N+1, H, W, 3)", "found (41, 8, 8, 4)"],
        ),
        (
            "image_dtype",
            _replace("observations/right_image", np.zeros((41, 8, 8, 3), np.float32)),
            ["key /observations/right_image", "expected dtype uint8", "found float32"],
        ),
        ("nan_action", _nan_actions, ["key /actions", "expected finite", "first at row 5"]),
    ],
)
def test_bad_datasets_raise_data_error_naming_file_key_expected_found(
    files: dict[str, Path], tmp_path: Path, name: str, edit: object, expected: list[str]
) -> None:
    path = broken_copy(files["a_hwc"], tmp_path / f"{name}.h5", edit)
    with pytest.raises(DataError) as err:
        MultimodalDataset.load([path])
    for part in [str(path), *expected]:
        assert part in str(err.value), str(err.value)


def test_truncated_foreign_and_missing_files(files: dict[str, Path], tmp_path: Path) -> None:
    truncated = tmp_path / "truncated.h5"
    data = files["a_hwc"].read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=rf"{truncated}.*cannot open \({len(data) // 2} bytes"):
        MultimodalDataset.load([truncated])
    foreign = tmp_path / "foreign.h5"
    foreign.write_bytes(b"not hdf5" * 100)
    with pytest.raises(DataError, match="not an HDF5 file"):
        inspect_dataset(foreign)
    with pytest.raises(DataError, match="not found"):
        inspect_dataset(tmp_path / "nope.h5")
    with pytest.raises(DataError, match="matches no file"):
        expand_paths([str(tmp_path / "*.hdf5")])
    with pytest.raises(DataError, match=r"layout: expected B .*found A"):
        inspect_dataset(files["a_hwc"], "B")
    empty = tmp_path / "empty.h5"
    with h5py.File(empty, "w") as f:
        f.create_dataset("x", data=[1])
    with pytest.raises(DataError, match=r"expected layout A .* or B .*found root keys \['x'\]"):
        inspect_dataset(empty)
