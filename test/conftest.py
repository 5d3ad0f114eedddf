"""Skip policy for every pytest run under test/ (loaded through test/pytest.ini,
which makes test/ the rootdir, so ctest's invocations and hand-run ones alike):

- every skip (a test's, or a whole module's at collection) is recorded with its
  reason; when LOONGFORGE_TEST_REPORT names a file, the run writes one line per
  skip there, `<test id>\t<reason>` (the file is written, empty, when nothing
  skipped), and scripts/test.sh prints them all at the end;
- with CI=true (any of true/1/yes), a skip is a failure: in CI a test that
  cannot run for a missing fixture, tool, permission or dataset has proved
  nothing, and the run must say so rather than pass. Expected failures (xfail)
  are not skips and are left alone.

Environment: CI, LOONGFORGE_TEST_REPORT (set per test by the CMake files under
test/), LOONGFORGE_TEST_REPORTS (a folder; used with a name derived from the
command line when LOONGFORGE_TEST_REPORT is not set).
"""
import os
import re
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")

_skips = []  # (test id, reason)


def _reason(report):
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: reason")
        return re.sub(r"^Skipped: ", "", str(longrepr[2]))
    return str(longrepr)


def _fail_in_ci(report, reason):
    report.outcome = "failed"
    report.longrepr = (f"skipped in CI (CI=true makes a skip a failure): {reason}\n"
                       "Provide what the test needs (fixture, tool, permission, dataset) or fix the test.")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = _reason(report)
        _skips.append((report.nodeid, reason))
        if IN_CI:
            _fail_in_ci(report, reason)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if report.skipped:  # pytest.skip(allow_module_level=True) or a module-level skipif
        reason = _reason(report)
        _skips.append((report.nodeid, reason))
        if IN_CI:
            _fail_in_ci(report, reason)


def _report_path(config):
    explicit = os.environ.get("LOONGFORGE_TEST_REPORT")
    if explicit:
        return Path(explicit)
    folder = os.environ.get("LOONGFORGE_TEST_REPORTS")
    if not folder:
        return None
    args = [a for a in config.invocation_params.args if not a.startswith("-")]
    name = "_".join(Path(a).name.split(".")[0] for a in args) or "pytest"
    return Path(folder) / f"skips-{name}.txt"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _skips:
        terminalreporter.write_line(
            f"{len(_skips)} skipped{' (failures: CI=true)' if IN_CI else ''}:")
        for test_id, reason in _skips:
            terminalreporter.write_line(f"  SKIP {test_id}: {reason}")


def pytest_unconfigure(config):
    path = _report_path(config)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{test_id}\t{reason}\n" for test_id, reason in _skips))
