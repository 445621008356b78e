"""``replaysafe-pg doctor``: the connection, the schema revision, the group roles, and the
catalog checks (objects, owners, pinned search_path, privileges, row-level security, Citus,
tenant grants), with advice on worker timeouts. Every check reads the catalogs, complete for
any role; only the counts of actions by state depend on what the caller may read."""

from __future__ import annotations

import re
from typing import Any

import click
import psycopg

from replaysafe_pg import schema
from replaysafe_pg.cli.plumbing import (
    EXIT_ATTENTION,
    Command,
    emit,
    global_options,
    installed_revision,
    query_rows,
    with_conn,
)
from replaysafe_pg.errors import AccessDenied
from replaysafe_pg.models import ActionState


@click.command(cls=Command)
@global_options
@click.pass_context
@with_conn
def doctor(ctx: click.Context, conn: psycopg.Connection[Any]) -> None:
    """Check the connection, schema revision, group roles, row-level security."""
    info = query_rows(conn, "server_info")[0]
    checks: list[dict[str, Any]] = [{
        "check": "connection", "ok": True,
        "detail": f"{info['role']}@{info['database']}, PostgreSQL {info['server_version']}"}]
    head = schema.head_revision()
    scopes = query_rows(conn, "caller_scope")
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
    for role in query_rows(conn, "group_roles"):
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
        on_citus = bool(query_rows(conn, "citus_present")[0]["present"])
        checks += _schema_object_checks(query_rows(conn, "schema_objects"), complete=current == head,
                                        citus=on_citus)
        if on_citus:
            checks.append(_citus_check(query_rows(conn, "citus_tables"),
                                       query_rows(conn, "citus_lookups")))
        checks += _privilege_checks(query_rows(conn, "schema_privileges"),
                                    query_rows(conn, "default_privileges"))
        for table in query_rows(conn, "table_rls"):
            checks.append({"check": f"row-level security on {table['table_name']}",
                           "ok": table["rls_enabled"],
                           "detail": "enabled" if table["rls_enabled"] else "DISABLED"})
        advice = _timeout_advice(query_rows(conn, "worker_settings"))
        checks += _grant_checks(conn, owner=bool(scope and scope["owner"]) and current == head)
        if scope and scope["owner"] and current == head:
            copy = query_rows(conn, "installation_copy")
            if copy and copy[0]["copied"]:
                advice.append(
                    "this database is a copy (a template clone or a restore) of the one the "
                    f"installation {copy[0]['installation_id']} was made in: it refuses the "
                    "original's tenant grants, and shares its grant keys; give it keys of its "
                    "own: SELECT replaysafe.rotate_grant_key(p_keep_previous => false) "
                    "(docs/isolation.md#tenant-grants)")
        if scope and scope["owner"] and current == head:
            lost = [r["role"] for r in query_rows(conn, "auditors_without_tenant")]
            if lost:
                advice.append(
                    f"auditor login(s) {', '.join(lost)} are bound to no tenant and read nothing "
                    "(without a tenant grant): bind each to its tenant, or let one read every "
                    "tenant: SELECT replaysafe.bind_role_to_all_tenants(p_role => '<role>') "
                    "(docs/isolation.md#all-tenant-roles)")
        assert scope is not None
        if scope["reads_actions"]:
            counts = {r["state"]: r["actions"] for r in query_rows(conn, "counts_by_state")}
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

    emit(ctx, human, {"ok": ok, "checks": checks, "advice": advice, "counts": counts,
                      "counts_scope": counts_scope, "revision": current, "head": head})
    if not ok:
        ctx.exit(EXIT_ATTENTION)


def _grant_checks(conn: psycopg.Connection[Any], *, owner: bool) -> list[dict[str, Any]]:
    """Logins that can grant themselves a tenant: issuers that also act, and (as the owner,
    who reads the bindings) unbound logins of a group role that are members of bound roles."""
    both = query_rows(conn, "issuers_with_duties")
    checks = [{"check": "issuers", "ok": not both, "detail": "no login both issues tenant grants "
               "and acts" if not both else "; ".join(
                   f"{r['role']} is a member of replaysafe_issuer and of {', '.join(r['duties'])}"
                   for r in both) + ": an issuer must not act (docs/isolation.md#tenant-grants)"}]
    if owner:
        pooled = query_rows(conn, "pooled_logins_in_bound_roles")
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
