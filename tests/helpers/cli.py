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
    """``replaysafe-pg [--dsn DSN] ARGS...``; never picks up the caller's REPLAYSAFE_DSN (or
    REPLAYSAFE_PGDATA)."""
    runner = CliRunner(env={"REPLAYSAFE_DSN": None, "REPLAYSAFE_PGDATA": None, **(env or {})})
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


def console_script() -> str:
    """The installed ``replaysafe-pg`` entry point next to this interpreter."""
    import shutil
    import sys
    from pathlib import Path

    candidate = Path(sys.executable).parent / "replaysafe-pg"
    found = str(candidate) if candidate.exists() else shutil.which("replaysafe-pg")
    assert found, "the replaysafe-pg console script is not installed (pip install -e .)"
    return found


def script_env(**extra: str) -> dict[str, str]:
    """Environment for the console script: this checkout's package, no inherited DSN or
    embedded data directory."""
    import os
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in ("REPLAYSAFE_DSN", "REPLAYSAFE_PGDATA")}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env | extra
