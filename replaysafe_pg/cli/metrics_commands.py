"""``replaysafe-pg metrics``: the rows of ``replaysafe.metrics()`` in the Prometheus text
exposition format, printed once or served on ``/metrics`` (``--serve HOST:PORT``), and the
alert rules file that ships with the package (``--alert-rules``). docs/operability.md.

:class:`MetricsCollector` turns the rows into one gauge family per metric name (labels
``tenant`` and ``state`` where the row has them); :func:`exposition` renders them with
prometheus-client. :class:`MetricsServer` answers each scrape with one query on a fresh
connection, HTTP 500 (and ``replaysafe_up 0``) when it fails.
"""

from __future__ import annotations

import ipaddress
import signal
import socket
import socketserver
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from importlib.resources import files
from typing import Any, NoReturn

import click
import psycopg
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from replaysafe_pg import queries
from replaysafe_pg._dsn import redact
from replaysafe_pg.cli import render
from replaysafe_pg.cli.plumbing import (
    TENANT_ALL,
    CliError,
    Command,
    describe,
    emit,
    global_options,
    installed_revision,
    state_of,
    with_conn,
)
from replaysafe_pg.errors import wrap_errors

# What each metric counts, in the order they are shown. A name the function returns that is
# not here (a newer schema's) is shown too, after these.
HELP = {
    "replaysafe_actions":
        "Actions by state. running, unknown and retryable are exact counts; succeeded and "
        "failed are planner estimates.",
    "replaysafe_unresolved_actions":
        "Actions that need attention: unknown, or running with an expired lease (exact).",
    "replaysafe_oldest_unresolved_age_seconds":
        "Seconds since the oldest unresolved action became unknown or its lease expired; 0 "
        "when there is none (exact).",
    "replaysafe_multi_effect_actions":
        "Actions whose effect happened more than once: two or more succeeded attempts "
        "(exact).",
    "replaysafe_expired_leases":
        "Running actions whose lease expired and that no sweep has turned unknown yet "
        "(exact).",
    "replaysafe_threads": "Live (not deleted) threads: a planner estimate.",
}
UP = "replaysafe_up"
UP_HELP = "1 when replaysafe.metrics() answered this scrape, 0 when it failed."
RULES_FILE = "replaysafe-rules.yml"
# The classic text format (what generate_latest writes): every Prometheus reads it.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class MetricRow:
    """One row of ``replaysafe.metrics()``."""

    name: str
    tenant_id: str | None
    state: str | None
    value: float


def read_metrics(conn: psycopg.Connection[Any], *, by_tenant: bool,
                 tenant_id: str | None) -> list[MetricRow]:
    """The caller's metric rows: per tenant (``by_tenant``) or totals; ``tenant_id`` keeps
    only that tenant's."""
    with wrap_errors(), conn.cursor() as cur:
        try:
            cur.execute(queries.cli("metrics"), {"by_tenant": by_tenant, "tenant_id": tenant_id})
        except psycopg.errors.UndefinedFunction:
            raise CliError(
                "this database's replaysafe schema has no metrics() (revision "
                f"{_revision_or_unknown(conn)}): upgrade it with 'replaysafe-pg migrate'"
            ) from None
        return [MetricRow(str(name), tenant, state, float(value))
                for name, tenant, state, value in cur.fetchall()]


def _revision_or_unknown(conn: psycopg.Connection[Any]) -> str:
    try:
        return installed_revision(conn) or "none"
    except Exception:
        return "unknown"


class MetricsCollector(Collector):
    """The rows as gauge families, one per metric name; a sample has the labels ``tenant``
    and ``state`` where its row has them (``tenant_label`` False drops ``tenant``). Label
    values are shown as every value the command line prints (control characters escaped).
    ``up``: the ``replaysafe_up`` gauge's value."""

    def __init__(self, rows: Sequence[MetricRow], *, tenant_label: bool = True,
                 up: bool = True) -> None:
        self.rows = list(rows)
        self.tenant_label = tenant_label
        self.up = up

    def collect(self) -> Iterator[Metric]:
        names = list(HELP) + sorted({r.name for r in self.rows} - set(HELP))
        for name in names:
            rows = [r for r in self.rows if r.name == name]
            if not rows:
                continue
            family = GaugeMetricFamily(name, HELP.get(name, f"replaysafe.metrics() row {name}."))
            for row in rows:
                labels = {}
                if self.tenant_label and row.tenant_id is not None:
                    labels["tenant"] = render.escape(row.tenant_id)
                if row.state is not None:
                    labels["state"] = render.escape(row.state)
                family.add_sample(name, labels, row.value)
            yield family
        yield GaugeMetricFamily(UP, UP_HELP, value=1.0 if self.up else 0.0)


def exposition(rows: Sequence[MetricRow], *, tenant_label: bool = True,
               up: bool = True) -> bytes:
    """The rows in the Prometheus text exposition format (version 0.0.4)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MetricsCollector(rows, tenant_label=tenant_label, up=up))
    return generate_latest(registry)


# --- where --serve listens -------------------------------------------------------------------

LOOPBACK_NAMES = frozenset({"localhost"})


def is_loopback(host: str) -> bool:
    """``localhost``, 127.0.0.0/8 or ::1 (an empty host means every interface)."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ListenAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


class ListenAddressType(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click
    """``HOST:PORT``, ``[IPV6]:PORT``, or a bare ``PORT`` (on 127.0.0.1)."""

    name = "host:port"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> ListenAddress:
        if isinstance(value, ListenAddress):
            return value
        text = str(value).strip()
        if text.isdigit():
            host, port = "127.0.0.1", text
        elif text.startswith("["):
            host, _, rest = text[1:].partition("]")
            if not rest.startswith(":"):
                self.fail(f"{text!r} is not [IPV6]:PORT", param, ctx)
            port = rest[1:]
        else:
            host, sep, port = text.rpartition(":")
            if not sep:
                self.fail(f"{text!r} is not HOST:PORT (or a port)", param, ctx)
            if ":" in host:
                self.fail(f"{text!r}: write an IPv6 address in brackets, [::1]:PORT", param, ctx)
        if not port.isdigit() or not 0 <= int(port) <= 65535:
            self.fail(f"{text!r}: the port must be a number from 0 to 65535", param, ctx)
        return ListenAddress(host, int(port))


# --- the /metrics server ---------------------------------------------------------------------

class _MetricsHandler(BaseHTTPRequestHandler):
    server: MetricsServer
    # A client that stops sending does not hold the (one-at-a-time) server for ever.
    timeout = 30

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            status, body = self.server.scrape()
            self._answer(status, CONTENT_TYPE, body)
        elif path == "/":
            self._answer(200, "text/plain; charset=utf-8",
                         b"replaysafe-pg metrics: scrape /metrics\n")
        else:
            self._answer(404, "text/plain; charset=utf-8", b"not found: try /metrics\n")

    def _answer(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        # Each scrape is not worth a line; a failed one is reported by MetricsServer.scrape.
        pass


class MetricsServer(HTTPServer):
    """Serves ``/metrics``, one request at a time (a scrape is one short query): each
    ``read_rows()`` call opens its own connection. A failed scrape answers HTTP 500 with
    ``replaysafe_up 0`` and says why on ``report`` (one line)."""

    def __init__(self, address: ListenAddress, read_rows: Callable[[], list[MetricRow]], *,
                 tenant_label: bool, report: Callable[[str], None]) -> None:
        # The family of the address the host resolves to first (an IPv6 literal: AF_INET6).
        infos = socket.getaddrinfo(address.host or None, address.port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        self.address_family = infos[0][0]
        self.read_rows = read_rows
        self.tenant_label = tenant_label
        self.report = report
        super().__init__((str(infos[0][4][0]), int(infos[0][4][1])), _MetricsHandler)

    def server_bind(self) -> None:
        # HTTPServer's own would look the host's name up in DNS (socket.getfqdn), which can
        # hang where there is no DNS; the name is never used here.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.port

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away mid-answer, say: one line, not a traceback.
        self.report(f"replaysafe-pg: request from {client_address[0]} failed: "
                    f"{describe(sys.exc_info()[1] or Exception('unknown error'))}")

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def scrape(self) -> tuple[int, bytes]:
        try:
            rows = self.read_rows()
        except Exception as exc:
            why = exc.format_message() if isinstance(exc, click.ClickException) else describe(exc)
            self.report(f"replaysafe-pg: scrape failed: {why}")
            return 500, exposition([], tenant_label=self.tenant_label, up=False)
        return 200, exposition(rows, tenant_label=self.tenant_label)


class _Stop(BaseException):
    """SIGTERM while serving: unwinds out of the request under way (a BaseException, so the
    server's own error handling of a request does not swallow it)."""


def _stop(_signum: int, _frame: Any) -> NoReturn:
    raise _Stop


def serve(server: MetricsServer) -> str:
    """Serve until SIGTERM (returns ``"sigterm"``) or Ctrl-C (``"interrupt"``)."""
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _stop) if in_main else None
    try:
        server.serve_forever(poll_interval=0.2)
    except _Stop:
        return "sigterm"
    except KeyboardInterrupt:
        return "interrupt"
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
        server.server_close()
    return "stopped"  # pragma: no cover  # serve_forever returns only after shutdown()


# --- the command -----------------------------------------------------------------------------

def rules_text() -> str:
    """The alert rules file that ships with the package."""
    return (files("replaysafe_pg") / "alerts" / RULES_FILE).read_text(encoding="utf-8")


@with_conn
def _checked_rows(*, conn: psycopg.Connection[Any], by_tenant: bool,
                  tenant_id: str | None) -> list[MetricRow]:
    # The role's right to read a tenant is checked once (with_conn), before anything is
    # printed or served.
    return read_metrics(conn, by_tenant=by_tenant, tenant_id=tenant_id)


@click.command(cls=Command)
@global_options
@TENANT_ALL
@click.option("--no-tenant-label", "no_tenant_label", is_flag=True,
              help="One total per metric instead of one series per tenant (installations "
                   "with many tenants).")
@click.option("--serve", "serve_at", type=ListenAddressType(), default=None,
              metavar="HOST:PORT",
              help="Serve /metrics over HTTP on this address (a bare PORT: 127.0.0.1) until "
                   "Ctrl-C or SIGTERM; each scrape runs the query once on a new connection.")
@click.option("--allow-non-loopback", is_flag=True,
              help="Let --serve listen on an address other than loopback (127.0.0.1, ::1, "
                   "localhost). /metrics has no authentication: anyone who reaches it reads "
                   "the tenants' names and counts.")
@click.option("--alert-rules", is_flag=True,
              help="Print the Prometheus alert rules file that ships with the package and exit "
                   "(no database needed).")
@click.pass_context
def metrics(ctx: click.Context, tenant_id: str | None, no_tenant_label: bool,
            serve_at: ListenAddress | None, allow_non_loopback: bool, alert_rules: bool) -> None:
    """Print replaysafe.metrics() in the Prometheus text format, or serve it (--serve).

    Counts of running, unknown and retryable actions are exact; succeeded and failed
    actions and threads are planner estimates (docs/operability.md). A role bound to a
    tenant sees its tenant; the schema owner and roles bound to all tenants see every
    tenant (--tenant for one). With --json the rows are printed as JSON instead."""
    if alert_rules:
        click.echo(rules_text(), nl=False)
        return
    state = state_of(ctx)
    by_tenant = not no_tenant_label or tenant_id is not None
    tenant_label = not no_tenant_label
    if serve_at is None:
        rows = _checked_rows(by_tenant=by_tenant, tenant_id=tenant_id)
        emit(ctx, lambda: exposition(rows, tenant_label=tenant_label).decode().rstrip("\n"),
             rows)
        return
    if state.json:
        raise CliError("--json prints the rows once; it has no meaning with --serve")
    if not is_loopback(serve_at.host):
        if not allow_non_loopback:
            raise CliError(
                f"--serve {serve_at} is not a loopback address and /metrics has no "
                "authentication; pass --allow-non-loopback to serve it there anyway "
                "(or use 127.0.0.1:PORT behind your own proxy)")
        click.echo(f"replaysafe-pg: warning: serving /metrics on {serve_at}, beyond loopback: "
                   "it has no authentication, anyone who reaches it reads the tenants' names "
                   "and counts", err=True)
    _checked_rows(by_tenant=by_tenant, tenant_id=tenant_id)

    def read_rows() -> list[MetricRow]:
        with state.db.connection() as conn:
            return read_metrics(conn, by_tenant=by_tenant, tenant_id=tenant_id)

    def report(line: str) -> None:
        click.echo(render.escape(redact(line, state.dsn)), err=True)

    try:
        server = MetricsServer(serve_at, read_rows, tenant_label=tenant_label, report=report)
    except OSError as exc:
        raise CliError(f"cannot listen on {serve_at}: {exc.strerror or exc}") from None
    host = serve_at.host or "0.0.0.0"
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"replaysafe-pg: serving metrics on http://{shown}:{server.port}/metrics "
               "(Ctrl-C or SIGTERM to stop)", err=True)
    sys.stderr.flush()
    how = serve(server)
    click.echo("replaysafe-pg: stopped serving metrics", err=True)
    if how == "interrupt":
        ctx.exit(130)
