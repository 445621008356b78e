"""The ``replaysafe-pg`` command and its demo (the embedded Postgres it starts is
:mod:`replaysafe_pg.embedded`, below the command line).

``main`` (the console script) and ``parse_duration`` are loaded on first use: importing
a module of this package must not pay for click and every command module.
"""

from __future__ import annotations

from typing import Any

__all__ = ["main", "parse_duration"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from replaysafe_pg.cli import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
