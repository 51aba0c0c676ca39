"""End-to-end throughput of `navrl-daemon run` per PPO update path, as JSON (issue #8).

The real daemon (`daemon.serve`: producer, trainer, checkpoint writer; evaluation and
metrics off) on one config, once per variant `<update_path>_lag<max_policy_lag>`:
- `eager`: NavRL's update loop, one host sync per minibatch (rl/ppo.py);
- the fast path: `cuda_graph` on CUDA, `fused` on the CPU (rl/fast_update.py).
`auto` (the default) is one of these two, the same code, so it is not run again:
`auto_resolves_to` says which. On the CPU, the fused vs eager ratio is what `auto`
would gain or lose by not falling back to eager there.
Each run is a fresh process (see pipeline_overhead.py), the variants take turns, each
skips `--warmup` iterations (the graph capture among them) and times `--iterations`.
Per variant: frames/s end to end, collect s/iter and update s/iter (medians within a
run), peak GPU memory; then medians and spread over `--repeats` runs, and ratios against
eager at the same policy lag.

Run: `.venv/bin/python benchmarks/throughput.py` (CPU, config/default.toml), or at
NavRL's scale on a GPU:
`.venv/bin/python benchmarks/throughput.py --device cuda --config config/navrl.toml`.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from pipeline_overhead import alternate, daemon, make_config, parse_or_run_one, summary

from navrl_daemon.ops.logging import configure_logging
from navrl_daemon.rl.fast_update import resolve

GOAL_FRAMES_PER_S = 300_000


def one(
    variant: str, path: Path, device: str, warmup: int, iterations: int, overrides: list[str]
) -> None:
    update_path, lag = variant.rsplit("_lag", 1)
    cfg = make_config(path, device, [*overrides, f"ppo.update_path={update_path}"])
    configure_logging(cfg.log)
    result = daemon(cfg, warmup, iterations, lag=int(lag))
    result["resolved_path"] = resolve(update_path, torch.device(device))
    if torch.cuda.is_available() and device.startswith("cuda"):
        result["gpu_max_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
        result["gpu_max_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
    print(json.dumps(result))


def variants_for(device: str, lags: list[int]) -> list[str]:
    fast = "cuda_graph" if device.startswith("cuda") else "fused"
    return [f"{path}_lag{lag}" for lag in lags for path in ("eager", fast)]


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> None:
    lags = [0, 1] if "--lag1" in sys.argv else [0]
    if "--lag1" in sys.argv:
        sys.argv.remove("--lag1")
    args = parse_or_run_one(__doc__, one, iterations=10)
    if args is None:
        return
    t0 = time.perf_counter()
    variants = variants_for(args.device, lags)
    runs = alternate(__file__, variants, args)
    cfg = make_config(args.config, args.device, args.overrides)
    out: dict[str, object] = {
        "benchmark": "throughput",
        "device": args.device,
        "device_name": (
            torch.cuda.get_device_name()
            if args.device.startswith("cuda")
            else platform.processor() or platform.machine()
        ),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "config": str(args.config),
        "overrides": args.overrides,
        "num_envs": cfg.env.num_envs,
        "num_obstacles": cfg.env.num_obstacles,
        "num_dynamic_obstacles": cfg.env.num_dynamic_obstacles,
        "frames_per_iteration": cfg.frames_per_iteration,
        "epochs_x_minibatches": [cfg.ppo.epochs, cfg.ppo.minibatches],
        "warmup": args.warmup,
        "iterations": args.iterations,
        "repeats": args.repeats,
        "auto_resolves_to": resolve("auto", torch.device(args.device)),
        "variants": {
            v: {
                "resolved_path": r[0]["resolved_path"],
                "frames_per_s": summary([x["frames_per_s"] for x in r]),
                "collect_s": round(median_of(r, "collect_s"), 5),
                "update_s": round(median_of(r, "update_s"), 5),
                "policy_lag": round(statistics.fmean(x["policy_lag"] for x in r), 3),
                **(
                    {"gpu_max_allocated_mib": round(max(x["gpu_max_allocated_mib"] for x in r))}
                    if "gpu_max_allocated_mib" in r[0]
                    else {}
                ),
            }
            for v, r in runs.items()
        },
    }
    fps = {v: median_of(r, "frames_per_s") for v, r in runs.items()}
    ratios: dict[str, float] = {}
    for variant in variants:
        path, lag = variant.rsplit("_lag", 1)
        if path != "eager":
            ratios[f"{variant}_vs_eager_lag{lag}"] = round(fps[variant] / fps[f"eager_lag{lag}"], 3)
        if lag == "1":
            ratios[f"{variant}_vs_{path}_lag0"] = round(fps[variant] / fps[f"{path}_lag0"], 3)
    out["ratios"] = ratios
    out["best_frames_per_s"] = round(max(fps.values()))
    out["goal_frames_per_s"] = GOAL_FRAMES_PER_S
    out["total_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
