"""benchmarks/faults.py's security section at its small size: every crafted input (configs
here; each kind of input adds its own function to `faults.CRAFTED`) gets its documented
exit code from `python -m navrl_daemon` run beside a module that marks its import, with no
traceback and no marker, and the state dir's newest valid checkpoint resumes afterwards."""

from __future__ import annotations

from pathlib import Path

import faults
import pytest


@pytest.mark.slow
def test_crafted_inputs_get_their_exit_codes_and_run_no_code(tmp_path: Path) -> None:
    result = faults.security(tmp_path)
    bad = [c for c in result["cases"] if c["exit_code"] != c["expected"] or c["traceback"]]
    assert not bad, bad
    assert result["as_expected"] and not result["marker_written"]
    assert result["first_exit_code"] == 0 and result["resume_exit_code"] == 0
    assert result["resumed_from"] == result["newest_valid_before"] is not None
