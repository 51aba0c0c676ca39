"""benchmarks/curve_spans.py, run as a user runs it, on a kept state dir and on a
learning.py JSON: span means, stage starts and first frames at a bar."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from navrl_daemon.testing import forked

M = 1_000_000


def spans_script(*args: str) -> subprocess.CompletedProcess[str]:
    return forked.run_script("benchmarks/curve_spans.py", list(args), timeout=120)


def evaluation(frames: float, reach: float, collision: float, held: float, stage: int) -> dict:
    return {
        "iteration": int(frames // 32768),
        "frames": int(frames),
        "reach_goal": reach,
        "collision": collision,
        "held_out_reach_goal": held,
        "held_out_collision": 1.0 - held,
        "curriculum_stage": stage,
    }


def kept_run(root: Path) -> Path:
    """A state dir as learning.py keeps one: evaluations every 1 M frames, the stage
    switch at 2.5 M frames in the progress rows (between two evaluations)."""
    (root / "eval").mkdir(parents=True)
    rows = [
        evaluation(1 * M, 0.2, 0.8, 0.1, 0),
        evaluation(2 * M, 0.5, 0.5, 0.4, 0),  # at the 0.5 bar (both bounds inclusive)
        evaluation(3 * M, 0.6, 0.3, 0.5, 1),
        evaluation(4 * M, 0.8, 0.2, 0.6, 1),
        evaluation(5 * M, 0.9, 0.1, 0.9, 1),  # at the 0.9 bar, own and held out
    ]
    (root / "eval" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    history = [
        {"iteration": i, "frames": f, "curriculum_stage": int(f >= 2.5 * M)}
        for i, f in enumerate(range(M // 2, 5 * M + 1, M // 2), start=1)
    ]
    (root / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
    return root


def test_a_kept_run_is_summed_up_per_span(tmp_path: Path) -> None:
    run = kept_run(tmp_path / "run")
    proc = spans_script(
        str(run), "--edges", "0", "2", "4", "end", "--out", str(tmp_path / "s.json")
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc == json.loads((tmp_path / "s.json").read_text())
    (summary,) = doc["runs"]
    first, second, last = summary["spans"]
    assert (first["from"], first["to"], first["evaluations"]) == (0, 2 * M, 2)  # (0, 2 M]
    assert first["reach_goal"] == 0.35 and first["held_out_reach_goal"] == 0.25
    assert second["evaluations"] == 2 and second["reach_goal"] == 0.7
    assert second["collision"] == 0.25
    assert (last["to"], last["evaluations"], last["reach_goal"]) == (None, 1, 0.9)
    assert summary["stages"] == {"0": M // 2, "1": 5 * M // 2}  # the progress rows' switch
    assert summary["first_at"]["own"] == {"0.5": 2 * M, "0.9": 5 * M}
    assert summary["first_at"]["held_out"] == {"0.5": 3 * M, "0.9": 5 * M}


def test_a_learning_json_and_a_span_without_evaluations(tmp_path: Path) -> None:
    rows = [evaluation(f * M, 0.1 * f, 0.5, 0.1 * f, 0) for f in (1, 2, 3)]
    curve = [{"frames": 0, "reach_goal": 0.0, "collision": 0.0}, *rows]  # 0: the untrained
    path = tmp_path / "learning.json"
    path.write_text(json.dumps({"benchmark": "learning", "curve": curve}))
    proc = spans_script(str(path), "--edges", "0", "1.5", "3", "9", "--markdown")
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout.splitlines()
    assert table[2] == "| 0.00 M–1.50 M | 0.10 (0.10), 1 |"
    assert table[3] == "| 1.50 M–3.00 M | 0.25 (0.25), 2 |"
    assert table[4] == "| 3.00 M–9.00 M | – (–), 0 |"
    assert "stage 0 at 1.00 M" in proc.stdout and "own >= 0.9: never" in proc.stdout


def test_what_is_not_a_run_exits_65(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "other.json").write_text(json.dumps({"benchmark": "diagnose"}))
    for path, needle in (
        (tmp_path / "empty", "no evaluations"),
        (tmp_path / "other.json", "not benchmarks/learning.py's output"),
        (tmp_path / "missing.json", "neither a state dir nor readable JSON"),
    ):
        proc = spans_script(str(path), "--edges", "0", "1")
        assert proc.returncode == 65 and needle in proc.stderr, proc.stderr
    run = kept_run(tmp_path / "run")
    for edges in (["1"], ["2", "1"], ["0", "x"], ["end", "1"]):
        proc = spans_script(str(run), "--edges", *edges)
        assert proc.returncode == 65 and "--edges" in proc.stderr, (edges, proc.stderr)
