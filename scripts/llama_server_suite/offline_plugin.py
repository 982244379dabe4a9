"""A pytest plugin that runs llama.cpp's server tests offline and writes their outcomes as JSON.

Loaded by scripts/llama_server_suite.sh with `-p offline_plugin`, from the copied
tools/server/tests directory. It changes no assertion: it only

- points the presets named `local` in offline.txt at the model file in $SUITE_MODEL;
- skips a test when it starts a server with a hub model or calls download_file(), naming
  what it needed, and skips the tests listed with `skip` in offline.txt;
- makes ServerPreset.load_all (which downloads every preset's model) a no-op;
- writes $SUITE_JSON: each test's outcome (passed, failed, error, skipped) with a one-line
  reason, its seconds and, from edgeinfer-server's warning line, the flags it ignored; the
  counts (and seconds) per file and in total.
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys
from collections import Counter
from pathlib import Path

import pytest

DATA = Path(__file__).with_name("offline.txt")
IGNORED_LINE = "warning: not supported by edgeinfer, ignored:"  # edgeinfer-server's warning
HUB_FIELDS = ("model_hf_repo", "model_hf_file", "model_url", "mmproj_url")


def read_offline_data(path: Path = DATA) -> tuple[set[str], list[tuple[str, str]]]:
    """(presets served by the local model, [(node id pattern, reason)]) from offline.txt."""
    local: set[str] = set()
    skips: list[tuple[str, str]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        words = line.split(None, 2)
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "local" and len(words) == 2:
            local.add(words[1])
        elif words[0] == "skip" and len(words) == 3:
            skips.append((words[1], words[2]))
        else:
            raise ValueError(f"{path}: cannot read line {line!r}")
    return local, skips


def _patch_utils(model: str, local: set[str]) -> None:
    sys.path.insert(0, os.getcwd())  # the suite's utils.py, before its conftest imports it
    import utils

    def localize(make):
        def preset():
            server = make()
            for field in HUB_FIELDS:
                setattr(server, field, None)
            server.model_file = model
            return server
        return staticmethod(preset)

    for name in local:
        original = getattr(utils.ServerPreset, name)  # staticmethod: a plain function here
        setattr(utils.ServerPreset, name, localize(original))
    utils.ServerPreset.load_all = staticmethod(lambda: None)

    start = utils.ServerProcess.start

    def start_offline(self, *args, **kwargs):
        hub = [f"{f}={getattr(self, f)}" for f in HUB_FIELDS if getattr(self, f, None)]
        if hub:
            pytest.skip(f"needs the hub model {', '.join(hub)}")
        return start(self, *args, **kwargs)

    def download_file(url: str, output_file_path: str | None = None) -> str:
        pytest.skip(f"needs a download: {url}")

    utils.ServerProcess.start = start_offline
    utils.download_file = download_file  # before `from utils import *` in the test modules


class OutcomeRecorder:
    """Collects one outcome per test from the setup/call/teardown reports."""

    def __init__(self, path: Path | None, skips: list[tuple[str, str]]):
        self.path = path
        self.skips = skips
        self.tests: dict[str, dict] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items):
        for item in items:
            for pattern, reason in self.skips:
                if fnmatch.fnmatchcase(item.nodeid, pattern):
                    item.add_marker(pytest.mark.skip(reason=f"offline.txt: {reason}"))
                    break

    def pytest_runtest_logreport(self, report):
        entry = self.tests.setdefault(report.nodeid,
                                      {"outcome": "passed", "reason": "", "seconds": 0.0})
        entry["seconds"] = round(entry["seconds"] + report.duration, 2)
        for line in report.capstdout.splitlines():  # the servers' output is captured too
            if line.startswith(IGNORED_LINE):
                flags = line.removeprefix(IGNORED_LINE).strip().split(", ")
                entry["ignored_flags"] = sorted(set(entry.get("ignored_flags", [])) | set(flags))
        if report.skipped:
            entry.update(outcome="skipped", reason=_skip_reason(report))
        elif report.failed:
            outcome = "failed" if report.when == "call" else "error"
            if entry["outcome"] in ("passed", "skipped") or outcome == "failed":
                entry.update(outcome=outcome, reason=f"{report.when}: {_crash(report)}")

    def pytest_sessionfinish(self, session):
        if self.path is None or hasattr(session.config, "workerinput"):
            return  # no file asked for, or an xdist worker: the controller writes it
        files: dict[str, Counter] = {}
        seconds: Counter = Counter()
        for nodeid, entry in sorted(self.tests.items()):
            files.setdefault(nodeid.split("::")[0], Counter())[entry["outcome"]] += 1
            seconds[nodeid.split("::")[0]] += entry["seconds"]
        outcomes = ("passed", "failed", "error", "skipped")
        result = {
            "server": os.environ.get("LLAMA_SERVER_BIN_PATH", ""),
            "model": os.environ.get("SUITE_MODEL", ""),
            "totals": {k: sum(c[k] for c in files.values()) for k in outcomes},
            "files": {f: {**{k: c[k] for k in outcomes}, "seconds": round(seconds[f], 1)}
                      for f, c in files.items()},
            "tests": dict(sorted(self.tests.items())),
        }
        self.path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _crash(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return text.strip().splitlines()[0][:300] if text.strip() else ""


def pytest_configure(config):
    model = os.environ.get("SUITE_MODEL")
    if not model or not Path(model).is_file():
        raise pytest.UsageError(f"SUITE_MODEL must name a GGUF file (got {model!r})")
    local, skips = read_offline_data()
    _patch_utils(model, local)
    out = os.environ.get("SUITE_JSON")
    recorder = OutcomeRecorder(Path(out) if out else None, skips)
    config.pluginmanager.register(recorder, "suite-outcomes")
