"""Where the SQL tree and the migrations live (kept free of heavy imports: workers load it).

In the repository they are the top-level ``sql/`` and ``migrations/``; a wheel carries them
inside the package (``replaysafe_pg/sql``, ``replaysafe_pg/migrations``: pyproject's
force-include). An editable install imports the package from the checkout, where only the
top-level copies exist. So: the package's own copy first, then the checkout's.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

# One file each copy must hold: a directory that lacks it (an old checkout's left-over
# ``replaysafe_pg/migrations`` holding only __pycache__, say) is not a copy.
_MARKERS = {"sql": "grants.sql", "migrations": "released.sha256"}


def _tree(name: str) -> Path:
    # The package is installed as files (a wheel or an editable install), never zipped:
    # alembic needs a real directory for its script location.
    package = Path(str(files("replaysafe_pg")))
    for candidate in (package / name, package.parent / name):
        if (candidate / _MARKERS[name]).is_file():
            return candidate
    raise FileNotFoundError(
        f"replaysafe_pg: its {name}/ directory is missing (looked in {package} and "
        f"{package.parent}): reinstall the package")


def migrations_dir() -> Path:
    return _tree("migrations")


def sql_dir() -> Path:
    return _tree("sql")
