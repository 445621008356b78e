"""The ``replaysafe-pg`` command.

Every subcommand accepts the global options (``--dsn``, ``--pgdata``, ``--ephemeral``,
``--json``, ``--debug``) before or after its name. Without a DSN an embedded Postgres is
started and migrated (see :mod:`replaysafe_pg.cli.db`).

Exit status: 0 success; 1 ``audit`` found rows that need attention (or ``doctor`` found a
problem, or ``reconcile`` left actions ``unknown``, or ``server status`` found no server);
2 an error (one line on stderr; ``--debug`` adds the traceback, the status stays 2).

Help texts come from docstrings: :class:`_Command` shows their ``literals`` as plain text.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.machinery
import importlib.util
import io
import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
import psycopg
import sqlalchemy.exc
from psycopg.rows import dict_row

from replaysafe_pg import queries, schema
from replaysafe_pg._dsn import redact
from replaysafe_pg.cli import embedded, render
from replaysafe_pg.cli import grant as grant_cli
from replaysafe_pg.cli.db import ConnectError, Database, first_line
from replaysafe_pg.errors import (
    AccessDenied,
    ReplaysafeError,
    SchemaNotInstalled,
    translate,
    wrap_errors,
)
from replaysafe_pg.ledger import Ledger
from replaysafe_pg.models import ActionState
from replaysafe_pg.reconcile import GONE_NOTE, Lookup, ReconcileOutcome, Reconciliation
from replaysafe_pg.statements import acting_for
from replaysafe_pg.threads import Threads

EXIT_ATTENTION = 1
EXIT_ERROR = 2

F = TypeVar("F", bound=Callable[..., Any])


class CliError(click.ClickException):
    """One line on stderr and exit status 2."""

    exit_code = EXIT_ERROR

    def show(self, file: Any = None) -> None:
        # Messages quote keys and database errors: escaped like every value (_cli_render).
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


def _state(ctx: click.Context) -> State:
    return ctx.find_root().ensure_object(State)


def _set(attr: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        # Flags given before or after the subcommand's name both count; a value from the
        # environment (read again at every level) never overrides one given on the line.
        if value is None or value is False:
            return
        state = _state(ctx)
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


class _Command(click.Command):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _plain_help(self)


class _Group(click.Group):
    command_class = _Command

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _plain_help(self)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CliError as exc:
            # Whatever an error quotes of the DSN, never its password (replaysafe_pg._dsn).
            message = redact(exc.message, _state(ctx).dsn)
            if message == exc.message:
                raise
            failed = CliError(message)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            dsn = _state(ctx).dsn
            if _state(ctx).debug:
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


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@global_options
@click.version_option(_version(), "--version", prog_name="replaysafe-pg",
                      message="%(prog)s %(version)s")
@click.pass_context
def main(ctx: click.Context) -> None:
    """replaysafe_pg: replay-safe side effects for AI agents, enforced in Postgres."""
    state = _state(ctx)
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


def _emit(ctx: click.Context, human: str | Callable[[], str], data: Any) -> None:
    """Print ``data`` as JSON, or the human text. Values in human text are escaped where
    they are formatted (render.cell, render.escape); escaping the whole text again here
    keeps any value a command forgot from reaching the terminal raw (only our own line
    breaks stay)."""
    if _state(ctx).json:
        click.echo(render.dumps(data))
    else:
        click.echo(render.escape(human() if callable(human) else human, keep_newlines=True))


def _rows(conn: psycopg.Connection[Any], name: str,
          params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    with wrap_errors(), conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(queries.cli(name), params or {}).fetchall()


# The commands that read or change no tenant's rows (or check the caller's right themselves:
# an issuer acts for no tenant, grant revoke is the tenant's operator's): any role runs them.
_FOR_ANY_ROLE = frozenset({"migrate_current", "doctor", "grant_issue", "grant_revoke"})


def _with_conn(f: Callable[..., Any]) -> Callable[..., Any]:
    """Pass an open autocommit connection to the database as ``conn``. A command that works
    on the caller's tenants first checks that the role acts for one (or for every tenant):
    otherwise it would succeed on nothing, which reads as "nothing to do"."""
    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        with _state(ctx).db.connection() as conn:
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


_TENANT_ALL = click.option("--tenant", "tenant_id", default=None, metavar="TENANT",
                           help="Only this tenant (default: every tenant you may read).")
_TENANT_ONE = click.option("--tenant", "tenant_id", default="default", show_default=True,
                           metavar="TENANT", help="The tenant the action or thread belongs to.")


# --- migrate --------------------------------------------------------------------------------

@main.group(cls=_Group, invoke_without_command=True)
@global_options
@click.option("--sql", "print_sql", is_flag=True,
              help="Print the SQL of the upgrade instead of running it (needs no database).")
@click.option("--revision", default="head", show_default=True,
              help="Target revision. An older one than installed downgrades, with --yes only.")
@click.option("--yes", is_flag=True,
              help="Confirm a downgrade (it drops what the newer revisions added, data included).")
@click.option("--citus", is_flag=True,
              help="Then distribute the schema by tenant on a Citus coordinator (docs/scale-out.md); "
              "with --sql, print that script after the upgrade's.")
@click.option("--shard-count", type=click.IntRange(1, 64000), default=None, metavar="N",
              help="With --citus: shards of the tables distributed now (default: citus.shard_count).")
@click.pass_context
def migrate(ctx: click.Context, print_sql: bool, revision: str, yes: bool, citus: bool,
            shard_count: int | None) -> None:
    """Upgrade the replaysafe schema (``migrate current`` shows the installed revision)."""
    if ctx.invoked_subcommand is not None:
        return
    if shard_count is not None and not citus:
        raise CliError("--shard-count goes with --citus")
    if print_sql:
        click.echo(offline_sql(revision), nl=False)
        if citus:
            click.echo(citus_offline_sql(), nl=False)
        return
    state = _state(ctx)
    with state.db.connection() as conn:  # a clear error for a bad DSN before alembic wraps it
        before = installed_revision(conn)
    dsn = state.db.dsn()
    undone = schema.undone_by(before, revision)
    if undone and citus:
        raise CliError("--citus distributes the schema at its newest revision: it does not go "
                       "with a downgrade")
    if undone and not yes:
        raise CliError(f"--revision {revision} would DOWNGRADE from {before}: {_undoing(undone)}; "
                       "run again with --yes to downgrade")
    if undone:
        schema.downgrade(dsn, revision)
    else:
        schema.migrate(dsn, revision, citus=citus, shard_count=shard_count)
    with state.db.connection() as conn:
        after = installed_revision(conn)
    if before == after:
        human = f"already at {after}"
    else:
        verb = "downgraded" if undone else "migrated"
        human = f"{verb} from {before or 'nothing'} to {after or 'base (nothing)'}"
    if citus:
        human += "; distributed by tenant on Citus (docs/scale-out.md)"
    _emit(ctx, human, {"before": before, "after": after, "head": schema.head_revision(),
                       "citus": citus})


def _undoing(undone: list[schema.Revision]) -> str:
    """What a downgrade undoes and which tables (with their rows) it drops."""
    names = ", ".join(r.name for r in undone)
    dropped = [t for r in undone for t in r.drops]
    if not dropped:
        return f"undoing {names} (no table is dropped)"
    return f"undoing {names} and DROPPING {', '.join(dropped)} with every row in them"


def installed_revision(conn: psycopg.Connection[Any]) -> str | None:
    """The installed revision, as any replaysafe role may read it (see schema.read_revision)."""
    with wrap_errors():
        return schema.read_revision(lambda sql: conn.execute(sql).fetchone())


def offline_sql(revision: str = "head") -> str:
    from alembic import command

    # Offline mode needs a dialect, not a server: the URL is never connected to.
    cfg = schema.alembic_config("postgresql://offline")
    buffer = io.StringIO()
    cfg.output_buffer = buffer
    command.upgrade(cfg, revision, sql=True)
    return buffer.getvalue()


def citus_offline_sql() -> str:
    """citus.sql as its own transaction, for ``migrate --citus --sql``: run it after the
    upgrade, on the coordinator, as the schema owner."""
    return ("\n-- replaysafe on Citus (docs/scale-out.md): after the upgrade above, on the "
            "coordinator, as the schema owner\nBEGIN;\n\n" + schema.citus_sql().rstrip("\n")
            + "\n\nCOMMIT;\n")


@migrate.command("current")
@global_options
@click.pass_context
@_with_conn
def migrate_current(ctx: click.Context, conn: psycopg.Connection[Any]) -> None:
    """Show the installed schema revision and the newest one."""
    current = installed_revision(conn)
    head = schema.head_revision()
    if current is None:
        human = f"not installed (head is {head}): run `replaysafe-pg migrate`"
    elif current == head:
        human = f"{current} (head)"
    else:
        human = f"{current} (head is {head}): run `replaysafe-pg migrate`"
    _emit(ctx, human, {"current": current, "head": head, "up_to_date": current == head})


# --- doctor ---------------------------------------------------------------------------------

@main.command()
@global_options
@click.pass_context
@_with_conn
def doctor(ctx: click.Context, conn: psycopg.Connection[Any]) -> None:
    """Check the connection, schema revision, group roles, row-level security."""
    info = _rows(conn, "server_info")[0]
    checks: list[dict[str, Any]] = [{
        "check": "connection", "ok": True,
        "detail": f"{info['role']}@{info['database']}, PostgreSQL {info['server_version']}"}]
    head = schema.head_revision()
    scopes = _rows(conn, "caller_scope")
    scope = scopes[0] if scopes else None
    try:
        current, readable = installed_revision(conn), True
    except AccessDenied:
        current, readable = None, False
    if readable:
        checks.append({"check": "schema revision", "ok": current == head,
                       "detail": f"{current or 'not installed'} (head {head})"
                       + ("" if current == head else ": run `replaysafe-pg migrate`")})
    else:
        checks.append({"check": "schema revision", "ok": False, "detail": (
            f"unknown: {info['role']} may not read it (it is not a member of replaysafe_worker, "
            "replaysafe_auditor or replaysafe_operator, nor the schema owner)")})
    for role in _rows(conn, "group_roles"):
        checks.append({"check": f"role {role['name']}", "ok": role["present"],
                       "detail": "exists" if role["present"] else "missing (the migrating role "
                       "could not create roles; create it and migrate again)"})
    counts: dict[str, int] = {}
    installed = scope is not None and (current is not None or not readable)
    # Every check reads the catalogs, which any role may: they are complete for any caller.
    # Only the counts read the actions view, as the caller's rights allow.
    counts_scope: str | None = None
    advice: list[str] = []
    if installed:
        on_citus = bool(_rows(conn, "citus_present")[0]["present"])
        checks += _schema_object_checks(_rows(conn, "schema_objects"), complete=current == head,
                                        citus=on_citus)
        if on_citus:
            checks.append(_citus_check(_rows(conn, "citus_tables"), _rows(conn, "citus_lookups")))
        checks += _privilege_checks(_rows(conn, "schema_privileges"), _rows(conn, "default_privileges"))
        for table in _rows(conn, "table_rls"):
            checks.append({"check": f"row-level security on {table['table_name']}",
                           "ok": table["rls_enabled"],
                           "detail": "enabled" if table["rls_enabled"] else "DISABLED"})
        advice = _timeout_advice(_rows(conn, "worker_settings"))
        checks += _grant_checks(conn, owner=bool(scope and scope["owner"]) and current == head)
        if scope and scope["owner"] and current == head:
            copy = _rows(conn, "installation_copy")
            if copy and copy[0]["copied"]:
                advice.append(
                    "this database is a copy (a template clone or a restore) of the one the "
                    f"installation {copy[0]['installation_id']} was made in: it refuses the "
                    "original's tenant grants, and shares its grant keys; give it keys of its "
                    "own: SELECT replaysafe.rotate_grant_key(p_keep_previous => false) "
                    "(docs/isolation.md#tenant-grants)")
        if scope and scope["owner"] and current == head:
            lost = [r["role"] for r in _rows(conn, "auditors_without_tenant")]
            if lost:
                advice.append(
                    f"auditor login(s) {', '.join(lost)} are bound to no tenant and read nothing "
                    "(without a tenant grant): bind each to its tenant, or let one read every "
                    "tenant: SELECT replaysafe.bind_role_to_all_tenants(p_role => '<role>') "
                    "(docs/isolation.md#all-tenant-roles)")
        assert scope is not None
        if scope["reads_actions"]:
            counts = {r["state"]: r["actions"] for r in _rows(conn, "counts_by_state")}
            counts_scope = "every tenant" if scope["owner"] else "the tenants this role may read"
    ok = all(c["ok"] for c in checks)

    def human() -> str:
        lines = [f"{'ok  ' if c['ok'] else 'FAIL'}  {c['check']}: {c['detail']}" for c in checks]
        lines += [f"note  {a}" for a in advice]
        if installed and counts_scope is None:
            lines.append(f"actions by state: not shown ({info['role']} may not read "
                         "replaysafe.actions_v; the schema owner or a replaysafe role may)")
        elif installed:
            states = [s.value for s in ActionState]
            lines.append("actions by state: " + ", ".join(f"{s} {counts.get(s, 0)}" for s in states)
                         + ("" if counts_scope == "every tenant" else
                            f" (as {info['role']}, not the schema owner: only the tenants it may "
                            "read; every check above is complete for any role)"))
        return "\n".join(lines)

    _emit(ctx, human, {"ok": ok, "checks": checks, "advice": advice, "counts": counts,
                       "counts_scope": counts_scope, "revision": current, "head": head})
    if not ok:
        ctx.exit(EXIT_ATTENTION)


def _grant_checks(conn: psycopg.Connection[Any], *, owner: bool) -> list[dict[str, Any]]:
    """Logins that can grant themselves a tenant: issuers that also act, and (as the owner,
    who reads the bindings) unbound logins of a group role that are members of bound roles."""
    both = _rows(conn, "issuers_with_duties")
    checks = [{"check": "issuers", "ok": not both, "detail": "no login both issues tenant grants "
               "and acts" if not both else "; ".join(
                   f"{r['role']} is a member of replaysafe_issuer and of {', '.join(r['duties'])}"
                   for r in both) + ": an issuer must not act (docs/isolation.md#tenant-grants)"}]
    if owner:
        pooled = _rows(conn, "pooled_logins_in_bound_roles")
        checks.append({"check": "pooled logins", "ok": not pooled, "detail": (
            "no unbound login of a group role is a member of a bound role" if not pooled
            else "; ".join(f"{r['role']} is a member of bound role(s) {', '.join(r['bound_roles'])}"
                           for r in pooled)
            + ": with SET ROLE it acts for their tenants without a grant; REVOKE them "
            "(docs/isolation.md#tenant-grants)")})
    return checks


# What doctor recommends a worker login sets, and to what (docs/deploying.md#timeouts).
WORKER_TIMEOUTS = {"idle_in_transaction_session_timeout": "30s", "statement_timeout": "30s"}
# Role defaults that weaken the ledger: an acknowledged claim lost in a crash runs the tool
# again; a read-only default refuses every write.
WORKER_HAZARDS = {"synchronous_commit": ("off",), "default_transaction_read_only": ("on", "true")}
# A duration setting that is zero: the timeout is off ('0', '0s', '0ms', ...).
_ZERO = re.compile(r"^\s*0+(\.0*)?\s*(us|ms|s|min|h|d)?\s*$")


def _timeout_advice(rows: list[dict[str, Any]]) -> list[str]:
    """Advice, not failures: for each worker login, the settings its sessions here get (the
    most specific level wins) that leave a recommended timeout unset or weaken the ledger."""
    effective: dict[str, dict[str, str]] = {}
    for row in sorted(rows, key=lambda r: -r["level"]):
        values = effective.setdefault(row["role"], {})
        for setting in row["settings"] or []:
            name, _, value = setting.partition("=")
            values[name] = value
    advice = []
    for role, values in effective.items():
        quoted = '"' + role.replace('"', '""') + '"'
        unset = [t for t in WORKER_TIMEOUTS if _ZERO.match(values.get(t, "0") or "0")]
        if unset:
            advice.append(f"worker login {role} sets no {' and no '.join(unset)}: " + "; ".join(
                f"ALTER ROLE {quoted} SET {t} = '{WORKER_TIMEOUTS[t]}'" for t in unset)
                + " (docs/deploying.md)")
        for name, bad in WORKER_HAZARDS.items():
            if values.get(name, "").lower() in bad:
                advice.append(f"worker login {role} runs with {name} = {values[name]}: "
                              f"ALTER ROLE {quoted} RESET {name} (docs/deploying.md)")
    return advice


def _schema_object_checks(objects: list[dict[str, Any]], *, complete: bool,
                          citus: bool = False) -> list[dict[str, Any]]:
    """Objects the migration did not create, objects of another owner, functions whose
    search_path is not pinned: each can run a stranger's code as the schema owner. With
    ``complete`` (at head), also what the migration creates and is missing (a damaged
    schema). On Citus, what ``migrate --citus`` adds is the migration's too."""
    expected = schema.expected_objects()
    if citus:
        for kind, names in schema.expected_citus_objects().items():
            expected[kind] = expected[kind] | names
    present = {(o["kind"], o["name"]) for o in objects}
    missing = sorted(f"{kind} {name}" for kind in ("table", "view", "function", "type")
                     for name in expected[kind] if (kind, name) not in present)
    overloads: dict[str, list[str]] = {}
    foreign, strangers, unpinned = [], [], []
    for o in objects:
        label = f"{o['kind']} {o['signature']}"
        if not o["owned_by_schema_owner"]:
            foreign.append(f"{label} (owner {o['owner']})")
        if o["kind"] == "function":
            overloads.setdefault(o["name"], []).append(o["signature"])
            if not o["search_path_pinned"]:
                unpinned.append(label)
        if o["name"] not in expected.get(o["kind"], set()):
            strangers.append(label)
    # The migration creates one function of each name: of several, it cannot tell which is
    # the stranger (the owner and pinned-path checks usually can), so it names them all.
    strangers += [f"{len(sigs)} functions named {name} (the migration creates one): "
                  + ", ".join(sigs) for name, sigs in overloads.items()
                  if len(sigs) > 1 and name in expected["function"]]
    checks = [
        {"check": "schema objects created by the migration", "ok": not strangers,
         "detail": "yes" if not strangers else "NOT created by the migration: " + ", ".join(strangers)},
        {"check": "schema objects owned by the schema owner", "ok": not foreign,
         "detail": "yes" if not foreign else "owned by another role: " + ", ".join(foreign)},
        {"check": "functions pin search_path", "ok": not unpinned,
         "detail": "yes" if not unpinned else "NOT pinned: " + ", ".join(unpinned)},
    ]
    if complete:
        checks.insert(0, {"check": "schema objects the migration creates", "ok": not missing,
                          "detail": "all present" if not missing
                          else "MISSING: " + ", ".join(missing)})
    return checks


def _citus_check(tables: list[dict[str, Any]], lookups: list[dict[str, Any]]) -> dict[str, Any]:
    """On a Citus database: replaysafe left on the coordinator (never distributed) is fine;
    once distributed, every table must be as ``migrate --citus`` makes it (docs/scale-out.md)."""
    reference, distributed = schema.citus_layout()
    if all(t["method"] is None for t in tables):
        return {"check": "Citus distribution", "ok": True,
                "detail": "Citus is installed; replaysafe is not distributed (its tables stay on "
                          "the coordinator; `migrate --citus` distributes them)"}
    wrong = []
    for t in tables:
        name = t["table_name"]
        if name in reference and not (t["method"] == "n" and t["repmodel"] == "t"):
            wrong.append(f"{name} is not a reference table")
        elif name in distributed and not (t["method"] == "h" and t["distribution_column"] == "tenant_id"
                                          and t["with_actions"]):
            wrong.append(f"{name} is not distributed by tenant_id with replaysafe.actions")
        elif name not in reference and name not in distributed:
            wrong.append(f"{name} is unknown to the Citus script")
    wrong += [f"{v['name']} does not look bindings up per node" for v in lookups if not v["per_node"]]
    return {"check": "Citus distribution", "ok": not wrong,
            "detail": "every table distributed by tenant, bindings per node" if not wrong
            else "; ".join(wrong) + ": run `replaysafe-pg migrate --citus`"}


_GRANTED_PRIVILEGE = {"function": "EXECUTE", "view": "SELECT", "schema": "USAGE"}


def _privilege_checks(grants: list[dict[str, Any]],
                      defaults: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Privileges other than those sql/grants.sql grants (a GRANT by hand can cross the
    duties, e.g. resolve_action to the workers), and default privileges that would grant more
    on the schema's next objects."""
    expected = schema.expected_grants()
    unexpected = [
        f"{g['privilege']} on {g['kind']} {g['signature']} to {g['grantee']}" for g in grants
        if (g["kind"], g["name"], g["grantee"]) not in expected
        or g["privilege"] != _GRANTED_PRIVILEGE.get(g["kind"])]
    stray = [f"{d['creator']} grants {d['privilege']} on new {d['objects']} in {d['in_schema']} "
             f"to {d['grantee']}" for d in defaults]
    return [
        {"check": "privileges only as the migration grants them", "ok": not unexpected,
         "detail": "yes" if not unexpected else "NOT granted by the migration: "
         + ", ".join(unexpected)},
        {"check": "no default privileges on the schema's objects", "ok": not stray,
         "detail": "none" if not stray else "ALTER DEFAULT PRIVILEGES: " + ", ".join(stray)},
    ]


# --- actions --------------------------------------------------------------------------------

@main.group(cls=_Group)
@global_options
def actions() -> None:
    """List and inspect actions."""


_LIST_COLUMNS = ["tenant_id", "action_key", "operation", "state", "attempt", "thread_id",
                 "created_at", "updated_at"]


@actions.command("list")
@global_options
@_TENANT_ALL
@click.option("--state", "states", multiple=True,
              type=click.Choice([s.value for s in ActionState]), help="Only these states (repeatable).")
@click.option("--operation", default=None, help="Only this operation.")
@click.option("--thread", "thread_id", default=None, help="Only actions of this thread.")
@click.option("--older-than", type=Duration(), default=None,
              help="Only actions created longer ago than this (7d, 2h, 30m).")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.pass_context
@_with_conn
def actions_list(ctx: click.Context, conn: psycopg.Connection[Any], tenant_id: str | None,
                 states: tuple[str, ...], operation: str | None, thread_id: str | None,
                 older_than: timedelta | None, limit: int) -> None:
    """List actions, newest first."""
    rows = _rows(conn, "list_actions", {
        "tenant_id": tenant_id, "states": list(states), "operation": operation,
        "thread_id": thread_id, "older_than": older_than, "limit": limit})
    _emit(ctx, lambda: render.table(rows, _LIST_COLUMNS) if rows else "no actions", rows)


@actions.command("show")
@global_options
@click.argument("key")
@_TENANT_ONE
@click.pass_context
@_with_conn
def actions_show(ctx: click.Context, conn: psycopg.Connection[Any], key: str,
                 tenant_id: str) -> None:
    """Show one action and all its attempts."""
    ledger = Ledger(conn, tenant_id=tenant_id)
    action = ledger.get(key)
    if action is None:
        raise NotFound(f"no action {key} for tenant {tenant_id}")
    attempts = ledger.attempts(key)

    def human() -> str:
        pairs = [(f.replace("_", " "), getattr(action, f)) for f in action.__slots__]
        text = render.fields(pairs)
        rows = [dataclasses.asdict(a) for a in attempts]
        cols = ["attempt", "worker_id", "claimed_at", "ended_at", "outcome", "superseded", "error"]
        return text + "\n\nattempts:\n" + render.table(rows, cols)

    _emit(ctx, human, {"action": action, "attempts": attempts})


# --- audit ----------------------------------------------------------------------------------

@main.command()
@global_options
@_TENANT_ALL
@click.pass_context
@_with_conn
def audit(ctx: click.Context, conn: psycopg.Connection[Any], tenant_id: str | None) -> None:
    """Actions that need attention; exit status 1 when there are any (for cron)."""
    unresolved = _rows(conn, "unresolved_actions", {"tenant_id": tenant_id})
    multi = _rows(conn, "multi_effect_actions", {"tenant_id": tenant_id})

    def human() -> str:
        parts = []
        if unresolved:
            parts.append("unresolved actions (unknown, or running with an expired lease):\n"
                         + render.table(unresolved, ["tenant_id", "action_key", "operation",
                                                     "state", "age", "lease_expires_at"]))
        if multi:
            parts.append("actions whose effect happened more than once:\n"
                         + render.table(multi, ["tenant_id", "action_key", "operation",
                                                "successful_attempts"]))
        return "\n\n".join(parts) if parts else "nothing needs attention"

    _emit(ctx, human, {"unresolved_actions": unresolved, "multi_effect_actions": multi})
    if unresolved or multi:
        ctx.exit(EXIT_ATTENTION)


# --- resolve, sweep, purge ------------------------------------------------------------------

@main.command()
@global_options
@click.argument("key")
@_TENANT_ONE
@click.option("--state", required=True, type=click.Choice(["succeeded", "failed", "retryable"]),
              help="What the action turned out to be.")
@click.option("--result", type=JsonValue(), default=None, help="Result to record (JSON).")
@click.option("--error", type=JsonValue(), default=None, help="Error to record (JSON).")
@click.option("--provider-reference", default=None, help="The provider's id of the effect.")
@click.option("--note", default=None, help="Why: kept on the action for the audit trail.")
@click.pass_context
@_with_conn
def resolve(ctx: click.Context, conn: psycopg.Connection[Any], key: str, tenant_id: str,
            state: str, result: Any, error: Any, provider_reference: str | None,
            note: str | None) -> None:
    """Reconcile an unknown action to succeeded, failed or retryable."""
    ledger = Ledger(conn, tenant_id=tenant_id)
    if ledger.get(key) is None:
        raise NotFound(f"no action {key} for tenant {tenant_id}")
    new = ledger.resolve(key, state, result=result, error=error,
                         provider_reference=provider_reference, note=note)
    _emit(ctx, f"resolved {render.escape(key)} (tenant {render.escape(tenant_id)}): "
               f"unknown -> {new.value}",
          {"tenant_id": tenant_id, "action_key": key, "state": new})


@main.command()
@global_options
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True,
              help="At most this many expired leases.")
@click.pass_context
@_with_conn
def sweep(ctx: click.Context, conn: psycopg.Connection[Any], limit: int) -> None:
    """Turn expired running leases into unknown (or retryable under on_expired='reclaim')."""
    count = Ledger(conn).sweep(limit=limit)
    _emit(ctx, f"swept {count} expired lease(s)", {"swept": count})


@main.command()
@global_options
@click.option("--older-than", type=Duration(), required=True,
              help="Delete terminal actions finished longer ago than this (7d, 12h).")
@click.option("--batch-size", type=click.IntRange(min=1), default=10000, show_default=True,
              help="Actions deleted per transaction.")
@click.option("--yes", "-y", "yes", is_flag=True,
              help="Do not ask for confirmation (needed when stdin is not a terminal).")
@click.option("--dry-run", is_flag=True, help="Only count what would be deleted.")
@click.pass_context
@_with_conn
def purge(ctx: click.Context, conn: psycopg.Connection[Any], older_than: timedelta,
          batch_size: int, yes: bool, dry_run: bool) -> None:
    """Delete old succeeded/failed actions in batches (safe while workers run).

    Shows how many actions would go and asks before deleting; --yes skips the question,
    which a run without a terminal (cron, CI) must pass."""
    # One cutoff for the whole run: rows finishing meanwhile do not keep the loop going.
    now: datetime = _rows(conn, "database_now")[0]["now"]
    cutoff = now - older_than
    expected = _rows(conn, "purge_candidates", {"now": now, "older_than": older_than})[0]["count"]
    what = f"{expected} succeeded/failed action(s) finished before {cutoff:%Y-%m-%d %H:%M:%S%z}"
    if dry_run:
        _emit(ctx, f"would purge {what} (dry run, nothing deleted)",
              {"dry_run": True, "would_purge": expected, "cutoff": cutoff})
        return
    if expected and not yes:
        if not sys.stdin.isatty():
            raise CliError(f"purge would delete {what}: pass --yes to confirm "
                           "(--dry-run only counts)")
        if not click.confirm(f"delete {what}?", err=True):
            raise CliError("nothing purged (not confirmed)")
    ledger = Ledger(conn)
    total = 0
    batches = 0
    with click.progressbar(length=max(expected, 1), label="purging", file=sys.stderr,
                           show_pos=True, hidden=_state(ctx).json) as bar:
        while True:
            # Each batch is its own transaction (autocommit): locks are short, and rows a
            # worker holds are skipped, not waited for.
            deleted = ledger.purge(older_than, limit=batch_size, now=now)
            total += deleted
            batches += deleted > 0
            bar.update(deleted)
            # Across tenants a batch is shared out round-robin and may be short while more
            # is due: only an empty batch ends the run.
            if deleted == 0:
                break
    _emit(ctx, f"purged {total} action(s) finished before {cutoff:%Y-%m-%d %H:%M:%S%z} "
               f"in {batches} batch(es)",
          {"purged": total, "batches": batches, "cutoff": cutoff})


# --- reconcile, reopen ----------------------------------------------------------------------

def _operator_duty(conn: psycopg.Connection[Any], what: str, exc: AccessDenied) -> CliError:
    """The one-line error of a role that is not an operator trying an operator's duty."""
    try:
        role = str(_rows(conn, "server_info")[0]["role"])
    except Exception:
        role = "this role"
    detail = first_line(exc).removeprefix("access denied: ")
    return CliError(f"access denied: {what} is replaysafe_operator's duty and {role} is not "
                    f"one ({detail}); connect as a role granted replaysafe_operator "
                    "(docs/isolation.md)")


def _untrusted(path: str) -> str | None:
    """Why ``path`` (a directory, a file that could be loaded) is not to be trusted with code
    that runs with an operator's credentials, or None: it is a symbolic link (refused, not
    followed: what it points to is elsewhere), it is owned by a user other than this one and
    root (root can change any file anyway), or its group or others may write to it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None  # nothing there to load
    if stat.S_ISLNK(st.st_mode):
        try:
            target = f" to {os.readlink(path)}"
        except OSError:
            target = ""
        return f"is a symbolic link{target} (links are not followed: copy the file instead)"
    if st.st_uid not in (os.geteuid(), 0):
        try:
            import pwd

            owner = f"user {st.st_uid} ({pwd.getpwuid(st.st_uid).pw_name})"
        except (ImportError, KeyError):
            owner = f"user {st.st_uid}"
        return f"is owned by {owner}, not you"
    if st.st_mode & 0o022:
        who = "its group and others" if st.st_mode & 0o022 == 0o022 else (
            "its group" if st.st_mode & 0o020 else "others")
        return f"may be written by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _under(path: str, directory: str) -> bool:
    return os.path.commonpath([path, directory]) == directory


def _places_in(spec: importlib.machinery.ModuleSpec, directory: str) -> list[str]:
    """Where in ``directory`` a module's spec would load it from (its file, a package's
    directories), as the finder names them (abspath: a symbolic link in ``directory`` is
    where it is, not where it points); also a place elsewhere that is in ``directory`` once
    resolved."""
    places = [spec.origin] if spec.origin and spec.has_location else []
    places += list(spec.submodule_search_locations or ())
    found: list[str] = []
    for place in places:
        named = os.path.abspath(place)
        if _under(named, directory):
            found.append(named)
        elif _under(real := os.path.realpath(place), directory):
            found.append(real)
    return found


# What the import system may load for a module NAME in a directory: NAME.py, NAME.pyc (a
# sourceless module), an extension module NAME.<suffix>.so; compiled, __pycache__/NAME.*.pyc.
_LOADABLE = tuple(importlib.machinery.all_suffixes())
_PYCACHE = "__pycache__"


def _entries(directory: str) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except OSError:
        return []  # not a directory (a zip archive on the path: itself checked) or gone


def _module_files(directory: str, name: str) -> list[str]:
    """Every file in ``directory`` the import system could load for module ``name`` (the
    last part of its dotted name), whichever of them it would pick."""
    files = [os.path.join(directory, e) for e in _entries(directory)
             if e.startswith(name + ".") and e.endswith(_LOADABLE)]
    cache = os.path.join(directory, _PYCACHE)
    if os.path.isdir(cache) and not os.path.islink(cache):
        files += [os.path.join(cache, e) for e in _entries(cache)
                  if e.startswith(name + ".") and e.endswith(".pyc")]
    if sys.pycache_prefix is not None:  # compiled files kept elsewhere
        for source in [f for f in files if f.endswith(tuple(importlib.machinery.SOURCE_SUFFIXES))]:
            compiled = importlib.util.cache_from_source(source)
            files += [os.path.dirname(compiled), compiled]
    return files


def _loadable(directory: str, name: str) -> list[str]:
    """What must be trusted for module ``name`` (the last part of its dotted name) found in
    ``directory``: its files there, and when ``directory/name`` is a package's directory,
    that directory, its ``__pycache__`` and its ``__init__`` files."""
    paths = _module_files(directory, name)
    package = os.path.join(directory, name)
    if os.path.lexists(package):
        paths.append(package)
        if os.path.isdir(package) and not os.path.islink(package):
            paths.append(os.path.join(package, _PYCACHE))
            paths += _module_files(package, "__init__")
    return paths


def _directories(deepest: str, directory: str) -> list[str]:
    """``directory`` and every directory under it down to ``deepest``, each with its
    ``__pycache__``; a link or file on the way ends the list (it is checked, and refused
    when a link)."""
    parts = os.path.relpath(deepest, directory).split(os.sep)
    chain = [directory]
    for part in parts if parts != ["."] else []:
        chain.append(os.path.join(chain[-1], part))
    found: list[str] = []
    for d in chain:
        found.append(d)
        if os.path.islink(d) or not os.path.isdir(d):
            break
        found.append(os.path.join(d, _PYCACHE))
    return found


def _find_spec(name: str, path: list[str]) -> importlib.machinery.ModuleSpec | None:
    """The spec of submodule ``name`` the import system would find in ``path`` (its parent
    package's directories), without importing anything."""
    for finder in sys.meta_path:
        try:
            spec = finder.find_spec(name, path)
        except (ImportError, ValueError, AttributeError):
            continue
        if spec is not None:
            return spec
    return None


def _distrust(spec: importlib.machinery.ModuleSpec, cwd: str, checked: set[str]) -> str | None:
    """Why a module to be loaded through ``spec`` is not to be trusted, or None: everything
    of it the import system could load from under ``cwd``, and every directory on the way
    there, must be this user's or root's, no one else's to write, and not a symbolic link.
    ``checked``: the paths already found trusted (for the parts of a dotted name before)."""
    places = _places_in(spec, cwd)
    if not places:
        return None  # from the path, outside the current directory: installed
    shown = os.path.relpath(places[0], cwd) + ("/" if os.path.isdir(places[0]) else "")
    for place in places:
        # The finder looked in the directory holding ``place`` for its name: a module's
        # file (mod.py, mod.<suffix>.so; a package's __init__.py), or a package's directory.
        directory, name = os.path.dirname(place), os.path.basename(place).split(".", 1)[0]
        for path in [*_directories(directory, cwd), *_loadable(directory, name)]:
            if path in checked:
                continue
            why = _untrusted(path)
            if why is None:
                checked.add(path)
                continue
            if os.path.basename(path) == _PYCACHE:
                return (f"the module {shown} is in {os.path.dirname(path)}, whose {_PYCACHE} "
                        f"(a compiled file there runs instead of the source) {why}")
            if os.path.isdir(path):
                return f"the module {shown} is in {path}, which {why}"
            if path == places[0]:
                return f"the module {shown} in {cwd} {why}"
            named = os.path.relpath(path, cwd) if _under(path, cwd) else path
            return f"the module {shown} in {cwd} could be loaded from {named}, which {why}"
    return None


def _lookups_module_path(module_name: str) -> None:
    """Make ``module_name`` importable as ``load_lookups`` allows: from the path as it is
    (an installed module is never shadowed), else from the current directory (appended to
    the path last). Refused, saying why, when any part of the dotted name would come from
    under the current directory and that directory, one on the way to the module, a
    ``__pycache__`` of them or a file that could be loaded for it is another user's, may be
    written by others, or is a symbolic link. Nothing is imported to find out."""
    cwd = os.path.realpath(os.getcwd())
    parts = module_name.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])  # a top-level name: nothing of it runs
    except (ImportError, ValueError):
        return  # importing it says what is wrong
    appended = False
    if spec is None:
        spec = importlib.machinery.PathFinder.find_spec(parts[0], [cwd])
        if spec is None:
            return  # nowhere: importing it says so
        appended = True
    checked: set[str] = set()
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        if depth > 1:
            parent = sys.modules.get(".".join(parts[:depth - 1]))
            locations = (getattr(parent, "__path__", None) if parent is not None
                         else spec.submodule_search_locations)
            if not locations:
                break  # not a package: importing it says so
            spec = _find_spec(name, list(locations))
            if spec is None:
                break  # nowhere: importing it says so
        if name in sys.modules:
            continue  # already imported: nothing of it is loaded again
        where = _distrust(spec, cwd, checked)
        if where is not None:
            raise CliError(f"--lookups: {where}: the lookups run with an operator's "
                           "credentials; install the module or run from a directory only "
                           "you can write to")
    if appended and cwd not in sys.path:
        sys.path.append(cwd)


def load_lookups(spec: str) -> dict[str, Lookup]:
    """``MODULE:ATTR``: the mapping of operation to lookup that ``reconcile`` uses. MODULE is
    found on the path, then in the current directory (appended last: a file there never
    shadows an installed module). A module (or package of a dotted MODULE) that would come
    from under the current directory is refused, saying why, before anything is imported,
    when that directory, a directory on the way to the module, a ``__pycache__`` of them or
    a file that could be loaded for it (source, compiled, sourceless ``.pyc``, extension
    module) is owned by another user (root excepted), writable by its group or others, or a
    symbolic link: the lookups run with an operator's credentials."""
    module_name, sep, attr = spec.partition(":")
    if not (sep and module_name and attr):
        raise CliError(f"--lookups must be MODULE:ATTR, e.g. myapp.reconcile:LOOKUPS (got {spec!r})")
    _lookups_module_path(module_name)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise CliError(f"--lookups: cannot import {module_name}: "
                       f"{type(exc).__name__}: {first_line(exc)}") from None
    try:
        value = functools.reduce(getattr, attr.split("."), module)
    except AttributeError:
        raise CliError(f"--lookups: module {module_name} has no attribute {attr}") from None
    if not isinstance(value, Mapping):
        raise CliError(f"--lookups: {spec} is a {type(value).__name__}, not a mapping of "
                       "operation name to lookup")
    for operation, lookup in value.items():
        if not isinstance(operation, str) or not callable(lookup):
            raise CliError(f"--lookups: {spec} must map operation names to callables "
                           f"({operation!r} maps to a {type(lookup).__name__})")
    if not value:
        raise CliError(f"--lookups: {spec} maps no operation")
    return dict(value)


def _lookups_option(_ctx: click.Context, _param: click.Parameter, value: str) -> dict[str, Lookup]:
    return load_lookups(value)


# A batch this long (actions due) gets a progress bar on stderr.
PROGRESS_MIN = 20
_SETTLED = {ReconcileOutcome.SUCCEEDED, ReconcileOutcome.FAILED, ReconcileOutcome.RETRYABLE,
            ReconcileOutcome.ALREADY_RESOLVED}


@dataclass
class ReconcileBatch:
    """What one pass of ``reconcile`` did, over every tenant it looked at. ``looked_up``: the
    operations it had a lookup for (one of those skipped, its row held by another
    transaction, stays unknown). ``errors``: the tenants whose pass stopped on an error, and
    what it was (the others went on)."""

    tenants: list[str]
    results: list[Reconciliation]
    dry_run: bool
    looked_up: frozenset[str] = frozenset()
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """0 every action with a lookup settled; 1 some stay unknown; 2 an error (a lookup
        failed, a row could not be read, a tenant's pass stopped)."""
        outcomes = {r.outcome for r in self.results}
        if ReconcileOutcome.ERROR in outcomes or self.errors:
            return EXIT_ERROR
        if ReconcileOutcome.LEFT_UNKNOWN in outcomes or any(
                r.outcome is ReconcileOutcome.SKIPPED and r.operation in self.looked_up
                for r in self.results):
            return EXIT_ATTENTION
        return 0

    def summary(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.results:
            counts[r.outcome.value] = counts.get(r.outcome.value, 0) + 1
        return counts

    def data(self) -> dict[str, Any]:
        out = {"dry_run": self.dry_run, "tenants": self.tenants, "summary": self.summary(),
               "results": self.results}
        if self.errors:  # only when some tenant's pass stopped
            out["errors"] = [{"tenant_id": t, "error": e} for t, e in self.errors.items()]
        return out

    def human(self, at: datetime | None = None) -> str:
        """The table, the tenants in error, and a summary line (``at``: the batch's time, to
        start it with)."""
        stamp = "" if at is None else f"{at:%Y-%m-%d %H:%M:%S%z}: "
        if not self.results and not self.errors:
            return f"{stamp}no unknown actions to reconcile"
        lines = []
        if self.results:
            rows = [render.jsonable(r) | {"outcome": r.outcome.value, "note": _shown_note(r)}
                    for r in self.results]
            lines.append(render.table(rows, ["tenant_id", "action_key", "operation", "attempt",
                                             "outcome", "provider_reference", "note"],
                                      cut_at={"note": 200}))
        lines += [f"tenant {render.escape(t)}: stopped on an error, its actions not reached stay "
                  f"unknown: {render.escape(e)}" for t, e in self.errors.items()]
        counts = ", ".join(f"{k} {v}" for k, v in self.summary().items()) or "none read"
        head = "dry run, nothing written: " if self.dry_run else ""
        tail = f"; {len(self.errors)} tenant(s) stopped on an error" if self.errors else ""
        lines.append(f"{stamp}{head}{len(self.results)} unknown action(s) in "
                     f"{len(self.tenants)} tenant(s): {counts}{tail}")
        return "\n".join(lines)


def _shown_note(r: Reconciliation) -> str | None:
    if r.outcome is ReconcileOutcome.ERROR:
        return r.error
    if r.outcome is ReconcileOutcome.ALREADY_RESOLVED and r.note != GONE_NOTE:
        return "settled by someone else since the lookup: nothing written"
    return r.note


def shares(due: Sequence[int], limit: int) -> list[int]:
    """How many of each tenant's ``due`` actions one pass of at most ``limit`` takes on:
    round-robin, one each in turn, so that one tenant's backlog never starves the others."""
    taken = [0] * len(due)
    left = limit
    while left > 0:
        open_ = [i for i, n in enumerate(due) if taken[i] < n]
        if not open_:
            break
        each = max(1, left // len(open_))
        for i in open_:
            more = min(each, due[i] - taken[i], left)
            taken[i] += more
            left -= more
            if left == 0:
                break
    return taken


def reconcile_batch(conn: psycopg.Connection[Any], lookups: Mapping[str, Lookup], *,
                    tenant_id: str | None, limit: int, older_than: timedelta, not_found: str,
                    dry_run: bool, concurrency: int, progress: bool) -> ReconcileBatch:
    """One pass: up to ``limit`` due ``unknown`` actions over the tenants (one, or every tenant
    the role sees with some), settled through ``Ledger.reconcile``, tenant by tenant: the
    tenant whose oldest has waited longest first, each its round-robin share of ``limit``
    (:func:`shares`). A role that may not settle gets one line naming replaysafe_operator
    (raised at the first write). Any other error of one tenant's pass is recorded for that
    tenant (:attr:`ReconcileBatch.errors`) and the pass goes on with the others, unless the
    connection is gone with it."""
    due = _rows(conn, "unknown_due", {"tenant_id": tenant_id, "older_than": older_than})
    quotas = shares([int(r["due"]) for r in due], limit)
    total = sum(quotas)
    tenants = [str(r["tenant_id"]) for r in due]
    results: list[Reconciliation] = []
    errors: dict[str, str] = {}
    lock = threading.Lock()
    with click.progressbar(length=max(total, 1), label="reconciling", file=sys.stderr,
                           show_pos=True, hidden=not progress or total < PROGRESS_MIN) as bar:
        asked = [0]

        def tick() -> None:
            with lock:
                asked[0] += 1
                bar.update(1)

        def counted(lookup: Lookup) -> Lookup:
            def ask(action: Any) -> Any:
                try:
                    return lookup(action)
                finally:
                    tick()
            return ask

        watched = {op: counted(fn) for op, fn in lookups.items()} if progress else lookups
        for tenant, quota in zip(tenants, quotas, strict=True):
            if quota <= 0:
                continue
            before = asked[0]
            try:
                done = Ledger(conn, tenant_id=tenant).reconcile(
                    watched, limit=quota, older_than=older_than, not_found=not_found,
                    dry_run=dry_run, concurrency=concurrency)
            except AccessDenied as exc:
                raise _operator_duty(conn, "reconciling", exc) from None
            except (ReplaysafeError, psycopg.Error) as exc:
                if conn.closed or conn.broken:  # nothing more can be sent on it
                    raise
                errors[tenant] = _tenant_error(exc)
                with lock:
                    bar.update(quota - (asked[0] - before))  # the ones it did not reach
                continue
            with lock:
                bar.update(len(done) - (asked[0] - before))  # the skipped ones
            results += done
    return ReconcileBatch([t for t in tenants
                           if t in errors or any(r.tenant_id == t for r in results)],
                          results, dry_run, frozenset(lookups), errors)


def _tenant_error(exc: BaseException) -> str:
    """What stopped a tenant's pass, in one line: the server's SQLSTATE when it has one."""
    cause = exc.__cause__ if isinstance(exc, ReplaysafeError) else exc
    state = getattr(cause, "sqlstate", None)
    return f"{type(exc).__name__}{f' (SQLSTATE {state})' if state else ''}: {first_line(exc)}"


class Stop:
    """A stop request for the reconcile loop: set by SIGTERM (or by a test), checked between
    batches; the wait between batches ends early when it is set."""

    def __init__(self) -> None:
        self.requested = False

    def request(self, *_args: Any) -> None:
        self.requested = True

    def wait(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.requested and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(0.1, left))


def reconcile_loop(batch: Callable[[], ReconcileBatch], *, interval: float, stop: Stop,
                   report: Callable[[ReconcileBatch], None]) -> ReconcileBatch:
    """Run ``batch`` every ``interval`` seconds until ``stop`` is requested; a batch under
    way is finished first. Returns the last batch (its exit code is the command's)."""
    while True:
        last = batch()
        report(last)
        if stop.requested:
            return last
        stop.wait(interval)
        if stop.requested:
            return last


@main.command()
@global_options
@click.option("--lookups", "lookups", required=True, metavar="MODULE:ATTR",
              callback=_lookups_option,
              help="A mapping of operation name to lookup(action) -> Succeeded | Failed | "
                   "NotFound, e.g. myapp.reconcile:LOOKUPS.")
@_TENANT_ALL
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help="At most this many unknown actions per batch, oldest first.")
@click.option("--older-than", type=Duration(), default="0s", show_default=True,
              help="Only actions unknown for longer than this (30s, 5m, 2h).")
@click.option("--not-found", type=click.Choice(["retry", "leave"]), default="retry",
              show_default=True,
              help="What NotFound means: retry (the action becomes retryable) or leave it "
                   "unknown (for providers that forget idempotency keys).")
@click.option("--concurrency", type=click.IntRange(min=1), default=8, show_default=True,
              help="Lookups in flight at once.")
@click.option("--dry-run", is_flag=True, help="Ask the provider, write nothing, show what "
                                              "would be done.")
@click.option("--loop", "loop", is_flag=True,
              help="Keep reconciling, a batch every --interval, until SIGTERM.")
@click.option("--interval", type=Duration(), default="60s", show_default=True,
              help="With --loop: the pause between batches.")
@click.pass_context
@_with_conn
def reconcile(ctx: click.Context, conn: psycopg.Connection[Any], lookups: dict[str, Lookup],
              tenant_id: str | None, limit: int, older_than: timedelta, not_found: str,
              concurrency: int, dry_run: bool, loop: bool, interval: timedelta) -> None:
    """Settle unknown actions by asking the provider (replaysafe_operator's duty).

    Exit status 0 when every action with a lookup was settled, 1 when some stay unknown
    (left unknown, or skipped: held by another transaction), 2 on errors (a lookup that
    raised, a row that cannot be read)."""
    json_out = _state(ctx).json

    def batch() -> ReconcileBatch:
        return reconcile_batch(conn, lookups, tenant_id=tenant_id, limit=limit,
                               older_than=older_than, not_found=not_found, dry_run=dry_run,
                               concurrency=concurrency, progress=not json_out)

    if not loop:
        last = batch()
        _emit(ctx, last.human, last.data())
    else:
        def report(b: ReconcileBatch) -> None:
            at = datetime.now().astimezone()
            if json_out:
                click.echo(render.dumps({"at": at} | b.data(), line=True))
            else:
                click.echo(render.escape(b.human(at), keep_newlines=True))

        stop = Stop()
        in_main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, stop.request) if in_main else None
        try:
            last = reconcile_loop(batch, interval=interval.total_seconds(), stop=stop,
                                  report=report)
        finally:
            if in_main:
                signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    failed = [r for r in last.results if r.outcome is ReconcileOutcome.ERROR]
    problems = []
    if last.errors:
        tenant, error = next(iter(last.errors.items()))
        problems.append(f"{len(last.errors)} tenant(s) stopped on an error (first: {tenant}: "
                        f"{error})")
    if failed:
        lookups_failed = all((r.error or "").startswith("the lookup") for r in failed)
        what = "lookup(s) failed" if lookups_failed else "action(s) could not be reconciled"
        problems.append(f"{len(failed)} {what}, their actions stay unknown "
                        f"(first: {failed[0].action_key}: {failed[0].error})")
    if problems:
        raise CliError("; ".join(problems))
    ctx.exit(last.exit_code)


@main.command()
@global_options
@click.argument("key")
@_TENANT_ONE
@click.option("--note", required=True,
              help="Why the action may run again: kept on the action (see `actions show`).")
@click.pass_context
@_with_conn
def reopen(ctx: click.Context, conn: psycopg.Connection[Any], key: str, tenant_id: str,
           note: str) -> None:
    """Let a failed action run again: it becomes retryable (replaysafe_operator's duty)."""
    if not note.strip():
        raise CliError("--note must say why the action may run again (it is kept on the action)")
    ledger = Ledger(conn, tenant_id=tenant_id)
    if ledger.get(key) is None:
        raise NotFound(f"no action {key} for tenant {tenant_id}")
    try:
        new = ledger.reopen(key, note=note)
    except AccessDenied as exc:
        raise _operator_duty(conn, "reopening", exc) from None
    _emit(ctx, f"reopened {render.escape(key)} (tenant {render.escape(tenant_id)}): "
               f"failed -> {new.value}",
          {"tenant_id": tenant_id, "action_key": key, "state": new, "note": note})


# --- threads --------------------------------------------------------------------------------

@main.group(cls=_Group)
@global_options
def threads() -> None:
    """Inspect versioned thread state."""


_USER = click.option("--user", "user_id", default=None,
                     help="The owning user (required for threads created with a user).")


def _thread_owner_hint(thread_id: str, user_id: str | None, exc: AccessDenied) -> Exception:
    """The thread functions refuse a thread that belongs to another user (or to a user, when
    none is given) with the same error as a tenant the role may not act for."""
    if "user may not use that thread" not in str(exc):
        return exc
    if user_id is None:
        return CliError(f"AccessDenied: thread {thread_id} belongs to a user: pass --user USER "
                        "(the user it was created with)")
    return CliError(f"AccessDenied: thread {thread_id} belongs to another user than {user_id}")


@threads.command("show")
@global_options
@click.argument("thread_id")
@_TENANT_ONE
@_USER
@click.pass_context
@_with_conn
def threads_show(ctx: click.Context, conn: psycopg.Connection[Any], thread_id: str,
                 tenant_id: str, user_id: str | None) -> None:
    """Show the latest state of a thread."""
    with Threads(conn, tenant_id=tenant_id, user_id=user_id) as th:
        try:
            row = dataclasses.asdict(th.read(thread_id))
        except AccessDenied as exc:
            raise _thread_owner_hint(thread_id, user_id, exc) from None
    if row["version"] == 0:
        raise NotFound(f"no thread {thread_id} for tenant {tenant_id}")
    data = {"tenant_id": tenant_id, "thread_id": thread_id, **row,
            "deleted": row["state"] is None}

    def human() -> str:
        head = render.fields([("thread", thread_id), ("tenant", tenant_id),
                              ("version", row["version"]), ("updated at", row["updated_at"])])
        if row["state"] is None:
            return head + f"\n\ndeleted (tombstone at version {row['version']})"
        return head + "\n\n" + render.dumps(row["state"])

    _emit(ctx, human, data)


@threads.command("history")
@global_options
@click.argument("thread_id")
@_TENANT_ONE
@_USER
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.pass_context
@_with_conn
def threads_history(ctx: click.Context, conn: psycopg.Connection[Any], thread_id: str,
                    tenant_id: str, user_id: str | None, limit: int) -> None:
    """List the kept versions of a thread, newest first."""
    with Threads(conn, tenant_id=tenant_id, user_id=user_id) as th:
        try:
            rows = [dataclasses.asdict(v) for v in th.history(thread_id, limit=limit)]
        except AccessDenied as exc:
            raise _thread_owner_hint(thread_id, user_id, exc) from None
    if not rows:
        raise NotFound(f"no thread {thread_id} for tenant {tenant_id}")
    _emit(ctx, lambda: render.table(rows, ["version", "created_at", "state"]), rows)


# --- demo -----------------------------------------------------------------------------------

@main.command()
@global_options
@click.option("--lease", type=click.FloatRange(min=0.2), default=1.5, show_default=True,
              help="Lease of the crashing worker's claim, in seconds.")
@click.pass_context
def demo(ctx: click.Context, lease: float) -> None:
    """The double refund, with and without the ledger (about 10 seconds)."""
    from replaysafe_pg.cli.demo import run_demo

    state = _state(ctx)
    if schema.current_revision(state.db.dsn()) != schema.head_revision():
        raise SchemaNotInstalled("the replaysafe schema is missing or outdated in this database: "
                                 "run `replaysafe-pg migrate` first")
    report = run_demo(state.db.dsn(), lease=timedelta(seconds=lease),
                      say=(lambda _text: None) if state.json else click.echo)
    if state.json:
        click.echo(render.dumps(report))


# --- server ---------------------------------------------------------------------------------

@main.group(cls=_Group)
@global_options
def server() -> None:
    """Keep an embedded Postgres running for your own code.

    `export REPLAYSAFE_DSN=$(replaysafe-pg server start)` starts it (migrated) and gives its
    DSN to your code and to every later replaysafe-pg command. Data in --pgdata (default: the
    embedded server's per-user directory). --dsn and REPLAYSAFE_DSN are ignored here."""


def _server_pgdata(ctx: click.Context) -> Path:
    state = _state(ctx)
    if state.ephemeral:
        raise CliError("--ephemeral makes no sense for a server that outlives the command: "
                       "use --pgdata DIR")
    return (state.pgdata or embedded.default_pgdata()).expanduser().resolve()


def _server_data(status: embedded.ServerStatus) -> dict[str, Any]:
    return {"running": status.running, "pid": status.pid, "pgdata": str(status.pgdata),
            "dsn": status.dsn, "started_at": status.started_at}


@server.command("start")
@global_options
@click.pass_context
def server_start(ctx: click.Context) -> None:
    """Start the server (detached, it keeps running) and migrate it; print its DSN.

    Only the DSN goes to stdout, so `export REPLAYSAFE_DSN=$(replaysafe-pg server start)`
    works. A server already running is left as it is: its DSN is printed again."""
    pgdata = _server_pgdata(ctx)
    try:
        status = embedded.serve(pgdata, notice=lambda text: click.echo(text, err=True))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        raise CliError(f"could not start the embedded Postgres in {pgdata}: "
                       f"{first_line(exc)} (its log: {pgdata / 'log'})") from None
    _emit(ctx, status.dsn or "", _server_data(status))


@server.command("url")
@global_options
@click.pass_context
def server_url(ctx: click.Context) -> None:
    """Print the DSN of the running server (exit status 2 when it is not running)."""
    status = embedded.server_status(_server_pgdata(ctx))
    if not status.running:
        raise CliError(f"no server running on {status.pgdata}: start it with "
                       "`replaysafe-pg server start`")
    _emit(ctx, status.dsn or "", _server_data(status))


@server.command("status")
@global_options
@click.pass_context
def server_status(ctx: click.Context) -> None:
    """Say whether the server runs, with its pid, data directory and DSN.

    Exit status 0 when it runs, 1 when it does not."""
    status = embedded.server_status(_server_pgdata(ctx))

    def human() -> str:
        if not status.running:
            stale = ("" if status.stale_pid is None else
                     f" (its state file named pid {status.stale_pid}, which is gone: removed)")
            return f"not running: {status.pgdata}{stale}"
        return render.fields([("status", "running"), ("pid", status.pid),
                              ("data dir", str(status.pgdata)), ("dsn", status.dsn),
                              ("started at", status.started_at)])

    _emit(ctx, human, _server_data(status) | {"stale_pid": status.stale_pid})
    if not status.running:
        ctx.exit(EXIT_ATTENTION)


@server.command("stop")
@global_options
@click.pass_context
def server_stop(ctx: click.Context) -> None:
    """Stop the server (fast shutdown: open sessions end, committed data stays).

    Stopping a server that is not running is not an error."""
    status = embedded.unserve(_server_pgdata(ctx))
    human = (f"stopped the server of {status.pgdata} (pid {status.pid})" if status.running
             else f"not running: {status.pgdata}")
    _emit(ctx, human, {"stopped": status.running, "pid": status.pid,
                       "pgdata": str(status.pgdata)})


# --- grant (replaysafe_pg/cli/grant.py) -----------------------------------------------------

grant_cli.register(main, group_cls=_Group, options=global_options, with_conn=_with_conn,
                   emit=_emit, duration=Duration())
