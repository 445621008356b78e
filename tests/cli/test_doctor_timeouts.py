"""doctor advises the two timeouts a worker login should set (docs/deploying.md)."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
from helpers.cli import run, run_json


def test_doctor_advises_timeouts_for_worker_logins(dsn: str, make_role: Callable[..., str]) -> None:
    bare = make_role("replaysafe_worker")
    tuned = make_role("replaysafe_worker")
    half = make_role("replaysafe_worker")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f'ALTER ROLE "{tuned}" SET idle_in_transaction_session_timeout = \'30s\'')
        c.execute(f'ALTER ROLE "{tuned}" SET statement_timeout = \'5s\'')
        c.execute(f'ALTER ROLE "{half}" SET statement_timeout = \'5s\'')
        c.execute(f'ALTER ROLE "{half}" SET idle_in_transaction_session_timeout = 0')
        c.execute(f'ALTER ROLE "{tuned}" SET synchronous_commit = off')
        c.execute(f'ALTER ROLE "{half}" SET idle_in_transaction_session_timeout = \'0s\'')
    report = run_json("doctor", dsn=dsn)
    advice = "\n".join(report["advice"])
    assert f"worker login {bare} sets no idle_in_transaction_session_timeout and no " \
           "statement_timeout" in advice
    assert f"worker login {half} sets no idle_in_transaction_session_timeout:" in advice
    assert f"worker login {tuned} runs with synchronous_commit = off" in advice
    assert f"worker login {tuned} sets no" not in advice
    assert report["ok"], "advice is not a failure"
    out = run("doctor", dsn=dsn).output
    assert f"note  worker login {bare} sets no" in out


def test_a_login_setting_here_wins_over_its_setting_everywhere(
        dsn: str, make_role: Callable[..., str]) -> None:
    login = make_role("replaysafe_worker")
    with psycopg.connect(dsn, autocommit=True) as c:
        db = c.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        c.execute(f'ALTER ROLE "{login}" SET statement_timeout = \'5s\'')
        c.execute(f'ALTER ROLE "{login}" SET idle_in_transaction_session_timeout = \'5s\'')
        c.execute(f'ALTER ROLE "{login}" IN DATABASE "{db}" SET statement_timeout = 0')
        # A setting's text cannot pass for another setting.
        c.execute(f'ALTER ROLE "{login}" SET application_name = '
                  "'x statement_timeout=5s'")
    advice = "\n".join(run_json("doctor", dsn=dsn)["advice"])
    assert f"worker login {login} sets no statement_timeout:" in advice


def test_the_databases_setting_counts_below_the_logins_own(
        dsn: str, make_role: Callable[..., str]) -> None:
    login = make_role("replaysafe_worker")
    with psycopg.connect(dsn, autocommit=True) as c:
        db = c.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        c.execute(f'ALTER DATABASE "{db}" SET idle_in_transaction_session_timeout = \'30s\'')
        c.execute(f'ALTER DATABASE "{db}" SET statement_timeout = \'30s\'')
        c.execute(f'ALTER ROLE "{login}" SET statement_timeout = 0')
    advice = "\n".join(run_json("doctor", dsn=dsn)["advice"])
    assert f"worker login {login} sets no statement_timeout:" in advice
    assert f"worker login {login} sets no idle_in_transaction" not in advice
