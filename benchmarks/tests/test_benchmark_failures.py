"""A benchmark variant that fails is reported with its error; the others still run and
report (issue #22: the 1024-env throughput run lost every variant to one failure)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pipeline_overhead
import pytest
import throughput


@pytest.fixture
def bench():
    return pipeline_overhead, throughput


def test_alternate_keeps_going_past_a_failing_and_a_hanging_run(bench, tmp_path: Path) -> None:
    pipeline_overhead, _ = bench
    script = tmp_path / "variant.py"
    script.write_text(
        "import json, sys, time\n"
        "variant = sys.argv[2]\n"
        "if variant == 'broken':\n"
        "    sys.exit('RuntimeError: Offset increment outside graph capture')\n"
        "if variant == 'slow':\n"
        "    time.sleep(30)\n"
        "print(json.dumps({'frames_per_s': 1.0, 'variant': variant}))\n"
    )
    args = argparse.Namespace(
        config="c.toml", device="cpu", warmup=1, iterations=2, repeats=2, overrides=[]
    )
    seen = []
    runs = pipeline_overhead.alternate(
        str(script),
        ["ok", "broken", "slow"],
        args,
        keep_going=True,
        timeout_s=2,
        after_each=lambda r: seen.append(sum(len(v) for v in r.values())),
    )
    assert runs["ok"] == [{"frames_per_s": 1.0, "variant": "ok"}] * 2
    assert all("exit status 1" in r["error"] for r in runs["broken"])
    assert "Offset increment outside graph capture" in runs["broken"][0]["error"]
    assert all(r["error"].startswith("timed out after 2 s") for r in runs["slow"])
    assert seen == [1, 2, 3, 4, 5, 6]  # the report is refreshed after every run
    with pytest.raises(subprocess.CalledProcessError):  # without keep_going: the first failure
        pipeline_overhead.alternate(str(script), ["broken"], args)


def test_throughput_reports_failed_variants_and_the_ratios_it_can(bench) -> None:
    _, throughput = bench
    ok = {
        "frames_per_s": 100.0,
        "collect_s": 0.1,
        "update_s": 0.2,
        "iteration_s": {"median": 0.3, "min": 0.2, "max": 0.4},
        "policy_lag": 0.0,
        "evaluations": [],
        "resolved_path": "fused",
        "collect_path": "eager",
    }
    failed = {"error": "exit status 1: RuntimeError: boom"}
    assert throughput.variant_summary([failed]) == {"error": failed["error"], "failed_runs": 1}
    partly = throughput.variant_summary([ok, failed])
    assert partly["failed_runs"] == 1 and partly["frames_per_s"]["median"] == 100.0
    ratios = throughput.ratios_of({"eager_lag0": 50.0, "cuda_graph_lag0": 100.0})
    assert ratios == {"cuda_graph_lag0_vs_eager_lag0": 2.0}
    ratios = throughput.ratios_of(
        {"cuda_graph_lag0": 100.0, "cuda_graph_lag1": 110.0, "cuda_graph_lag0_eval": 95.0}
    )
    assert ratios == {
        "cuda_graph_lag1_vs_cuda_graph_lag0": 1.1,
        "cuda_graph_lag0_eval_vs_cuda_graph_lag0": 0.95,
    }
    assert json.dumps(ratios)  # plain JSON
    ratios = throughput.ratios_of(
        {"cuda_graph_lag0": 100.0, "cuda_graph_lag1": 110.0, "cuda_graph_lag1_streams": 150.0}
    )
    assert ratios == {
        "cuda_graph_lag1_vs_cuda_graph_lag0": 1.1,
        "cuda_graph_lag1_streams_vs_cuda_graph_lag1": 1.364,
        "cuda_graph_lag1_streams_vs_cuda_graph_lag0": 1.5,
    }
    assert sys.modules["throughput"].parse_variant("cuda_graph_lag1_eval") == (
        "cuda_graph",
        1,
        True,
        False,
    )
    assert sys.modules["throughput"].parse_variant("cuda_graph_lag1_streams") == (
        "cuda_graph",
        1,
        False,
        True,
    )
