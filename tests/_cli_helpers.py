"""Helpers for the command-line tests: run ``replaysafe-pg`` in-process, seed actions."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from click.testing import CliRunner, Result

from replaysafe_pg.cli import main

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def run(*args: str, dsn: str | None = None, env: dict[str, str] | None = None) -> Result:
    """``replaysafe-pg [--dsn DSN] ARGS...``; never picks up the caller's REPLAYSAFE_DSN."""
    runner = CliRunner(env={"REPLAYSAFE_DSN": None, **(env or {})})
    prefix = ["--dsn", dsn] if dsn is not None else []
    return runner.invoke(main, [*prefix, *args], catch_exceptions=False)


def run_json(*args: str, dsn: str, exit_code: int = 0) -> Any:
    result = run("--json", *args, dsn=dsn)
    assert result.exit_code == exit_code, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def assert_one_line_error(result: Result, *fragments: str) -> None:
    """Exit status 2, one line on stderr naming the problem, no traceback anywhere."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr.strip()
    assert "\n" not in err, err
    assert err.startswith("replaysafe-pg: error: "), err
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in err, (fragment, err)
