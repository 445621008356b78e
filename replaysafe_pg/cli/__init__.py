"""The ``replaysafe-pg`` command, its demo and the embedded Postgres it starts.

``main`` (the console script) and ``parse_duration`` are loaded on first use: importing
:mod:`replaysafe_pg.cli.embedded` (as tests and benchmarks do) must not pay for click and the
command modules.
"""

from __future__ import annotations

from typing import Any

__all__ = ["main", "parse_duration"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from replaysafe_pg.cli import commands

        return getattr(commands, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
