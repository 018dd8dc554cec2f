"""The suite's xdist scheduling (tests/conftest.py): files scheduled whole, the Slurm files together, the
longest recorded first."""
from __future__ import annotations

from tests.conftest import DURATIONS, SLURM_FILES, schedule_scope, scope_order


def test_scopes_are_files_and_the_slurm_files_share_one():
    assert schedule_scope("tests/dist/test_ss.py::test_x[ddp-2]") == "tests/dist/test_ss.py"
    assert {schedule_scope(f"{f}::test_y") for f in SLURM_FILES} == {"slurm"}


def test_recorded_scopes_go_longest_first_after_the_unrecorded_ones():
    seconds = {"b.py": 1.0, "c.py": 50.0, "slurm": 20.0}
    assert scope_order(["a.py", "b.py", "c.py", "slurm", "d.py"], seconds) == ["a.py", "d.py", "c.py", "slurm", "b.py"]
    assert scope_order(["b.py"], {}) == ["b.py"]


def test_the_recorded_durations_name_scopes_that_exist():
    """A renamed or deleted file's record would order nothing: the committed record names real files."""
    import json

    from tests.conftest import REPO

    seconds = json.loads(DURATIONS.read_text())
    missing = [s for s in seconds if s != "slurm" and not (REPO / s).is_file()]
    assert not missing, f"{DURATIONS.name} names files that do not exist: {missing} (re-record it)"
    assert all(v >= 0 for v in seconds.values())
