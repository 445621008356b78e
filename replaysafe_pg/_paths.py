"""Where the SQL files and migrations live (kept free of heavy imports: workers load it)."""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def _resource_dir(installed: str, in_repo: str) -> Path:
    # A wheel carries sql/ and migrations/ inside the package; a source checkout (and an
    # editable install) has them at the repository root.
    candidate = _PACKAGE_DIR / installed
    return candidate if candidate.is_dir() else _PACKAGE_DIR.parent / in_repo


def migrations_dir() -> Path:
    return _resource_dir("_migrations", "migrations")


def sql_dir() -> Path:
    return _resource_dir("_sql", "sql")
