"""``replaysafe-pg metrics``: the rows of ``replaysafe.metrics()`` as Prometheus text (the
mapping itself without a database), what each kind of login sees, ``--serve`` over HTTP
in a subprocess, the refusal of a non-loopback address, and docs/operability.md's examples."""

from __future__ import annotations

import re
import select
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import click
import psycopg
import pytest
import test_cli_docs
from helpers.cli import assert_one_line_error, console_script, run, run_json, script_env
from helpers.db import bind, bind_to_all_tenants, dsn_as
from prometheus_client.parser import text_string_to_metric_families

from replaysafe_pg import Ledger
from replaysafe_pg.cli.metrics_commands import (
    ListenAddress,
    ListenAddressType,
    MetricRow,
    exposition,
    is_loopback,
)

Sample = tuple[str, tuple[tuple[str, str], ...], float]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Each sample of an exposition, by name and sorted labels."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


# --- rows -> exposition, no database -----------------------------------------------------------

ROWS = [
    MetricRow("replaysafe_actions", "A", "running", 2),
    MetricRow("replaysafe_actions", "A", "unknown", 1),
    MetricRow("replaysafe_actions", None, "succeeded", 120),
    MetricRow("replaysafe_unresolved_actions", "A", None, 1),
    MetricRow("replaysafe_oldest_unresolved_age_seconds", "A", None, 61.5),
    MetricRow("replaysafe_threads", None, None, 7),
]


def test_each_row_is_a_gauge_sample_with_the_labels_it_has() -> None:
    text = exposition(ROWS).decode()
    assert samples(text) == {
        ("replaysafe_actions", (("state", "running"), ("tenant", "A"))): 2,
        ("replaysafe_actions", (("state", "unknown"), ("tenant", "A"))): 1,
        ("replaysafe_actions", (("state", "succeeded"),)): 120,
        ("replaysafe_unresolved_actions", (("tenant", "A"),)): 1,
        ("replaysafe_oldest_unresolved_age_seconds", (("tenant", "A"),)): 61.5,
        ("replaysafe_threads", ()): 7,
        ("replaysafe_up", ()): 1,
    }
    types = re.findall(r"^# TYPE (\w+) (\w+)$", text, re.MULTILINE)
    assert types == [(name, "gauge") for name in (
        "replaysafe_actions", "replaysafe_unresolved_actions",
        "replaysafe_oldest_unresolved_age_seconds", "replaysafe_threads", "replaysafe_up")]


def test_help_says_what_is_counted_and_what_is_an_estimate() -> None:
    helps = dict(re.findall(r"^# HELP (\w+) (.*)$", exposition(ROWS).decode(), re.MULTILINE))
    assert "succeeded and failed are planner estimates" in helps["replaysafe_actions"]
    assert "estimate" in helps["replaysafe_threads"]
    assert "(exact)" in helps["replaysafe_unresolved_actions"]
    assert "0 when there is none" in helps["replaysafe_oldest_unresolved_age_seconds"]


def test_without_the_tenant_label_and_when_the_query_failed() -> None:
    text = exposition(ROWS, tenant_label=False).decode()
    assert "tenant=" not in text
    failed = samples(exposition([], up=False).decode())
    assert failed == {("replaysafe_up", ()): 0}


def test_a_metric_of_a_newer_schema_is_shown_and_label_values_are_escaped() -> None:
    rows = [MetricRow("replaysafe_something_new", 'a"b\n\x1b[31m', None, 3)]
    text = exposition(rows).decode()
    assert "# HELP replaysafe_something_new replaysafe.metrics() row" in text
    assert "\x1b" not in text
    ((_name, labels),) = [k for k in samples(text) if k[0] == "replaysafe_something_new"]
    assert labels == (("tenant", 'a"b\\n\\x1b[31m'),)


@pytest.mark.parametrize(("text", "address"), [
    ("9187", ListenAddress("127.0.0.1", 9187)),
    ("127.0.0.1:0", ListenAddress("127.0.0.1", 0)),
    ("localhost:9187", ListenAddress("localhost", 9187)),
    ("[::1]:9187", ListenAddress("::1", 9187)),
    ("0.0.0.0:9187", ListenAddress("0.0.0.0", 9187)),
    (":9187", ListenAddress("", 9187)),
])
def test_listen_addresses(text: str, address: ListenAddress) -> None:
    assert ListenAddressType().convert(text, None, None) == address


@pytest.mark.parametrize("text", ["host", "::1:9187", "[::1]9187", "h:99999", "h:port"])
def test_listen_addresses_refused(text: str) -> None:
    with pytest.raises(click.BadParameter):
        ListenAddressType().convert(text, None, None)


def test_loopback_hosts() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "localhost", "LOCALHOST"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "", "::", "10.0.0.1", "example.com"))


# --- a seeded database ---------------------------------------------------------------------------

def seed(dsn: str) -> None:
    """Tenant A: two unknown actions and a live one; tenant B: one succeeded, one expired
    lease."""
    with Ledger(dsn, tenant_id="A", worker_id="w") as led:
        for key in ("u1", "u2"):
            led.mark_unknown(led.claim(key, "refund", {}), {"reason": "timeout"})
        led.claim("live", "refund", {}, lease=timedelta(hours=1))
    with Ledger(dsn, tenant_id="B", worker_id="w") as led:
        led.complete(led.claim("done", "refund", {}), {"ok": True})
        led.claim("expired", "refund", {}, lease=timedelta(seconds=1))
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pg_sleep(1.1)")
        # Statistics, as autovacuum keeps them: the estimates need them.
        c.execute("ANALYZE replaysafe.actions, replaysafe.threads")


def metrics_of(dsn: str, *options: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    result = run("metrics", *options, dsn=dsn)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return samples(result.stdout)


def tenants_in(found: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> set[str]:
    return {value for (_name, labels) in found for key, value in labels if key == "tenant"}


def test_a_worker_bound_to_a_sees_only_a(dsn: str, make_role: Any) -> None:
    seed(dsn)
    worker = make_role("replaysafe_worker")
    bind(dsn, worker, "A")
    found = metrics_of(dsn_as(dsn, worker))
    assert tenants_in(found) == {"A"}
    assert found["replaysafe_actions", (("state", "unknown"), ("tenant", "A"))] == 2
    assert found["replaysafe_actions", (("state", "running"), ("tenant", "A"))] == 1
    assert found["replaysafe_unresolved_actions", (("tenant", "A"),)] == 2
    assert found["replaysafe_expired_leases", (("tenant", "A"),)] == 0
    assert found["replaysafe_up", ()] == 1
    # Another tenant asked for: nothing of it (the function shows only A).
    other = metrics_of(dsn_as(dsn, worker), "--tenant", "B")
    assert tenants_in(other) == set()


def test_an_all_tenant_auditor_sees_both_and_one_tenant_with_tenant(dsn: str,
                                                                    make_role: Any) -> None:
    seed(dsn)
    auditor = make_role("replaysafe_auditor")
    bind_to_all_tenants(dsn, auditor)
    found = metrics_of(dsn_as(dsn, auditor))
    assert tenants_in(found) == {"A", "B"}
    assert found["replaysafe_expired_leases", (("tenant", "B"),)] == 1
    assert found["replaysafe_unresolved_actions", (("tenant", "B"),)] == 1
    assert found["replaysafe_oldest_unresolved_age_seconds", (("tenant", "B"),)] > 0
    # Estimates of an all-tenant caller are totals, without a tenant.
    assert ("replaysafe_actions", (("state", "succeeded"),)) in found
    only_b = metrics_of(dsn_as(dsn, auditor), "--tenant", "B")
    assert tenants_in(only_b) == {"B"}
    assert ("replaysafe_actions", (("state", "succeeded"),)) not in only_b


def test_totals_without_the_tenant_label(dsn: str, make_role: Any) -> None:
    seed(dsn)
    operator = make_role("replaysafe_operator")
    bind_to_all_tenants(dsn, operator)
    found = metrics_of(dsn_as(dsn, operator), "--no-tenant-label")
    assert tenants_in(found) == set()
    assert found["replaysafe_actions", (("state", "unknown"),)] == 2
    assert found["replaysafe_actions", (("state", "running"),)] == 2
    assert found["replaysafe_unresolved_actions", ()] == 3
    assert found["replaysafe_expired_leases", ()] == 1
    # One tenant's rows without its label.
    only_a = metrics_of(dsn_as(dsn, operator), "--no-tenant-label", "--tenant", "A")
    assert only_a["replaysafe_unresolved_actions", ()] == 2


def test_json_prints_the_rows(dsn: str) -> None:
    seed(dsn)
    rows = run_json("metrics", "--tenant", "A", dsn=dsn)
    assert {"name": "replaysafe_actions", "tenant_id": "A", "state": "unknown",
            "value": 2.0} in rows
    assert {r["tenant_id"] for r in rows} == {"A"}


def test_a_role_acting_for_no_tenant_is_refused(dsn: str, make_role: Any) -> None:
    unbound = make_role("replaysafe_auditor")
    assert_one_line_error(run("metrics", dsn=dsn_as(dsn, unbound)))


# --- --serve -----------------------------------------------------------------------------------

class Served:
    def __init__(self, proc: subprocess.Popen[str], url: str, stderr: list[str]) -> None:
        self.proc, self.url, self.stderr = proc, url, stderr

    def get(self, path: str = "/metrics") -> tuple[int, str, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as answer:
                return answer.status, answer.headers["Content-Type"], answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers["Content-Type"], exc.read().decode()

    def stop(self, signum: int = signal.SIGTERM) -> tuple[int, str]:
        self.proc.send_signal(signum)
        _out, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, "".join(self.stderr) + err


def serve(dsn: str, *options: str, address: str = "127.0.0.1:0") -> Served:
    """``replaysafe-pg metrics --serve ADDRESS`` in a subprocess, once it says where it
    listens."""
    proc = subprocess.Popen([console_script(), "--dsn", dsn, "metrics", "--serve", address,
                             *options], env=script_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines: list[str] = []
    while True:
        ready, _, _ = select.select([proc.stderr], [], [], 60)
        line = proc.stderr.readline() if ready else ""
        if not line:
            proc.kill()
            raise AssertionError(f"--serve did not start: {''.join(lines)}{proc.stderr.read()}")
        lines.append(line)
        found = re.search(r"serving metrics on (http://\S+)/metrics", line)
        if found:
            return Served(proc, found.group(1), lines)


@pytest.fixture
def served() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait(timeout=10)


def test_serve_answers_each_scrape_and_stops_on_sigterm(dsn: str, make_role: Any,
                                                        served: list[Served]) -> None:
    seed(dsn)
    worker = make_role("replaysafe_worker")
    bind(dsn, worker, "A")
    s = serve(dsn_as(dsn, worker))
    served.append(s)
    assert s.url.startswith("http://127.0.0.1:")
    status, content_type, body = s.get()
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    found = samples(body)
    assert tenants_in(found) == {"A"} and found["replaysafe_up", ()] == 1
    assert found["replaysafe_actions", (("state", "unknown"), ("tenant", "A"))] == 2
    # Each scrape reads anew.
    with Ledger(dsn, tenant_id="A", worker_id="w") as led:
        led.mark_unknown(led.claim("u3", "refund", {}), {"reason": "timeout"})
    assert samples(s.get()[2])["replaysafe_actions", (("state", "unknown"), ("tenant", "A"))] == 3
    assert s.get("/")[0] == 200
    assert s.get("/elsewhere")[0] == 404
    # A scrape whose query fails: HTTP 500, replaysafe_up 0, one line on stderr.
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f'REVOKE replaysafe_worker FROM "{worker}"')
    status, _type, body = s.get()
    assert status == 500 and samples(body) == {("replaysafe_up", ()): 0}
    code, err = s.stop()
    assert code == 0, err
    assert "scrape failed" in err and "stopped serving metrics" in err
    assert "Traceback" not in err


def test_serve_stops_on_ctrl_c_with_status_130(dsn: str, served: list[Served]) -> None:
    s = serve(dsn, "--no-tenant-label", address="localhost:0")
    served.append(s)
    assert s.get()[0] == 200
    code, err = s.stop(signal.SIGINT)
    assert code == 130, err
    assert "Traceback" not in err and "Aborted" not in err


def test_serve_beyond_loopback_is_refused_without_the_flag(dsn: str) -> None:
    for address in ("0.0.0.0:0", ":0", "[::]:0", "example.com:9187"):
        result = run("metrics", "--serve", address, dsn=dsn)
        assert_one_line_error(result, "not a loopback address", "--allow-non-loopback")


def test_serve_beyond_loopback_warns_with_the_flag(dsn: str, served: list[Served]) -> None:
    s = serve(dsn, "--allow-non-loopback", address="0.0.0.0:0")
    served.append(s)
    assert any("warning" in line and "no authentication" in line for line in s.stderr), s.stderr
    port = s.url.rsplit(":", 1)[1]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        assert answer.status == 200
    assert s.stop()[0] == 0


def test_serve_refuses_json_and_an_address_in_use(dsn: str, served: list[Served]) -> None:
    assert_one_line_error(run("--json", "metrics", "--serve", "127.0.0.1:0", dsn=dsn), "--json")
    s = serve(dsn)
    served.append(s)
    port = s.url.rsplit(":", 1)[1]
    assert_one_line_error(run("metrics", "--serve", f"127.0.0.1:{port}", dsn=dsn),
                          "cannot listen on 127.0.0.1:")


# --- docs/operability.md's examples ------------------------------------------------------------

OPERABILITY = Path(__file__).resolve().parents[2] / "docs" / "operability.md"


def _docs_blocks() -> list[Any]:
    return [b for b in test_cli_docs.parse(OPERABILITY) if b.skip is None]


# docs/cli.md's fixture ``place`` (the databases and directories of one block), used here too.
place = test_cli_docs.place


@pytest.mark.parametrize("block", _docs_blocks(), ids=lambda b: b.id)
def test_operability_docs_example_runs_as_shown(block: Any, place: Any) -> None:
    """Each example of docs/operability.md runs as docs/cli.md's do (test_cli_docs.py)."""
    test_cli_docs.test_docs_example_runs_as_shown(block, place)


def test_operability_docs_keep_few_examples_out() -> None:
    skipped = [b for b in test_cli_docs.parse(OPERABILITY) if b.skip is not None]
    assert len(skipped) <= 4, [b.id for b in skipped]
    assert all(len(b.skip or "") > 10 for b in skipped), [(b.id, b.skip) for b in skipped]
    assert _docs_blocks(), "docs/operability.md shows no example that runs"
