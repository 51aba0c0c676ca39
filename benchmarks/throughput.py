"""End-to-end throughput of `navrl-daemon run` per collection and update path, as JSON.

The real daemon (`daemon.serve`: producer, trainer, checkpoint writer, and the evaluator
in the `_eval` variants; metrics off) on one config, once per variant
`<path>_lag<max_policy_lag>[_eval]`:
- `eager`: NavRL's loops: rollout steps op by op (indexed reset), the update with a host
  sync per minibatch (`env.collect_path=eager`, `ppo.update_path=eager`);
- `update_graph`: rollouts op by op, the update's fast path (issue #8's `cuda_graph`);
- `cuda_graph`: both fast paths: each rollout step a CUDA graph replay (masked reset) and
  the captured update (issue #22). On the CPU the fast update is `fused` and rollouts
  stay eager (what `auto` runs there), so `cuda_graph` and `update_graph` are one thing;
- `_eval`: with evaluations every `--eval-interval` iterations (captured, on a stream of
  their own on CUDA); compare with the same variant without `_eval`.
`auto` (the default of both paths) is `cuda_graph` on CUDA and `eager` on the CPU:
`auto_resolves_to` says which.
Each run is a fresh process (see pipeline_overhead.py), the variants take turns, each
skips `--warmup` iterations (the captures among them) and times `--iterations` (or N for
a variant written `name@N`: slow eager variants need fewer, evaluations more). Per
variant: frames/s end to end, collect s/iter and update s/iter (medians within a run),
seconds between iterations (median, min, max within a run), evaluations, peak GPU memory;
medians and spread over `--repeats` runs; ratios against eager at the same policy lag,
lag 1 against lag 0, evaluation on against off. A variant that fails (or outlasts
`--run-timeout`) is reported with its error; the others still run. With `--out`, the JSON
is rewritten there after every run, so a run stopped from outside keeps what it measured.

Run: `.venv/bin/python benchmarks/throughput.py` (CPU, config/default.toml), or at
NavRL's scale on a GPU: `.venv/bin/python benchmarks/throughput.py --device cuda
--config config/navrl-original.toml --variants eager_lag0,cuda_graph_lag0,cuda_graph_lag1`.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from pipeline_overhead import alternate, daemon, make_config, parse_or_run_one, summary

from navrl_daemon.config.execution_plan import update_path
from navrl_daemon.ops.logging import configure_logging

GOAL_FRAMES_PER_S = 300_000
DEFAULT_VARIANTS = "eager_lag0,cuda_graph_lag0"


def paths_of(variant: str, device: str) -> dict[str, str]:
    """The collection and update paths a variant name asks for on this device."""
    path = variant.split("_lag", 1)[0]
    cuda = device.startswith("cuda")
    fast_update = "cuda_graph" if cuda else "fused"
    collect = {"eager": "eager", "update_graph": "eager", "cuda_graph": "cuda_graph"}[path]
    update = "eager" if path == "eager" else fast_update
    return {"collect_path": collect if cuda else "eager", "update_path": update}


def parse_variant(variant: str) -> tuple[str, int, bool, bool]:
    """(path, lag, evaluations on, trainer stream on) of
    `<path>_lag<k>[_streams][_eval]`."""
    path, rest = variant.split("_lag", 1)
    lag, _, tail = rest.partition("_")
    if path not in ("eager", "update_graph", "cuda_graph") or tail not in (
        "",
        "eval",
        "streams",
        "streams_eval",
    ):
        raise SystemExit(
            f"unknown variant {variant!r}: <eager|update_graph|cuda_graph>_lag<k>[_streams][_eval]"
        )
    return path, int(lag), tail.endswith("eval"), tail.startswith("streams")


def one(
    variant: str, path: Path, device: str, warmup: int, iterations: int, overrides: list[str]
) -> None:
    _, lag, evaluations, streams = parse_variant(variant)
    paths = paths_of(variant, device)
    interval = int(os.environ.get("NAVRL_BENCH_EVAL_INTERVAL", "25"))
    cfg = make_config(
        path,
        device,
        [
            *overrides,
            f"env.collect_path={paths['collect_path']}",
            f"ppo.update_path={paths['update_path']}",
            *([f"eval.interval={interval}"] if evaluations else []),
            *(["pipeline.trainer_stream=true"] if streams else []),
        ],
    )
    configure_logging(cfg.log)
    result: dict[str, Any] = daemon(cfg, warmup, iterations, lag=lag)
    result["resolved_path"] = update_path(paths["update_path"], device).value
    result["collect_path"] = paths["collect_path"]
    if torch.cuda.is_available() and device.startswith("cuda"):
        result["gpu_max_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
        result["gpu_max_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
    print(json.dumps(result))


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def variant_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    errors = [r["error"] for r in runs if "error" in r]
    if not ok:
        return {"error": errors[0], "failed_runs": len(errors)}
    out: dict[str, Any] = {
        "resolved_path": ok[0]["resolved_path"],
        "collect_path": ok[0]["collect_path"],
        "frames_per_s": summary([x["frames_per_s"] for x in ok]),
        "collect_s": round(median_of(ok, "collect_s"), 5),
        "update_s": round(median_of(ok, "update_s"), 5),
        "iteration_s": {
            k: round(statistics.median(x["iteration_s"][k] for x in ok), 5)
            for k in ("median", "min", "max")
        },
        "policy_lag": round(statistics.fmean(x["policy_lag"] for x in ok), 3),
        "evaluations": ok[0]["evaluations"],
    }
    if "gpu_max_allocated_mib" in ok[0]:
        out["gpu_max_allocated_mib"] = round(max(x["gpu_max_allocated_mib"] for x in ok))
    if errors:
        out["failed_runs"] = len(errors)
        out["errors"] = errors
    return out


def ratios_of(fps: dict[str, float]) -> dict[str, float]:
    """Each variant against eager at its lag, lag 1 against lag 0, eval on against off,
    the trainer's own stream against none."""
    ratios: dict[str, float] = {}
    for variant, value in fps.items():
        path, lag, evaluations, streams = parse_variant(variant)
        suffix = "_eval" if evaluations else ""
        pairs = [
            (f"eager_lag{lag}{suffix}", path != "eager" and not streams),
            (f"{path}_lag0{suffix}", lag == 1 and not streams),
            (f"{path}_lag{lag}", evaluations and not streams),
            (f"{path}_lag{lag}{suffix}", streams),
            (f"{path}_lag0{suffix}", streams and lag == 1),
        ]
        for base, wanted in pairs:
            if wanted and base in fps:
                ratios[f"{variant}_vs_{base}"] = round(value / fps[base], 3)
    return ratios


def report(args: Any, variants: list[str], runs: dict[str, list[dict]], t0: float) -> dict:
    cfg = make_config(args.config, args.device, args.overrides)
    done = {v: r for v, r in runs.items() if r}
    summaries = {v: variant_summary(r) for v, r in done.items()}
    fps = {
        v: median_of([x for x in r if "error" not in x], "frames_per_s")
        for v, r in done.items()
        if "error" not in summaries[v]
    }
    return {
        "benchmark": "throughput",
        "device": args.device,
        "device_name": (
            torch.cuda.get_device_name()
            if args.device.startswith("cuda")
            else platform.processor() or platform.machine()
        ),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "config": str(args.config),
        "overrides": args.overrides,
        "num_envs": cfg.env.num_envs,
        "num_obstacles": cfg.env.num_obstacles,
        "num_dynamic_obstacles": cfg.env.num_dynamic_obstacles,
        "frames_per_iteration": cfg.frames_per_iteration,
        "epochs_x_minibatches": [cfg.ppo.epochs, cfg.ppo.minibatches],
        "eval": {
            "interval": args.eval_interval,
            "num_envs": cfg.eval.num_envs,
            "max_steps": cfg.eval.max_steps or cfg.env.max_episode_length,
        },
        "warmup": args.warmup,
        "iterations": args.iterations_of,
        "repeats": args.repeats,
        "auto_resolves_to": paths_of("cuda_graph_lag0", args.device)
        if args.device.startswith("cuda")
        else paths_of("eager_lag0", args.device),
        "variants": summaries,
        # Runs finished (with numbers or an error) of those planned: less when stopped early.
        "runs_done": f"{sum(len(r) for r in done.values())}/{len(variants) * args.repeats}",
        "ratios": ratios_of(fps),
        "best_frames_per_s": round(max(fps.values())) if fps else None,
        "goal_frames_per_s": GOAL_FRAMES_PER_S,
        "total_s": round(time.perf_counter() - t0, 1),
    }


def take_flag(name: str, default: str) -> str:
    """`--name VALUE` out of sys.argv (before the shared parser sees it)."""
    if name in sys.argv:
        i = sys.argv.index(name)
        value = sys.argv[i + 1]
        del sys.argv[i : i + 2]
        return value
    return default


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        parse_or_run_one(__doc__, one, iterations=10)
        return
    specs = [v.partition("@") for v in take_flag("--variants", DEFAULT_VARIANTS).split(",")]
    variants = [name for name, _, _ in specs]
    iterations = {name: int(n) for name, _, n in specs if n}
    if "--lag1" in sys.argv:  # the older spelling: both paths at lag 1 too
        sys.argv.remove("--lag1")
        variants += [v.replace("_lag0", "_lag1") for v in variants if "_lag0" in v]
    eval_interval = int(take_flag("--eval-interval", "25"))
    run_timeout = float(take_flag("--run-timeout", "0")) or None
    out_path = take_flag("--out", "")
    for variant in variants:
        parse_variant(variant)
    args = parse_or_run_one(__doc__, one, iterations=10)
    assert args is not None
    args.eval_interval = eval_interval
    os.environ["NAVRL_BENCH_EVAL_INTERVAL"] = str(eval_interval)  # the runs read it
    t0 = time.perf_counter()

    def save(runs: dict[str, list[dict]]) -> None:
        if out_path:
            Path(out_path).write_text(json.dumps(report(args, variants, runs, t0), indent=1))

    args.iterations_of = {v: iterations.get(v, args.iterations) for v in variants}
    runs = alternate(
        __file__,
        variants,
        args,
        keep_going=True,
        timeout_s=run_timeout,
        after_each=save,
        iterations=iterations,
    )
    print(json.dumps(report(args, variants, runs, t0), indent=1))


if __name__ == "__main__":
    main()
