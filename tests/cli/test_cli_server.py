"""``replaysafe-pg server``: a long-lived embedded Postgres for the user's own code, through
the installed console script (the server must outlive the command that started it), and the
README's Python example run as written against it."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
import sqlalchemy
from click.testing import Result
from helpers.cli import console_script, run, script_env

from replaysafe_pg import embedded, schema

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, pgdata: Path, timeout: float = 120,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # capture_output reads stdout to its end: a postmaster that inherited the pipe would hold
    # it open and this call would time out, as `$(replaysafe-pg server start)` would hang.
    return subprocess.run([console_script(), *args, "--pgdata", str(pgdata)],
                          env=script_env(**(env or {})), capture_output=True, text=True,
                          timeout=timeout)


def srv(*args: str, pgdata: Path) -> Result:
    """In-process (faster): for everything but the first start, whose detachment matters."""
    return run(*args, "--pgdata", str(pgdata))


def kill_postmasters(pgdata: Path) -> None:
    for pid in embedded.postmasters_of(pgdata):
        embedded.stop_pid(pid, timeout=5)


@pytest.fixture(scope="module")
def pgdata() -> Iterator[Path]:
    """A data directory for this module's server (short, under /tmp: the unix socket lives
    in it); its postmaster is stopped by PID afterwards, whatever the tests did."""
    top = Path(tempfile.mkdtemp(prefix="rs-srv-", dir="/tmp"))
    try:
        yield top / "pg"
    finally:
        kill_postmasters(top / "pg")
        shutil.rmtree(top, ignore_errors=True)


def test_start_prints_only_the_dsn_and_the_server_outlives_the_command(pgdata: Path) -> None:
    started = cli("server", "start", pgdata=pgdata)
    assert started.returncode == 0, started.stderr
    lines = started.stdout.splitlines()
    assert len(lines) == 1, started.stdout
    dsn = lines[0]
    assert dsn.startswith("postgresql://") and "host=" in dsn
    assert "starting embedded Postgres" in started.stderr
    state = json.loads((pgdata / embedded.STATE_FILE).read_text())
    assert psutil.pid_exists(state["pid"]) and state["dsn"] == dsn
    # The command is gone, the server is not; it is migrated and takes the DSN as printed.
    assert schema.current_revision(dsn) == schema.head_revision()
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT current_setting('data_directory')").fetchone() == (
            str(pgdata),)


def test_start_again_prints_the_same_dsn_and_starts_nothing(pgdata: Path) -> None:
    first = srv("server", "start", pgdata=pgdata)
    again = srv("server", "start", pgdata=pgdata)
    assert (first.exit_code, again.exit_code) == (0, 0), again.stderr
    assert first.stdout == again.stdout
    assert "starting" not in again.stderr
    assert len(embedded.postmasters_of(pgdata)) >= 1
    assert embedded.server_status(pgdata).pid == json.loads(
        (pgdata / embedded.STATE_FILE).read_text())["pid"]


def test_url_and_status_of_a_running_server(pgdata: Path) -> None:
    dsn = srv("server", "start", pgdata=pgdata).stdout.strip()
    url = srv("server", "url", pgdata=pgdata)
    assert (url.exit_code, url.stdout) == (0, dsn + "\n")
    status = srv("server", "status", pgdata=pgdata)
    assert status.exit_code == 0, status.stderr
    pid = embedded.server_status(pgdata).pid
    assert re.search(r"^status\s+running$", status.stdout, re.M)
    assert re.search(rf"^pid\s+{pid}$", status.stdout, re.M)
    assert re.search(rf"^data dir\s+{re.escape(str(pgdata))}$", status.stdout, re.M)
    assert re.search(rf"^dsn\s+{re.escape(dsn)}$", status.stdout, re.M)
    as_json = json.loads(srv("server", "status", "--json", pgdata=pgdata).stdout)
    assert (as_json["running"], as_json["pid"], as_json["dsn"]) == (True, pid, dsn)


def test_the_dsn_works_for_psycopg_and_sqlalchemy_as_printed(pgdata: Path) -> None:
    dsn = srv("server", "start", pgdata=pgdata).stdout.strip()
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    urls = [dsn.replace("postgresql://", "postgresql+psycopg://", 1)]
    try:
        import psycopg2  # noqa: F401  # what postgresql:// means to SQLAlchemy 2
        urls.append(dsn)
    except ImportError:
        pass
    for url in urls:
        engine = sqlalchemy.create_engine(url)
        try:
            with engine.connect() as conn:
                assert conn.exec_driver_sql("SELECT replaysafe.installed_revision()").scalar() \
                    == schema.head_revision()
        finally:
            engine.dispose()


def test_other_commands_leave_the_server_running(pgdata: Path) -> None:
    srv("server", "start", pgdata=pgdata)
    pid = embedded.server_status(pgdata).pid
    audit = srv("audit", pgdata=pgdata)  # no DSN: the embedded server of --pgdata
    assert audit.exit_code == 0, audit.stderr
    assert embedded.server_status(pgdata).pid == pid


def test_readme_example_runs_as_written_against_the_server(pgdata: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    example = re.search(r"```python\n(.*?)```", readme, re.S)
    assert example, "README has no python example"
    code = example.group(1)
    first = code.splitlines()[0]
    assert first.startswith("# export REPLAYSAFE_DSN=$(replaysafe-pg server start)"), first
    script = (f'export REPLAYSAFE_PGDATA={pgdata}\n{first.removeprefix("# ")}\n'
              f'"{sys.executable}" -c "$EXAMPLE" && "{sys.executable}" -c "$EXAMPLE"\n')
    env = script_env(EXAMPLE=code, PATH=f"{Path(console_script()).parent}:{os.environ['PATH']}")
    done = subprocess.run(["bash", "-euc", script], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert [line for line in out if line.startswith("refunding")] == [out[0]], out
    assert out[1].endswith("(ran now)") and out[2].endswith("(replayed)"), out
    assert ast.literal_eval(out[1].removesuffix(" (ran now)")) == ast.literal_eval(
        out[2].removesuffix(" (replayed)")) == {"refund_id": "re_o_42", "amount": 1299}


def test_stop_is_idempotent_and_then_status_and_url_say_not_running(pgdata: Path) -> None:
    dsn = srv("server", "start", pgdata=pgdata).stdout.strip()
    pid = embedded.server_status(pgdata).pid
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS kept (n int)")
    stopped = srv("server", "stop", pgdata=pgdata)
    assert stopped.exit_code == 0, stopped.stderr
    assert stopped.stdout.strip() == f"stopped the server of {pgdata} (pid {pid})"
    assert pid is not None and not psutil.pid_exists(pid)
    assert not (pgdata / embedded.STATE_FILE).exists()
    again = srv("server", "stop", pgdata=pgdata)
    assert (again.exit_code, again.stdout.strip()) == (0, f"not running: {pgdata}")
    status = srv("server", "status", pgdata=pgdata)
    assert (status.exit_code, status.stdout.strip()) == (1, f"not running: {pgdata}")
    url = srv("server", "url", pgdata=pgdata)
    assert url.exit_code == 2 and url.stdout == ""
    assert url.stderr.startswith("replaysafe-pg: error: no server running on ")
    # Started again: the data was kept.
    restarted = srv("server", "start", pgdata=pgdata)
    assert restarted.exit_code == 0, (restarted.output, restarted.exception)
    dsn = restarted.stdout.strip()
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT to_regclass('kept') IS NOT NULL").fetchone() == (True,)


def test_a_state_file_of_a_dead_server_is_reported_stale_and_removed(pgdata: Path) -> None:
    srv("server", "stop", pgdata=pgdata)
    pgdata.mkdir(parents=True, exist_ok=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (pgdata / embedded.STATE_FILE).write_text(json.dumps({"pid": dead.pid, "dsn": "x"}))
    status = srv("server", "status", pgdata=pgdata)
    assert status.exit_code == 1
    assert f"its state file named pid {dead.pid}, which is gone: removed" in status.stdout
    assert not (pgdata / embedded.STATE_FILE).exists()


def test_a_reused_pid_in_postmaster_pid_is_not_taken_for_the_server(pgdata: Path) -> None:
    srv("server", "stop", pgdata=pgdata)
    # After a crash, postmaster.pid may name a pid that another process got since.
    (pgdata / "postmaster.pid").write_text(f"{os.getpid()}\n{pgdata}\n0\n5432\n{pgdata}\n\n\n")
    try:
        assert not embedded.server_status(pgdata).running
        assert srv("server", "url", pgdata=pgdata).exit_code == 2
    finally:
        (pgdata / "postmaster.pid").unlink()


def test_server_refuses_ephemeral(pgdata: Path) -> None:
    result = srv("server", "start", "--ephemeral", pgdata=pgdata)
    assert result.exit_code == 2 and "--ephemeral makes no sense" in result.stderr
