"""``replaysafe-pg --help`` of every command and ``--version``: no database needed."""

from __future__ import annotations

import importlib.metadata

import click
from helpers.cli import run

from replaysafe_pg.cli import main


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += _commands(command, (*path, name))
        else:
            found.append((*path, name))
    return found


def test_no_help_text_shows_rest_or_markdown_backticks() -> None:
    """Every group's and command's --help exits 0 and shows no backtick: the docstrings'
    reST/Markdown literals read as plain quotes in a terminal."""
    paths = _commands(main)
    assert ("server", "start") in paths and ("purge",) in paths
    for path in paths:
        result = run(*path, "--help")
        assert result.exit_code == 0, (path, result.output)
        assert "`" not in result.stdout, (path, result.stdout)


def test_version() -> None:
    """--version prints 'replaysafe-pg VERSION', the installed distribution's version."""
    result = run("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"replaysafe-pg {importlib.metadata.version('replaysafe-pg')}"
