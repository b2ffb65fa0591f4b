"""Ctrl-C at any moment: real ``python -m flopscope`` processes and real SIGINTs, sent at known
points of the command (while the command line imports, while torch imports and initialises its
extension, while the model counts) and twice within 50 ms to a zoo with worker processes (what
``timeout -s INT`` and an impatient Ctrl-C send). Every time: exit 130 and one line on stderr,
never a traceback, never a death by signal (-2) and never exit 0.

Each point is found without guessing at timings: a ``sitecustomize`` put first on the child's
path writes a file when a named module starts to import (the slow model's forward writes one when
it starts), and the test sends SIGINT once that file exists.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.cli.conftest import FIXTURES

import flopscope

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

SLOW = f"{FIXTURES / 'tiny_models.py'}:slow"  # its forward sleeps for a minute

MARK_IMPORT = '''\
import os
import sys


class _Mark:
    """Writes FLOPSCOPE_TEST_MARK_FILE when the module FLOPSCOPE_TEST_MARK starts to import."""

    def find_spec(self, name, path=None, target=None):
        if name == os.environ.get("FLOPSCOPE_TEST_MARK"):
            sys.meta_path.remove(self)
            with open(os.environ["FLOPSCOPE_TEST_MARK_FILE"], "w"):
                pass
        return None


sys.meta_path.insert(0, _Mark())
'''


def _interrupt(tmp_path: Path, argv: list[str], *, at: str, after: float = 0.0,
               again_after: float | None = None) -> tuple[int, str, str]:
    """Run ``python -m flopscope ARGV``; send SIGINT ``after`` seconds after it reaches ``at``
    (a module's import, or ``"forward"``: the slow model's forward), and a second one
    ``again_after`` seconds later. Returns (exit code, stdout, stderr)."""
    (tmp_path / "sitecustomize.py").write_text(MARK_IMPORT, encoding="utf-8")
    mark = tmp_path / "reached"
    src = str(Path(flopscope.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), src, os.environ.get("PYTHONPATH", "")])}
    env.pop("FLOPSCOPE_TRACEBACK", None)
    env["FLOPSCOPE_TEST_FORWARD_MARK" if at == "forward" else "FLOPSCOPE_TEST_MARK"] = str(mark)
    env["FLOPSCOPE_TEST_MARK"] = "" if at == "forward" else at
    env["FLOPSCOPE_TEST_MARK_FILE"] = str(mark)
    process = subprocess.Popen([sys.executable, "-m", "flopscope", *argv], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not mark.exists():
        assert process.poll() is None, f"the command ended before it reached {at}"
        assert time.monotonic() < deadline, f"the command did not reach {at}"
        time.sleep(0.002)
    time.sleep(after)
    assert process.poll() is None, "the command ended before it was interrupted"
    process.send_signal(signal.SIGINT)
    if again_after is not None:
        time.sleep(again_after)
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    return process.returncode, out, err


@pytest.mark.parametrize(("at", "after"), [
    ("flopscope.cli", 0.0),  # the command line's own imports (a traceback and -2 before)
    ("torch", 0.0),  # torch's import starts
    ("torch._C", 0.0),  # torch's extension initialises
    ("torch._C", 0.5),  # the rest of torch's import
    ("forward", 0.0),  # counting
])
def test_count_interrupted_at_any_moment(tmp_path: Path, at: str, after: float) -> None:
    code, out, err = _interrupt(tmp_path, ["count", SLOW], at=at, after=after)
    assert (code, err) == (130, "flopscope: interrupted\n"), (code, err)
    assert out == ""


@pytest.mark.parametrize("after", [1.0, 3.0])
def test_zoo_with_workers_interrupted_twice(tmp_path: Path, after: float) -> None:
    """Two SIGINTs 50 ms apart while the worker processes start and count: a 13-line traceback,
    or death by SIGINT (-2) after the one line, before."""
    pytest.importorskip("torchvision")
    code, _, err = _interrupt(tmp_path, ["zoo", "torchvision", "--jobs", "2"],
                              at="torchvision.models", after=after, again_after=0.05)
    assert code == 130, err
    assert err.count("\n") == 1 and err.startswith("flopscope: interrupted"), err
