"""The fast tier stays free of processes: a test that starts one fails unless it is marked slow."""

from pathlib import Path

CONFTEST = Path(__file__).with_name("conftest.py")
SPAWNING = """
import subprocess, sys
import pytest

def test_unmarked_worker():
    subprocess.run([sys.executable, "-c", "pass"])

def test_unmarked_that_swallows_the_refusal():
    try:
        subprocess.Popen([sys.executable, "-c", "pass"])
    except BaseException:
        pass

def test_a_probe_is_not_a_process_to_mark():
    assert subprocess.run(["uname", "-p"], capture_output=True).returncode == 0

@pytest.mark.slow
def test_marked():
    pass
"""


def test_an_unmarked_test_that_starts_a_process_fails(pytester):
    pytester.syspathinsert(CONFTEST.parent)  # conftest.py imports helpers.py
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_spawning=SPAWNING)
    result = pytester.runpytest_inprocess("-m", "not slow", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=2, deselected=1)
    result.stdout.fnmatch_lines(["*test_unmarked_worker starts a process (subprocess.Popen *) but is not marked slow*"])
