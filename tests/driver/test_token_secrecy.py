"""Attempt and claim tokens travel only as bound parameters and show up nowhere but in the
claimer's own answer: not in ``repr(Claim)``, not in an exception's text, not in
``pg_stat_activity.query``, not in a view, and not in the server's log at
``log_statement = 'all'`` once bound parameters are not logged (``log_parameter_max_length
= 0``: docs/isolation.md says why that setting matters)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg import conninfo

import replaysafe_pg
from replaysafe_pg import AttemptToken


def _db_name(dsn: str) -> str:
    return str(conninfo.conninfo_to_dict(dsn)["dbname"])


def test_repr_and_errors_never_show_a_token(ledger: replaysafe_pg.Ledger) -> None:
    claim = ledger.claim("k", "op", {}, claim_token="claim-" + uuid.uuid4().hex)
    assert claim.attempt_token and claim.attempt_token not in repr(claim)
    assert claim.attempt_token not in str(claim)
    wrong = AttemptToken("k", claim.attempt, claim.attempt_token[:-1] + "x")
    assert wrong.attempt_token not in repr(wrong)
    with pytest.raises(replaysafe_pg.AccessDenied) as denied:
        ledger.complete(wrong, {"forged": True})
    assert wrong.attempt_token not in str(denied.value)
    assert claim.attempt_token[:-1] not in str(denied.value)
    too_long = AttemptToken("k", claim.attempt, "s" * 600)
    with pytest.raises(replaysafe_pg.InvalidArgument) as invalid:
        ledger.heartbeat(too_long)
    assert "s" * 20 not in str(invalid.value)
    replay = ledger.claim("k", "op", {})
    assert replay.attempt_token is None
    with pytest.raises(replaysafe_pg.InvalidArgument, match="only a 'claimed' answer"):
        ledger.complete(replay, {})
    assert ledger.complete(claim, {"ok": True}) == "recorded"


def test_a_token_is_not_in_the_statement_text_or_pg_stat_activity(dsn: str) -> None:
    with replaysafe_pg.Ledger(dsn, tenant_id="t") as led, psycopg.connect(dsn) as admin:
        secret = "claim-" + uuid.uuid4().hex
        claim = led.claim("k", "op", {}, claim_token=secret)
        led.heartbeat(claim)
        queries = [r[0] for r in admin.execute(
            "SELECT query FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()")]
        assert any("heartbeat_action" in q for q in queries)
        for q in queries:
            assert claim.attempt_token not in q and secret not in q  # type: ignore[operator]
        led.complete(claim, {})
        views = admin.execute(
            "SELECT (SELECT string_agg(row_to_json(a)::text, '') FROM replaysafe.actions_v a) || "
            "(SELECT string_agg(row_to_json(t)::text, '') FROM replaysafe.action_attempts_v t)"
        ).fetchone()
        assert views is not None and claim.attempt_token not in views[0] and secret not in views[0]


def _server_log(admin: psycopg.Connection[Any]) -> str | None:
    """The server's log, where this test can read it (the embedded test server logs to a
    file in its data directory); None elsewhere."""
    try:
        path = admin.execute("SELECT coalesce(pg_current_logfile(), 'log')").fetchone()
        assert path is not None
        row = admin.execute("SELECT pg_read_file(%s)", (path[0],)).fetchone()
    except psycopg.Error:
        admin.rollback()
        return None
    return None if row is None else str(row[0])


@pytest.mark.parametrize("parameters_logged", [False, True])
def test_the_server_log_at_log_statement_all(admin_dsn: str, dsn: str,
                                             parameters_logged: bool) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        if _server_log(admin) is None:
            pytest.skip("the test server's log is not readable through SQL here")
        setting = "-1" if parameters_logged else "0"
        admin.execute(f'ALTER DATABASE "{_db_name(dsn)}" SET log_statement = \'all\'')
        admin.execute(f'ALTER DATABASE "{_db_name(dsn)}" SET log_parameter_max_length = {setting}')
        start = len(_server_log(admin) or "")
        secret = "claim-" + uuid.uuid4().hex
        with replaysafe_pg.Ledger(dsn, tenant_id="t") as led:
            claim = led.claim("k", "op", {}, claim_token=secret)
            led.heartbeat(claim)
            led.complete(claim, {"ok": True})
            with pytest.raises(replaysafe_pg.AccessDenied):
                led.complete(AttemptToken("k", 1, claim.attempt_token + "x"), {})  # type: ignore[operator]
        log = (_server_log(admin) or "")[start:]
    assert "complete_action" in log  # the statements were logged
    statements = [ln for ln in log.splitlines() if "DETAIL:  Parameters:" not in ln]
    assert claim.attempt_token not in "\n".join(statements)  # type: ignore[operator]
    assert secret not in "\n".join(statements)
    # Bound parameters themselves are logged only where the server is told to log them.
    assert (claim.attempt_token in log) is parameters_logged  # type: ignore[operator]
