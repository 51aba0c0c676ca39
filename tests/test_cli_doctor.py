"""`navrl-daemon doctor`: what this install is made of, as text and as JSON."""

from __future__ import annotations

import importlib.util
import json
import platform
import subprocess
import sys
from collections.abc import Callable, Iterator
from importlib.metadata import version
from types import SimpleNamespace

import pytest
import structlog
import torch

import navrl_daemon
from navrl_daemon.cli import main
from navrl_daemon.commands.doctor import LABEL, LIBRARIES
from navrl_daemon.ops.video import ffmpeg_executable
from tests.conftest import REPO, SUBPROCESS_ENV


@pytest.fixture
def doctor(capsys: pytest.CaptureFixture[str]) -> Iterator[Callable[..., str]]:
    """`main(["doctor", ...])`: its stdout; it always exits 0."""
    saved = structlog.get_config()

    def run(*argv: str) -> str:
        assert main(["doctor", *argv]) == 0
        return capsys.readouterr().out

    yield run
    structlog.configure(**saved)


def fields(text: str) -> dict[str, str]:
    """The text output's lines by their first column (continuation lines joined on)."""
    out: dict[str, str] = {}
    label = ""
    for line in text.splitlines():
        if line[:LABEL].strip() and not line.startswith("  "):
            label = line[:LABEL].strip()
            out[label] = line[LABEL:]
        elif line.startswith(" " * LABEL):
            out[label] += " " + line.strip()
        else:  # an extra: "  NAME    yes  ..."
            name, rest = line.split(maxsplit=1)
            out[f"extra {name}"] = rest
    return out


def test_the_text_names_python_torch_its_cuda_and_every_piece(
    doctor: Callable[..., str],
) -> None:
    got = fields(doctor())
    assert got["python"].split()[0] == platform.python_version()
    assert got["navrl-daemon"] == navrl_daemon.__version__
    assert got["torch"].split()[0] == str(torch.__version__)
    built = f"(CUDA {torch.version.cuda} build)" if torch.version.cuda else "(CPU build)"
    assert got["torch"].endswith(built)
    if not torch.cuda.is_available():
        assert got["GPU"].startswith("no CUDA")
        assert got["device"].startswith("cpu ")
    if not torch.version.cuda:  # how to get a CUDA build, as a command to paste
        assert "a CPU build of torch" in got["GPU"]
        text = doctor()
        assert "pip install --force-reinstall torch --index-url" in text and "/whl/cu" in text
    for name in LIBRARIES:
        assert f"{name} {version(name)}" in got["libraries"]
    # the export extra against the packages themselves, not their metadata
    import onnx
    import onnxruntime

    assert got["extra export"].startswith("yes ")
    assert f"onnx {onnx.__version__}" in got["extra export"]
    assert f"onnxruntime {onnxruntime.__version__}" in got["extra export"]
    assert got["extra video"].startswith("yes" if ffmpeg_executable() else "no")
    # Isaac Sim is not on this machine: the extra says so and how to get it
    assert importlib.util.find_spec("isaacsim") is None
    assert got["extra isaac"].startswith("no ") and "isaacsim -" in got["extra isaac"]
    assert "docs/backends.md" in got["extra isaac"]


def test_json_holds_the_same(doctor: Callable[..., str]) -> None:
    doc = json.loads(doctor("--json"))
    assert doc["python"]["version"] == platform.python_version()
    assert doc["navrl_daemon"] == navrl_daemon.__version__
    install = doc["torch"].pop("cuda_install", None)
    assert doc["torch"] == {
        "version": str(torch.__version__),
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
    assert (install is None) == bool(torch.version.cuda)
    assert len(doc["gpus"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert doc["device"]["run.device"] == "auto"
    assert doc["device"]["resolved"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert doc["libraries"] == {name: version(name) for name in LIBRARIES}
    assert set(doc["extras"]) == {"export", "video", "wandb", "mirror", "isaac"}
    assert doc["extras"]["mirror"]["packages"]["fsspec"] == version("fsspec")
    assert doc["extras"]["video"]["ffmpeg"] == ffmpeg_executable()
    assert doc["extras"]["isaac"]["ready"] is False
    assert doc["extras"]["isaac"]["packages"]["isaacsim"] is None
    # --config: the device that config's run would train on
    doc = json.loads(doctor("--json", "--config", str(REPO / "config" / "default.toml")))
    assert doc["device"] == {"run.device": "cpu", "resolved": "cpu"}
    # and the execution plan its run would log at start there
    plan = doc["plan"]
    assert (plan["device"], plan["update_path"], plan["collect_path"]) == ("cpu", "eager", "eager")
    assert plan["why"]["reset"] == "auto: indexed, the faster one op by op"


def test_the_gpus_torch_sees(doctor: Callable[..., str], monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU here: torch's CUDA queries stand in for one (an H100 on a CUDA 13.0 build)."""
    h100 = SimpleNamespace(
        name="NVIDIA H100 80GB HBM3", total_memory=85_024_112_640, major=9, minor=0
    )
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: h100)
    got = fields(doctor())
    assert got["torch"].endswith("(CUDA 13.0 build)")
    assert got["GPU"] == "cuda:0  NVIDIA H100 80GB HBM3, 79.2 GiB, compute capability 9.0"
    assert got["device"].startswith("cuda ")
    # the plan a run would make there, resolved without a GPU
    assert got["plan"].startswith("update_path = cuda_graph  (auto: the fused step captured")
    doc = json.loads(doctor("--json"))
    assert doc["gpus"] == [
        {
            "index": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "memory_bytes": 85_024_112_640,
            "capability": "9.0",
        }
    ]
    # a CUDA build that sees no GPU (no driver, CUDA_VISIBLE_DEVICES="") says so
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    got = fields(doctor())
    assert got["GPU"].startswith("no CUDA: none visible")
    assert got["device"].startswith("cpu ")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"navrl-daemon {navrl_daemon.__version__}\n"


def test_a_torch_that_does_not_import_is_reported() -> None:
    """What doctor is run for: a torch build that fails to load (its CUDA libraries missing)
    is named with the error, and the rest is still reported. In a fresh process, so that
    nothing imported torch before: `sys.modules["torch"] = None` makes its import fail."""
    script = (
        "import sys; sys.modules['torch'] = None\n"
        "from navrl_daemon.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )

    def doctor(*argv: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", script, "doctor", *argv],
            capture_output=True,
            text=True,
            timeout=120,
            env=SUBPROCESS_ENV,
            cwd=REPO,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    got = fields(doctor())
    assert got["torch"].startswith(f"{version('torch')}  (does not import: ModuleNotFoundError")
    assert got["GPU"] == "unknown: torch does not import"
    assert got["device"].startswith("unknown ")
    assert f"numpy {version('numpy')}" in got["libraries"]
    doc = json.loads(doctor("--json"))
    assert doc["torch"]["error"].startswith("ModuleNotFoundError") and doc["gpus"] == []
    assert doc["extras"]["video"]["ready"] is False
