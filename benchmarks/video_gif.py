"""`eval --video` GIF cost: bytes and encode seconds of the shipped encoder (one 32-colour
palette from the last frame, no dithering: ops/video.py `encode_gif`) against the baseline
of a dithered 64-colour palette per frame, both encoding the same rendered frames (the
rendering, common to both, is timed once on its own), printed as JSON.

The frames come from an evaluation of a randomly initialised policy on a 12 m field with
40 pillars and 16 moving obstacles. Each encoding is repeated; median, min and max are
reported, with the machine's load.

    python benchmarks/video_gif.py [--drones 6] [--steps 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch
from PIL import Image

from navrl_daemon.config import load_config
from navrl_daemon.ops.video import FPS, encode_gif, frames
from navrl_daemon.rl.evaluate import evaluate_recorded
from navrl_daemon.rl.evaluations import make_eval_env
from navrl_daemon.rl.policy import make_policy

SCENE = [
    "run.device=cpu",
    "env.field_size=12",
    "env.num_obstacles=40",
    "env.num_dynamic_obstacles=16",
    "eval.layout=navrl",
]


def baseline_gif(images: list[Image.Image]) -> bytes:
    """A dithered median-cut palette per frame: what a plain Pillow encode does."""
    indexed = [im.quantize(colors=64, method=Image.Quantize.MEDIANCUT) for im in images]
    buf = io.BytesIO()
    indexed[0].save(
        buf, format="GIF", save_all=True, append_images=indexed[1:], duration=1000 // FPS, loop=0
    )
    return buf.getvalue()


def timed(fn: Callable[[], bytes], repeats: int) -> dict:
    times, size = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        size = len(fn())
        times.append(time.perf_counter() - t0)
    return {
        "bytes": size,
        "seconds_median": round(statistics.median(times), 3),
        "seconds_min": round(min(times), 3),
        "seconds_max": round(max(times), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drones", type=int, default=6)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    load_before = os.getloadavg()
    cfg = load_config(
        None, [*SCENE, f"eval.num_envs={args.drones}", f"env.max_episode_length={args.steps}"]
    )
    torch.manual_seed(0)
    _, traj = evaluate_recorded(
        make_eval_env(cfg, "cpu"), make_policy(cfg, "cpu"), seed=0, max_steps=args.steps
    )
    t0 = time.perf_counter()
    images = list(frames(traj))
    render_s = time.perf_counter() - t0
    shipped = timed(lambda: encode_gif(images), args.repeats)
    baseline = timed(lambda: baseline_gif(images), args.repeats)
    print(
        json.dumps(
            {
                "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
                "load_1min_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
                "drones": args.drones,
                "frames": len(images),
                "render_seconds": round(render_s, 3),
                "shipped_encode": shipped,
                "baseline_encode": baseline,
                "bytes_ratio_shipped_over_baseline": round(shipped["bytes"] / baseline["bytes"], 3),
                "encode_seconds_ratio_shipped_over_baseline": round(
                    shipped["seconds_median"] / baseline["seconds_median"], 3
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
