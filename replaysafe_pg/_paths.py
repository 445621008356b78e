"""Where the SQL files and the migrations live: inside the package, read with
importlib.resources (kept free of heavy imports: workers load it)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def _package_dir(name: str) -> Path:
    # The package is installed as files (a wheel or an editable install), never zipped:
    # alembic needs a real directory for its script location.
    return Path(str(files("replaysafe_pg").joinpath(name)))


def migrations_dir() -> Path:
    return _package_dir("migrations")


def sql_dir() -> Path:
    return _package_dir("sql")
