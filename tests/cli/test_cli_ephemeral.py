"""``--ephemeral`` killed by SIGTERM at any point leaves neither its /tmp/replaysafe-pg-*
directory nor its postmaster behind (a real console-script process, real signals)."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from helpers.cli import console_script, script_env

from replaysafe_pg import embedded

_DATA_IN = re.compile(r"data in (/tmp/replaysafe-pg-[^/\s]+)/pgdata\)")


def postmasters_of(pgdata: Path) -> list[int]:
    found = []
    for proc in psutil.process_iter(attrs=["name", "cmdline"]):
        if proc.info["name"] == "postgres" and str(pgdata) in (proc.info["cmdline"] or []):
            found.append(proc.pid)
    return found


class Ephemeral:
    """One ``replaysafe-pg --ephemeral ...`` process, with what it created."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([console_script(), "--ephemeral", *args], env=script_env(),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.tmpdir: Path | None = None

    def wait_for_start(self) -> Path:
        """Until the command says where its server lives (it is starting it now)."""
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            found = _DATA_IN.search(line)
            if found:
                self.tmpdir = Path(found.group(1))
                return self.tmpdir
        raise AssertionError("the command never started an embedded server")

    def wait_for_stdout(self, text: str) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if text in line:
                return
        raise AssertionError(f"the command never printed {text!r}")

    def terminate_and_wait(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.tmpdir is not None:
            for pid in postmasters_of(self.tmpdir / "pgdata"):
                embedded.stop_pid(pid, timeout=5)
            shutil.rmtree(self.tmpdir, ignore_errors=True)


@pytest.fixture
def ephemeral() -> Iterator[list[Ephemeral]]:
    started: list[Ephemeral] = []
    yield started
    for e in started:
        e.cleanup()


def _left_behind(tmpdir: Path) -> list[str]:
    return ([f"directory {tmpdir}"] if tmpdir.exists() else []) + [
        f"postmaster {pid}" for pid in postmasters_of(tmpdir / "pgdata")]


def _postmaster_status(pgdata: Path) -> str | None:
    """The status line of postmaster.pid: starting, ready, stopping (None: no file yet)."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except OSError:
        return None
    return lines[7].strip() if len(lines) > 7 else ""


def _wait_until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


# The phases of a command's life on a throwaway server, each caught as it happens.
PHASES: dict[str, Callable[[Path], bool]] = {
    "initdb": lambda pgdata: True,  # right after the "starting embedded Postgres" notice
    "postmaster starting": lambda pgdata: _postmaster_status(pgdata) is not None,
    "postmaster stopping": lambda pgdata: _postmaster_status(pgdata) == "stopping",
}


@pytest.mark.parametrize("phase", list(PHASES))
def test_sigterm_in_every_phase_leaks_nothing(ephemeral: list[Ephemeral], phase: str) -> None:
    e = Ephemeral("migrate", "current")
    ephemeral.append(e)
    tmpdir = e.wait_for_start()
    _wait_until(lambda: PHASES[phase](tmpdir / "pgdata"), phase)
    status = e.terminate_and_wait()
    assert status in (0, 128 + signal.SIGTERM), status
    assert _left_behind(tmpdir) == []


def test_demo_ephemeral_sigterm_during_shutdown_leaks_nothing(ephemeral: list[Ephemeral]) -> None:
    e = Ephemeral("demo", "--lease", "0.5")
    ephemeral.append(e)
    tmpdir = e.wait_for_start()
    e.wait_for_stdout("unresolved_actions:")  # the demo's last line
    _wait_until(lambda: _postmaster_status(tmpdir / "pgdata") == "stopping", "shutdown")
    status = e.terminate_and_wait()
    assert status in (0, 128 + signal.SIGTERM), status
    assert _left_behind(tmpdir) == []
