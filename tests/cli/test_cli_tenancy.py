"""A command run by a role that acts for no tenant says so (exit 2) instead of succeeding on
nothing; doctor names the auditor logins bound to no tenant, and how to let one read every
tenant; the upgrade to the revision that ended implicit all-tenant reading names them too."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import psycopg
import pytest
from helpers.cli import assert_one_line_error, run
from helpers.db import bind, dsn_as

import replaysafe_pg
from replaysafe_pg import Ledger
from replaysafe_pg.cli.migrate_commands import offline_sql


def _seed(dsn: str) -> None:
    led = Ledger(dsn, tenant_id="A")
    try:
        claim = led.claim("k", "refund", {"order": 1}, lease=timedelta(seconds=30))
        led.mark_unknown(claim, {"reason": "timeout"})
    finally:
        led.close()


TENANT_COMMANDS = [
    ("actions", "list"), ("audit",), ("sweep",), ("purge", "--older-than", "1d", "--yes"),
    ("actions", "show", "k", "--tenant", "A"), ("threads", "show", "t", "--tenant", "A"),
]


@pytest.mark.parametrize("command", TENANT_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_role_that_acts_for_no_tenant_is_told_so(dsn: str, make_role: Callable[..., str],
                                                   command: tuple[str, ...]) -> None:
    _seed(dsn)
    role = make_role("replaysafe_operator", "replaysafe_auditor", "replaysafe_worker")
    result = run(*command, dsn=dsn_as(dsn, role))
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert_one_line_error(result, f"{role} acts for no tenant", "bind_role_to_all_tenants")


def test_a_bound_role_and_an_all_tenant_role_run_them(dsn: str,
                                                      make_role: Callable[..., str]) -> None:
    _seed(dsn)
    bound = make_role("replaysafe_auditor")
    bind(dsn, bound, "A")
    result = run("audit", dsn=dsn_as(dsn, bound))
    assert result.exit_code == 1 and "k" in result.stdout  # an unknown action needs attention
    everyone = make_role("replaysafe_auditor")
    with psycopg.connect(dsn, autocommit=True) as owner:
        owner.execute("SELECT replaysafe.bind_role_to_all_tenants(p_role => %s)", (everyone,))
    result = run("audit", dsn=dsn_as(dsn, everyone))
    assert result.exit_code == 1 and "k" in result.stdout


def test_doctor_names_auditors_bound_to_no_tenant(dsn: str, make_role: Callable[..., str]) -> None:
    lost = make_role("replaysafe_auditor")
    kept = make_role("replaysafe_auditor")
    with psycopg.connect(dsn, autocommit=True) as owner:
        owner.execute("SELECT replaysafe.bind_role_to_all_tenants(p_role => %s)", (kept,))
    result = run("doctor", dsn=dsn)
    notes = [line for line in result.stdout.splitlines() if line.startswith("note  auditor")]
    assert len(notes) == 1 and lost in notes[0] and kept not in notes[0], result.stdout
    assert "bind_role_to_all_tenants" in notes[0]
    # doctor itself runs for a role that acts for no tenant
    assert run("doctor", dsn=dsn_as(dsn, lost)).exit_code in (0, 1)


def test_the_upgrade_names_the_auditors_that_lost_all_tenant_reading(
        dsn: str, make_role: Callable[..., str]) -> None:
    lost = make_role("replaysafe_auditor")
    bound = make_role("replaysafe_auditor")
    bind(dsn, bound, "A")
    replaysafe_pg.downgrade(dsn, "0012")
    script = offline_sql("0012:0013")
    warnings: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: warnings.append(d.message_primary or ""))
        conn.execute(script)  # type: ignore[arg-type]
    named = [w for w in warnings if "no longer reads every tenant" in w]
    assert any(lost in w for w in named) and not any(bound in w for w in named), warnings
    assert all("bind_role_to_all_tenants" in w for w in named)
    assert replaysafe_pg.current_revision(dsn) == "0013"


def test_a_fresh_install_names_nobody(empty_dsn: str, make_role: Callable[..., str]) -> None:
    make_role("replaysafe_auditor")
    warnings: list[str] = []
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: warnings.append(d.message_primary or ""))
        conn.execute(offline_sql("head"))  # type: ignore[arg-type]
    assert not [w for w in warnings if "no longer reads every tenant" in w]
