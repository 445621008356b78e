"""The plumbing every ``replaysafe-pg`` command shares: the root group (:data:`main`), the
global options, :class:`CliError`, which database a command uses (:class:`State`), errors
to one line and an exit status, and the output helpers.

Every subcommand accepts the global options (``--dsn``, ``--pgdata``, ``--ephemeral``,
``--json``, ``--debug``) before or after its name. Without a DSN an embedded Postgres is
started and migrated (see :mod:`replaysafe_pg.cli.db`).

Exit status: 0 success; 1 ``audit`` found rows that need attention (or ``doctor`` found a
problem, or ``reconcile`` left actions ``unknown``, or ``server status`` found no server);
2 an error (one line on stderr; ``--debug`` adds the traceback, the status stays 2).

Help texts come from docstrings: :class:`Command` shows their ``literals`` as plain text.
The commands themselves live in the ``*_commands`` modules, :mod:`~replaysafe_pg.cli.doctor`
and :mod:`~replaysafe_pg.cli.reconcile_loop`; :mod:`replaysafe_pg.cli.app` adds them to
:data:`main`.
"""

from __future__ import annotations

import functools
import json
import re
import signal
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
import psycopg
import sqlalchemy.exc
from psycopg.rows import dict_row

from replaysafe_pg import embedded, queries, schema
from replaysafe_pg._dsn import redact
from replaysafe_pg.cli import render
from replaysafe_pg.cli.db import ConnectError, Database, first_line
from replaysafe_pg.errors import AccessDenied, ReplaysafeError, translate, wrap_errors
from replaysafe_pg.statements import acting_for

EXIT_ATTENTION = 1
EXIT_ERROR = 2

F = TypeVar("F", bound=Callable[..., Any])


class CliError(click.ClickException):
    """One line on stderr and exit status 2."""

    exit_code = EXIT_ERROR

    def show(self, file: Any = None) -> None:
        # Messages quote keys and database errors: escaped like every value (render.escape).
        click.echo(f"replaysafe-pg: error: {render.escape(self.format_message())}", err=True)


class NotFound(Exception):
    pass


@dataclass
class State:
    dsn: str | None = None
    pgdata: Path | None = None
    ephemeral: bool = False
    json: bool = False
    debug: bool = False
    explicit: set[str] = field(default_factory=set)  # options given on the command line
    _db: Database | None = field(default=None, repr=False)

    @property
    def db(self) -> Database:
        if self._db is None:
            self._db = Database(dsn=self.dsn, pgdata=self.pgdata, ephemeral=self.ephemeral,
                                notice=lambda text: click.echo(text, err=True))
        return self._db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()


def state_of(ctx: click.Context) -> State:
    return ctx.find_root().ensure_object(State)


def _set(attr: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        # Flags given before or after the subcommand's name both count; a value from the
        # environment (read again at every level) never overrides one given on the line.
        if value is None or value is False:
            return
        state = state_of(ctx)
        source = ctx.get_parameter_source(param.name) if param.name else None
        if source is click.core.ParameterSource.COMMANDLINE:
            state.explicit.add(attr)
        elif attr in state.explicit:
            return
        setattr(state, attr, value)
    return callback


def global_options(f: F) -> F:
    options = [
        click.option("--dsn", envvar="REPLAYSAFE_DSN", expose_value=False, callback=_set("dsn"),
                     help="Database to use (libpq URI or key=value). Env: REPLAYSAFE_DSN. "
                          "Without it an embedded Postgres is started."),
        click.option("--pgdata", "--data-dir", "pgdata", envvar="REPLAYSAFE_PGDATA",
                     type=click.Path(file_okay=False, path_type=Path),
                     expose_value=False, callback=_set("pgdata"),
                     help="Data directory of the embedded Postgres. Env: REPLAYSAFE_PGDATA "
                          f"(default: {embedded.default_pgdata()})."),
        click.option("--ephemeral", is_flag=True, default=False, expose_value=False,
                     callback=_set("ephemeral"),
                     help="Use a throwaway embedded Postgres, deleted at exit."),
        click.option("--json", "json_", is_flag=True, default=False, expose_value=False,
                     callback=_set("json"), help="Machine-readable JSON on stdout."),
        click.option("--debug", is_flag=True, default=False, expose_value=False,
                     callback=_set("debug"),
                     help="Add the traceback to an error (the exit status stays 2)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def describe(exc: BaseException) -> str:
    """One line saying what went wrong, for an exception that escaped a command."""
    if isinstance(exc, sqlalchemy.exc.DBAPIError) and isinstance(exc.orig, BaseException):
        exc = exc.orig
    if isinstance(exc, psycopg.Error):
        domain = translate(exc)
        if domain is not None:
            exc = domain
        elif isinstance(exc, psycopg.OperationalError):
            return f"database connection failed: {first_line(exc)}"
        else:
            code = f" (SQLSTATE {exc.sqlstate})" if exc.sqlstate else ""
            return f"database error: {first_line(exc)}{code}"
    if isinstance(exc, ConnectError | NotFound):
        return str(exc)
    if isinstance(exc, ReplaysafeError):
        return f"{type(exc).__name__}: {first_line(exc)}"
    return f"{type(exc).__name__}: {first_line(exc)} (run with --debug for the traceback)"


_RST_LITERAL = re.compile(r"``(.+?)``|`([^`]+)`", re.DOTALL)


def plain(text: str) -> str:
    """Help text without reST/Markdown literals: ``migrate current`` and `migrate current`
    read as 'migrate current' in a terminal."""
    return _RST_LITERAL.sub(lambda m: f"'{m.group(1) or m.group(2)}'", text)


def _plain_help(command: click.Command) -> None:
    # Before click wraps the text: a literal broken across two lines would keep its quotes.
    if command.help:
        command.help = plain(command.help)
    if command.short_help:
        command.short_help = plain(command.short_help)
    for param in command.params:
        if isinstance(param, click.Option) and param.help:
            param.help = plain(param.help)


class Command(click.Command):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _plain_help(self)


class Group(click.Group):
    command_class = Command

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _plain_help(self)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CliError as exc:
            # Whatever an error quotes of the DSN, never its password (replaysafe_pg._dsn).
            message = redact(exc.message, state_of(ctx).dsn)
            if message == exc.message:
                raise
            failed = CliError(message)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            dsn = state_of(ctx).dsn
            if state_of(ctx).debug:
                # The traceback is added; the exit status stays that of an error (2), never
                # the 1 that means "needs attention".
                click.echo(redact("".join(traceback.format_exception(exc)).rstrip(), dsn),
                           err=True)
            raise CliError(redact(describe(exc), dsn)) from None
        raise failed from None


def _on_sigterm(_signum: int, _frame: Any) -> NoReturn:
    # Unwind normally, so an embedded server we started is stopped and removed.
    raise SystemExit(128 + signal.SIGTERM)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("replaysafe-pg")
    except PackageNotFoundError:
        return "unknown (not installed)"


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@global_options
@click.version_option(_version(), "--version", prog_name="replaysafe-pg",
                      message="%(prog)s %(version)s")
@click.pass_context
def main(ctx: click.Context) -> None:
    """replaysafe_pg: replay-safe side effects for AI agents, enforced in Postgres."""
    state = state_of(ctx)
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
        signal.signal(signal.SIGTERM, _on_sigterm)
        # Closing callbacks run last-in first-out: the handler stays while state.close stops
        # and deletes an embedded server (a SIGTERM then unwinds after the cleanup).
        ctx.call_on_close(lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    ctx.call_on_close(state.close)


# --- shared helpers ------------------------------------------------------------------------

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(w|d|h|m|s)")
_UNIT_SECONDS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(text: str) -> timedelta:
    """``7d``, ``2h``, ``30m``, ``1d12h``, ``90s``, ``2w`` as a timedelta."""
    compact = text.strip().lower()
    parts = _DURATION_PART.findall(compact)
    if not parts or _DURATION_PART.sub("", compact).strip():
        raise ValueError(f"{text!r} is not a duration like 7d, 2h, 30m, 1d12h")
    return timedelta(seconds=sum(float(n) * _UNIT_SECONDS[u] for n, u in parts))


class Duration(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click
    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> timedelta:
        if isinstance(value, timedelta):
            return value
        try:
            return parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class JsonValue(click.ParamType):  # type: ignore[type-arg]
    name = "json"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except ValueError as exc:
            self.fail(f"not valid JSON: {exc}", param, ctx)


def emit(ctx: click.Context, human: str | Callable[[], str], data: Any) -> None:
    """Print ``data`` as JSON, or the human text. Values in human text are escaped where
    they are formatted (render.cell, render.escape); escaping the whole text again here
    keeps any value a command forgot from reaching the terminal raw (only our own line
    breaks stay)."""
    if state_of(ctx).json:
        click.echo(render.dumps(data))
    else:
        click.echo(render.escape(human() if callable(human) else human, keep_newlines=True))


def query_rows(conn: psycopg.Connection[Any], name: str,
               params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    with wrap_errors(), conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(queries.cli(name), params or {}).fetchall()


# The commands that read or change no tenant's rows (or check the caller's right themselves:
# an issuer acts for no tenant, grant revoke is the tenant's operator's): any role runs them.
_FOR_ANY_ROLE = frozenset({"migrate_current", "doctor", "grant_issue", "grant_revoke"})


def with_conn(f: Callable[..., Any]) -> Callable[..., Any]:
    """Pass an open autocommit connection to the database as ``conn``. A command that works
    on the caller's tenants first checks that the role acts for one (or for every tenant):
    otherwise it would succeed on nothing, which reads as "nothing to do"."""
    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        with state_of(ctx).db.connection() as conn:
            if f.__name__ not in _FOR_ANY_ROLE:
                _require_a_tenant(conn)
            return f(*args, conn=conn, **kwargs)
    return wrapper


def _require_a_tenant(conn: psycopg.Connection[Any]) -> None:
    """CliError (exit 2) when the connected role acts for no tenant (calls.acting_for). A
    schema without acting_for() (an older revision) or a role that may not call it is left
    to the command itself to refuse."""
    statement = acting_for(None)
    try:
        rows = conn.execute(statement.query, statement.params).fetchall()
    except (psycopg.errors.UndefinedFunction, psycopg.errors.InsufficientPrivilege,
            psycopg.errors.InvalidSchemaName):
        return
    try:
        statement.decode(rows)
    except AccessDenied as exc:
        raise CliError(str(exc)) from None


TENANT_ALL = click.option("--tenant", "tenant_id", default=None, metavar="TENANT",
                          help="Only this tenant (default: every tenant you may read).")
TENANT_ONE = click.option("--tenant", "tenant_id", default="default", show_default=True,
                          metavar="TENANT", help="The tenant the action or thread belongs to.")


def installed_revision(conn: psycopg.Connection[Any]) -> str | None:
    """The installed revision, as any replaysafe role may read it (see schema.read_revision)."""
    with wrap_errors():
        return schema.read_revision(lambda sql: conn.execute(sql).fetchone())


def operator_duty(conn: psycopg.Connection[Any], what: str, exc: AccessDenied) -> CliError:
    """The one-line error of a role that is not an operator trying an operator's duty."""
    try:
        role = str(query_rows(conn, "server_info")[0]["role"])
    except Exception:
        role = "this role"
    detail = first_line(exc).removeprefix("access denied: ")
    return CliError(f"access denied: {what} is replaysafe_operator's duty and {role} is not "
                    f"one ({detail}); connect as a role granted replaysafe_operator "
                    "(docs/isolation.md)")
