"""`navrl-daemon doctor`: what this install is made of, to tell what `run` will train on.

Python, navrl-daemon, torch and the CUDA it was built for, the GPUs it sees, the device the
config resolves to, the libraries the daemon runs on and which optional extras are
installed (pyproject.toml's `[project.optional-dependencies]`), and the execution plan a
run of the config would log at start on that device, one process (config/execution_plan.py:
update, collect and reset paths, compile, streams, and why). Versions come from the
installed distributions' metadata; torch is imported for its CUDA and GPUs, and reported
with its error when that import fails. Always exits 0.
"""

from __future__ import annotations

import argparse
import platform
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from navrl_daemon import __version__
from navrl_daemon.commands.common import config_args, json_arg, print_json
from navrl_daemon.config import Config, ConfigError, ExecutionPlan, resolve_device

# The libraries every run uses (pyproject.toml's dependencies), by distribution name.
LIBRARIES = (
    "torchrl",
    "tensordict",
    "numpy",
    "tensorboard",
    "h5py",
    "lz4",
    "prometheus-client",
    "matplotlib",
    "pillow",
)
LABEL = 14  # the width of the text output's first column


@dataclass(frozen=True)
class Extra:
    """An optional extra: what it enables and the distributions it brings."""

    name: str
    enables: str
    packages: tuple[str, ...]
    install: str


EXTRAS = (
    Extra(
        "export",
        "checkpoints export --format onnx",
        ("onnx", "onnxscript", "onnxruntime"),
        "pip install -e '.[export]'",
    ),
    Extra(
        "video",
        "eval --video F.mp4",
        ("imageio-ffmpeg",),
        "pip install -e '.[video]', or an ffmpeg on PATH",
    ),
    Extra("wandb", "log.wandb = true", ("wandb",), "pip install -e '.[wandb]'"),
    Extra("mirror", "checkpoint.mirror at a URL", ("fsspec",), "pip install -e '.[mirror]'"),
)


def backend_extras() -> tuple[Extra, ...]:
    """The built-in backends that need packages the base install lacks, each an extra of
    its name (env/backends.py says which). Only where torch imports: the registry does,
    and so does every backend."""
    from navrl_daemon.env.backends import BUILTIN

    return tuple(
        Extra(b.name, f'env.backend = "{b.name}"', b.packages, b.install)
        for b in BUILTIN
        if b.packages
    )


def register(sub: Any) -> None:
    p = sub.add_parser("doctor", help="torch, CUDA, GPUs and optional extras of this install")
    json_arg(config_args(p, overrides=False))
    p.set_defaults(handler=handle)


def handle(cfg: Config, args: argparse.Namespace) -> int:
    doc = diagnose(cfg)
    if args.json:
        print_json(doc)
    else:
        print_text(doc)
    return 0


# A CUDA build of torch in place of a CPU one: the README's GPU set-up, in this venv.
CUDA_TORCH = "{python} -m pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu130"


def diagnose(cfg: Config) -> dict[str, Any]:
    torch = torch_status()
    working = "error" not in torch
    if working and not torch["cuda"]:
        torch["cuda_install"] = CUDA_TORCH.format(python=sys.executable)
    device = resolve_device(cfg) if working else None
    extras = EXTRAS + (backend_extras() if working else ())
    return {
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "navrl_daemon": __version__,
        "torch": torch,
        "gpus": gpus() if working else [],
        "device": {
            "run.device": cfg.run.device,
            "resolved": device,
        },
        "plan": execution_plan(cfg, device),
        "libraries": {name: installed(name) for name in LIBRARIES},
        "extras": {extra.name: extra_status(extra, working) for extra in extras},
    }


def execution_plan(cfg: Config, device: str | None) -> dict[str, Any] | None:
    """The plan's fields on `device` (None where torch does not import), or the
    ConfigError a run would exit 78 with."""
    if device is None:
        return None
    try:
        from navrl_daemon.env.backends import resolve

        captured = resolve(cfg.env.backend).captured
        return ExecutionPlan.of(cfg, device, captured=captured).fields()
    except ConfigError as err:
        return {"error": str(err)}


def torch_status() -> dict[str, Any]:
    """torch's version and CUDA, or why it does not import (a build whose CUDA libraries
    are missing is one reason to run doctor)."""
    try:
        import torch
    except Exception as err:
        return {
            "version": installed("torch"),
            "cuda": None,
            "cuda_available": False,
            "error": f"{type(err).__name__}: {err}",
        }
    return {
        "version": str(torch.__version__),
        "cuda": torch.version.cuda,  # None for a CPU build
        "cuda_available": torch.cuda.is_available(),
    }


def gpus() -> list[dict[str, Any]]:
    import torch

    if not torch.cuda.is_available():
        return []
    found = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        found.append(
            {
                "index": index,
                "name": props.name,
                "memory_bytes": int(props.total_memory),
                "capability": f"{props.major}.{props.minor}",
            }
        )
    return found


def installed(distribution: str) -> str | None:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def extra_status(extra: Extra, torch_works: bool) -> dict[str, Any]:
    packages = {name: installed(name) for name in extra.packages}
    status: dict[str, Any] = {
        "ready": all(v is not None for v in packages.values()),
        "packages": packages,
        "enables": extra.enables,
        "install": extra.install,
    }
    if extra.name == "video":  # MP4 needs an ffmpeg: the one on PATH or imageio-ffmpeg's
        status["ffmpeg"] = None
        if torch_works:  # ops/video.py draws evaluations: it imports torch
            from navrl_daemon.ops.video import ffmpeg_executable

            status["ffmpeg"] = ffmpeg_executable()
        status["ready"] = status["ffmpeg"] is not None
    return status


def print_text(doc: dict[str, Any]) -> None:
    python, torch = doc["python"], doc["torch"]
    print(f"{'python':<{LABEL}}{python['version']}  {python['executable']}")
    print(f"{'navrl-daemon':<{LABEL}}{doc['navrl_daemon']}")
    if "error" in torch:
        built = f"does not import: {torch['error']}"
    else:
        built = f"CUDA {torch['cuda']} build" if torch["cuda"] else "CPU build"
    print(f"{'torch':<{LABEL}}{torch['version'] or 'MISSING'}  ({built})")
    if doc["gpus"]:
        for gpu in doc["gpus"]:
            memory = gpu["memory_bytes"] / 2**30
            print(
                f"{'GPU':<{LABEL}}cuda:{gpu['index']}  {gpu['name']}, {memory:.1f} GiB, "
                f"compute capability {gpu['capability']}"
            )
    elif "error" in torch:
        print(f"{'GPU':<{LABEL}}unknown: torch does not import")
    elif torch["cuda"]:
        print(f"{'GPU':<{LABEL}}no CUDA: none visible (driver? CUDA_VISIBLE_DEVICES?)")
    else:
        print(f"{'GPU':<{LABEL}}no CUDA: a CPU build of torch; for a GPU (CUDA 13 driver):")
        print(f"{'':<{LABEL}}{torch['cuda_install']}")
    device = doc["device"]
    setting = f'run.device = "{device["run.device"]}"'
    print(f"{'device':<{LABEL}}{device['resolved'] or 'unknown'}  ({setting})")
    plan = doc["plan"]
    if plan is not None and "error" in plan:
        print(f"{'plan':<{LABEL}}cannot run: {plan['error']}")
    elif plan is not None:
        for n, (mode, why) in enumerate(plan["why"].items()):
            print(f"{'plan' if n == 0 else '':<{LABEL}}{mode} = {plan[mode]}  ({why})")
    libraries = [f"{name} {v or 'MISSING'}" for name, v in doc["libraries"].items()]
    for n, line in enumerate(_wrap_items(libraries, width=100 - LABEL)):
        print(f"{'libraries' if n == 0 else '':<{LABEL}}{line}")
    print("extras")
    for name, extra in doc["extras"].items():
        found = [f"{p} {v or '-'}" for p, v in extra["packages"].items()]
        if "ffmpeg" in extra:
            found.append("ffmpeg " + ("found" if extra["ffmpeg"] else "-"))
        mark = "yes" if extra["ready"] else "no "
        hint = "" if extra["ready"] else f"; {extra['install']}"
        print(f"  {name:<8}{mark}  {', '.join(found)}  ({extra['enables']}{hint})")


def _wrap_items(items: list[str], width: int) -> list[str]:
    """`a, b, c` lines of at most `width` characters, broken between items only."""
    lines = [""]
    for item in items:
        if lines[-1] and len(lines[-1]) + len(item) + 2 > width:
            lines[-1] += ","
            lines.append(item)
        else:
            lines[-1] = f"{lines[-1]}, {item}" if lines[-1] else item
    return lines
