"""``replaysafe-pg grant``: issue and revoke tenant grants (docs/isolation.md#tenant-grants)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import click
import psycopg

from replaysafe_pg.cli.plumbing import Duration, Group, emit, global_options, with_conn
from replaysafe_pg.grants import DUTIES, issue_grant, read_claims
from replaysafe_pg.ledger import Ledger


@click.group("grant", cls=Group)
@global_options
def grant() -> None:
    """Tenant grants: the capability of a pooled login that is bound to no tenant.

    `grant issue` is for the application server (a member of replaysafe_issuer, never
    the agent); the worker passes the grant as grant= to Ledger, Threads or the
    LangGraph saver. `grant revoke` invalidates every grant of a tenant issued so far."""


@grant.command("issue")
@global_options
@click.option("--tenant", "tenant_id", required=True, metavar="TENANT",
              help="The tenant the grant lets its holder act for.")
@click.option("--user", "user_id", default=None, metavar="USER",
              help="Only this user's threads (default: the whole tenant's).")
@click.option("--ttl", type=Duration(), default="1h", show_default=True,
              help="How long the grant is valid (at most 7d), by the database clock.")
@click.option("--duty", "duties", multiple=True, type=click.Choice(DUTIES),
              help="A duty the grant gives (repeat for several; default: worker).")
@click.pass_context
@with_conn
def grant_issue(ctx: click.Context, conn: psycopg.Connection[Any], tenant_id: str,
                user_id: str | None, ttl: timedelta, duties: tuple[str, ...]) -> None:
    """Issue a tenant grant and print it (alone, on stdout).

    Needs a member of replaysafe_issuer (or the schema owner). The grant is a secret:
    hand it only to the worker that acts for the tenant, e.g.
    `GRANT=$(replaysafe-pg grant issue --tenant acme)`."""
    issued = issue_grant(conn, tenant_id, ttl=ttl, user_id=user_id,
                         duties=duties or ("worker",))
    claims = read_claims(issued)
    emit(ctx, issued, {"grant": issued, "tenant_id": claims.tenant_id,
                      "user_id": claims.user_id, "duties": list(claims.duties),
                      "issued_at": claims.issued_at.isoformat(),
                      "expires_at": claims.expires_at.isoformat()})


@grant.command("revoke")
@global_options
@click.option("--tenant", "tenant_id", required=True, metavar="TENANT",
              help="The tenant whose grants are revoked.")
@click.pass_context
@with_conn
def grant_revoke(ctx: click.Context, conn: psycopg.Connection[Any], tenant_id: str) -> None:
    """Revoke every grant issued for a tenant so far (the schema owner, or an operator
    of the tenant). Grants issued afterwards are valid."""
    with Ledger(conn, tenant_id=tenant_id, listen=False) as ledger:
        generation = ledger.revoke_grants()
    emit(ctx, f"revoked every grant issued for tenant {tenant_id} so far "
             f"(generation {generation})",
        {"tenant_id": tenant_id, "generation": generation})
