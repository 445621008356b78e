"""The demo and the embedded default, through the installed console script and in-process."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

import psutil
import psycopg
from helpers.cli import console_script, run, script_env

from replaysafe_pg import embedded, schema


def test_installed_console_script_demo_shows_one_refund_with_the_ledger_two_without(dsn: str) -> None:
    proc = subprocess.run([console_script(), "demo", "--dsn", dsn], env=script_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "RESULT with the ledger: 1 refund(s) for order o_42" in out
    assert "RESULT without the ledger: 2 refund(s) for order o_42" in out
    assert "SIGKILL worker-1" in out
    assert "ledger claim -> unknown" in out and "refund_order is NOT run again" in out
    assert "unresolved_actions: 0 row(s); multi_effect_actions: 0 row(s)" in out
    assert "Traceback" not in proc.stderr
    assert _agent_processes() == []


def _agent_processes() -> list[int]:
    found = []
    for p in psutil.process_iter(attrs=["pid", "cmdline"]):
        if "replaysafe_pg.cli.demo_agent" in " ".join(p.info["cmdline"] or []):
            found.append(p.info["pid"])
    return found


def test_demo_interrupted_by_sigterm_leaves_no_worker_behind(dsn: str) -> None:
    proc = subprocess.Popen([console_script(), "demo", "--dsn", dsn], env=script_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "resumes the thread" in line:  # worker-2 is alive, waiting for the lease
                break
        else:
            raise AssertionError(proc.stderr.read() if proc.stderr else "no output")
        assert _agent_processes(), "worker-2 should be running now"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _agent_processes() == []


def test_demo_json_report_and_what_it_leaves_in_the_database(dsn: str) -> None:
    result = run("--json", "demo", dsn=dsn)
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["with_ledger"]["refunds"] == 1
    assert report["without_ledger"]["refunds"] == 2
    action = report["audit"]["action"]
    assert (action["state"], action["attempt"]) == ("succeeded", 1)
    assert action["provider_reference"] == report["with_ledger"]["refund_ids"][0]
    assert [a["outcome"] for a in report["audit"]["attempts"]] == ["unknown"]
    with psycopg.connect(dsn) as conn:
        # Only the ledger run touched the ledger: the naive run has no action.
        assert conn.execute("SELECT count(*), min(state::text) FROM replaysafe.actions "
                            "WHERE tenant_id = 'demo'").fetchone() == (1, "succeeded")


def test_embedded_pgdata_is_initialised_migrated_kept_and_the_server_stopped(tmp_path: Path) -> None:
    pgdata = tmp_path / "pg"
    result = run("--pgdata", str(pgdata), "migrate", "current")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == f"{schema.head_revision()} (head)"
    assert "starting embedded Postgres" in result.stderr
    assert (pgdata / "PG_VERSION").exists()
    assert embedded.running_pid(pgdata) is None  # we started it, so we stopped it


def test_ephemeral_server_is_stopped_and_deleted() -> None:
    result = run("--ephemeral", "--json", "doctor")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["ok"] is True
    found = re.search(r"data in (\S+)\)", result.stderr)
    assert found, result.stderr
    assert not Path(found.group(1)).exists()
