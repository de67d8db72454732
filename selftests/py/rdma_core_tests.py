#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Runs rdma-core's own test suite (its tests/ directory, with the guest's stock pyverbs)
against one device and records every test's outcome.

    rdma_core_tests.py TESTS_DIR DEV OUT [MODULE...]

Each test module (tests/test_*.py, or the MODULEs named) runs in a process of its own, so that
a crash or a hang in one costs only that module: its tests that never reported are recorded
as errors ("crashed" or "timed out"). OUT gets one line per test, tab-separated:

    <outcome>\t<test id>\t<detail>

with outcome one of pass, fail, error, skip, xfail, xpass; detail is the skip reason or the
last line of the traceback. The summary goes to stdout.
"""

import json
import os
import subprocess
import sys

# A test that runs longer than TEST_TIMEOUT seconds is stopped (SIGALRM raises in it) and
# recorded as an error; a module whose process outlives MODULE_TIMEOUT is killed.
TEST_TIMEOUT = int(os.environ.get("RDMA_CORE_TEST_TIMEOUT", "120"))
MODULE_TIMEOUT = int(os.environ.get("RDMA_CORE_MODULE_TIMEOUT", "1200"))

# The child: imports the suite as run_tests.py does (args_parser first, then the package) and
# runs one module with a result class that prints a JSON line per test as it ends.
CHILD = r"""
import json, signal, sys, unittest
tests_dir, dev, module, test_timeout = sys.argv[1:5]
test_timeout = int(test_timeout)

def timed_out(signum, frame):
    raise TimeoutError(f'test timed out after {test_timeout} s')
signal.signal(signal.SIGALRM, timed_out)
sys.path[:0] = [tests_dir, tests_dir + '/..']
sys.argv = ['run_tests.py', '--dev', dev]
from args_parser import parser
parser.parse_args()
import tests
mod = getattr(tests, module)

def emit(outcome, test, detail=''):
    detail = ' '.join(str(detail).strip().splitlines()[-1:])[:300]
    print(json.dumps([outcome, test.id(), detail]), flush=True)

class Result(unittest.TestResult):
    def startTest(self, test):
        super().startTest(test)
        print(json.dumps(['start', test.id(), '']), flush=True)
        signal.alarm(test_timeout)
    def stopTest(self, test):
        signal.alarm(0)
        super().stopTest(test)
    def addSuccess(self, test): emit('pass', test)
    def addFailure(self, test, err): emit('fail', test, self._exc_info_to_string(err, test))
    def addError(self, test, err):
        # setUpClass/module failures come as a _ErrorHolder, not a TestCase.
        if isinstance(test, unittest.TestCase):
            emit('error', test, self._exc_info_to_string(err, test))
        else:
            print(json.dumps(['error', str(test), str(err[1])[:300]]), flush=True)
    def addSkip(self, test, reason): emit('skip', test, reason)
    def addExpectedFailure(self, test, err): emit('xfail', test)
    def addUnexpectedSuccess(self, test): emit('xpass', test)
    def addSubTest(self, test, sub, err):
        if err is not None:
            kind = 'fail' if issubclass(err[0], test.failureException) else 'error'
            emit(kind, sub, self._exc_info_to_string(err, test))

suite = unittest.defaultTestLoader.loadTestsFromModule(mod)
suite.run(Result())
"""


def run_module(tests_dir, dev, module, out):
    """Runs one module; returns its (outcome, id, detail) rows."""
    rows, started, ended = [], None, set()
    try:
        p = subprocess.run(
            [sys.executable, "-c", CHILD, tests_dir, dev, module, str(TEST_TIMEOUT)],
            capture_output=True, text=True, timeout=MODULE_TIMEOUT)
        stdout, status = p.stdout, p.returncode
        stderr = p.stderr
    except subprocess.TimeoutExpired as t:
        stdout = t.stdout.decode() if isinstance(t.stdout, bytes) else (t.stdout or "")
        stderr = ""
        status = "timeout"
    for line in stdout.splitlines():
        try:
            outcome, test, detail = json.loads(line)
        except ValueError:
            continue
        if outcome == "start":
            started = test
            continue
        # A test whose subtests failed still ends with addSuccess: keep its worst row only.
        ended.add(test)
        rows.append((outcome, test, detail))
    if started is not None and started not in ended:
        why = "timed out" if status == "timeout" else f"crashed (exit status {status})"
        rows.append(("error", started, why))
    elif status not in (0,) and not rows:
        last = (stderr.strip().splitlines() or [""])[-1][:300]
        rows.append(("error", f"tests.{module}", f"module failed (exit status {status}): {last}"))
    # One row per test: a failed subtest outranks the test's own success.
    rank = {"error": 0, "fail": 1, "xpass": 2, "pass": 3, "xfail": 4, "skip": 5}
    best = {}
    for outcome, test, detail in rows:
        key = test.split(" ")[0]
        if key not in best or rank[outcome] < rank[best[key][0]]:
            best[key] = (outcome, key, detail)
    for row in best.values():
        out.write("\t".join(row) + "\n")
    out.flush()
    return list(best.values())


def main():
    tests_dir, dev, out_path = sys.argv[1:4]
    modules = sys.argv[4:] or sorted(
        f[:-3] for f in os.listdir(tests_dir) if f.startswith("test_") and f.endswith(".py"))
    counts = {}
    with open(out_path, "w") as out:
        for module in modules:
            for outcome, _, _ in run_module(tests_dir, dev, module, out):
                counts[outcome] = counts.get(outcome, 0) + 1
    print(f"{dev}: " + ", ".join(f"{counts.get(k, 0)} {k}" for k in
                                 ("pass", "fail", "error", "skip", "xfail", "xpass")))


if __name__ == "__main__":
    main()
