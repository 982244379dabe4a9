"""The skip policy, a pytest plugin that conftest.py loads: with `--allowed-skips FILE`, at the
end of the run every skip whose reason no pattern of FILE matches is listed, one line per
reason, and the run fails, so a group of tests that stopped running (a missing extra, browser,
model) turns CI red instead of green.

FILE holds one regular expression a line, matched against the whole reason (re.fullmatch);
`#` starts a comment, blank lines are ignored."""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import pytest


def load_patterns(path: Path) -> list[re.Pattern]:
    """The allow-list's patterns, comments and blank lines dropped."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [re.compile(line) for line in lines if line]


def skip_reason(report: pytest.TestReport | pytest.CollectReport,
                root: Path) -> tuple[str, str]:
    """(reason, where) of a skipped test or module, where relative to root."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        path, lineno, message = longrepr
        where = f"{os.path.relpath(path, root)}:{lineno}"
    else:
        message, where = str(longrepr), report.nodeid
    return message.removeprefix("Skipped: "), where


def is_allowed(reason: str, patterns: list[re.Pattern]) -> bool:
    return any(p.fullmatch(reason) for p in patterns)


class SkipPolicy:
    """Records every skip not on the allow-list; fails the session when there is one."""

    def __init__(self, patterns: list[re.Pattern], root: Path) -> None:
        self.patterns, self.root = patterns, root
        self.disallowed: Counter[tuple[str, str]] = Counter()

    def _record(self, report) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            reason, where = skip_reason(report, self.root)
            if not is_allowed(reason, self.patterns):
                self.disallowed[reason, where] += 1

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._record(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._record(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # a run that collected nothing else (every module skipped) fails the same way
        if self.disallowed and session.exitstatus in (pytest.ExitCode.OK,
                                                      pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.disallowed:
            return
        terminalreporter.section("skips not on the allow-list", sep="=", red=True)
        for (reason, where), n in sorted(self.disallowed.items()):
            terminalreporter.line(f"DISALLOWED SKIP ({n}) {where}: {reason}", red=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--allowed-skips", metavar="FILE", default=None,
                     help="fail the run when a test skips for a reason no pattern in FILE "
                          "matches (tests/allowed_skips.txt)")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--allowed-skips")
    if path:
        policy = SkipPolicy(load_patterns(Path(path)), config.rootpath)
        config.pluginmanager.register(policy, "skip_policy_session")
