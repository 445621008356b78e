"""``replaysafe-pg console``: serve the operator's console (docs/console.md) with uvicorn on
an address of the user's choosing, loopback unless told otherwise, behind a random access
token printed at start. It connects as the user's own login, one connection per request,
with the DSN (or embedded server) every command uses; under ``--grant`` (a pooled login)
every read and write carries the tenant grant."""

from __future__ import annotations

import secrets
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

import click

from replaysafe_pg.cli import render
from replaysafe_pg.cli.metrics_commands import ListenAddress, ListenAddressType, is_loopback
from replaysafe_pg.cli.plumbing import CliError, Command, describe, global_options, state_of

EXTRA_HINT = "pip install 'replaysafe-pg[console]'"


def _listen(address: ListenAddress) -> socket.socket:
    infos = socket.getaddrinfo(address.host or None, address.port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    family, kind, proto, _, where = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(where)
        sock.listen(64)
    except OSError:
        sock.close()
        raise
    return sock


@click.command(cls=Command)
@global_options
@click.option("--serve", "serve_at", type=ListenAddressType(), default="127.0.0.1:8765",
              show_default=True, metavar="HOST:PORT",
              help="Where to listen (a bare PORT: 127.0.0.1; port 0: any free one).")
@click.option("--allow-non-loopback", is_flag=True,
              help="Let --serve listen beyond loopback. Every request still needs the access "
                   "token, but it travels over plain HTTP: put TLS in front.")
@click.option("--grant", "grant", envvar="REPLAYSAFE_GRANT", default=None,
              help="A tenant grant every read and write carries (a pooled login bound to no "
                   "tenant). Env: REPLAYSAFE_GRANT.")
@click.pass_context
def console(ctx: click.Context, serve_at: ListenAddress, allow_non_loopback: bool,
            grant: str | None) -> None:
    """Serve the operator's console: what needs attention, actions with their attempts and
    timeline, threads; resolve and reopen for operators (replaysafe_operator), read-only
    for auditors.

    It acts as the connected role (no credentials are stored) and prints the address to
    open, with a random access token every request must carry. Ctrl-C or SIGTERM stops
    it."""
    try:
        import uvicorn

        from replaysafe_pg.cli.console.app import create_app
        from replaysafe_pg.cli.console.reads import Reader
    except ImportError as exc:
        raise CliError(f"the console needs the console extra ({exc.name} is missing): "
                       f"{EXTRA_HINT}") from None
    loopback = is_loopback(serve_at.host)
    if not loopback and not allow_non_loopback:
        raise CliError(f"--serve {serve_at} is not a loopback address; pass "
                       "--allow-non-loopback to serve the console there (behind TLS)")
    state = state_of(ctx)
    reader = Reader(state.db.connection, grant=grant)
    try:
        caller = reader.caller()
    except LookupError as exc:
        raise CliError(f"{exc}: run 'replaysafe-pg migrate' first") from None
    if not (caller.all_tenants or caller.tenant_id is not None):
        raise CliError(f"{caller.role} acts for no tenant: the console would show nothing "
                       "(docs/isolation.md)")
    try:
        sock = _listen(serve_at)
    except OSError as exc:
        raise CliError(f"cannot listen on {serve_at}: {exc.strerror or exc}") from None
    port = int(sock.getsockname()[1])
    token = secrets.token_urlsafe(32)
    app = create_app(reader, token=token, port=port, loopback=loopback)
    server = uvicorn.Server(uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", server_header=False,
        date_header=False, timeout_graceful_shutdown=5))
    how = _serve(server, sock, announce=lambda: _announce(caller.role, caller.scope,
                                                          caller.duties, serve_at, port, token))
    click.echo("replaysafe-pg: stopped serving the console", err=True)
    if how == signal.SIGINT:
        ctx.exit(130)


def _announce(role: str, scope: str, duties: str, serve_at: ListenAddress, port: int,
              token: str) -> None:
    host = serve_at.host or "0.0.0.0"
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"replaysafe-pg: console for {render.escape(role)} "
               f"({render.escape(scope)}, {render.escape(duties)}) on "
               f"http://{shown}:{port}/", err=True)
    click.echo(f"replaysafe-pg: open http://{shown}:{port}/?token={token} "
               "(Ctrl-C or SIGTERM to stop)", err=True)
    sys.stderr.flush()


def _serve(server: Any, sock: socket.socket, *, announce: Callable[[], None]) -> int | None:
    """Run ``server`` on ``sock`` until Ctrl-C or SIGTERM; the signal that stopped it.
    ``announce`` runs once the signals are caught (a Ctrl-C right after it is not lost)."""
    seen: list[int] = []
    in_main = threading.current_thread() is threading.main_thread()
    previous = {}
    if in_main:
        # uvicorn stops gracefully on either and then raises it again for the handler it
        # found: these note which it was.
        def note(signum: int, _frame: Any) -> None:
            # Also before uvicorn catches the signals itself: it then stops at once.
            seen.append(signum)
            server.should_exit = True

        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, note)
    try:
        announce()
        if not seen:
            server.run(sockets=[sock])
    except Exception as exc:
        raise CliError(f"the console stopped: {describe(exc)}") from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    return seen[0] if seen else None
