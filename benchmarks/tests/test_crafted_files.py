"""benchmarks/crafted_files.py at its CI size: one crafted file of each kind of fault
(policy files, checkpoints, HDF5 datasets, archives) through its command as a process of
its own. Each exits 65 naming the file and the reason, without a traceback; no payload
writes its marker, nothing is exported, and the state dir the commands were pointed at
resumes from its newest valid checkpoint afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import crafted_files as bench


def test_every_crafted_file_is_refused_and_the_state_dir_resumes(tmp_path: Path) -> None:
    report = bench.run_corpus(tmp_path, small=True, run=bench.forked_runner(), runner_name="fork")
    assert report["failures"] == [], json.dumps(report["failures"], indent=1)
    assert set(report["by_family"]) == {"policies", "datasets", "archives"}
    assert report["cases"] >= len(bench.SMALL)  # a name may be in several families
    assert not report["marker_written"] and report["exports_written"] == []
    assert report["resume"]["ok"], report["resume"]
    assert report["resume"]["resumed_from"] == bench.TRAINED_ITERATIONS
    assert report["ok"]
