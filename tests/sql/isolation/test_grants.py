"""SPEC §4 "Pooled logins and tenant grants" and §5, in SQL: a login that serves every tenant
(the pooled login behind a transaction pooler) acts for a tenant only with a signed grant
for it, within the duties that both the grant and its own group roles give; a bound login
accepts grants for its own tenant only; use_grant puts a grant in force for the views for
one transaction. Real LOGIN roles, real databases, plain SQL (not the Python driver).

Every refusal asserts its exact SQLSTATE (RS004: not valid for the call; RS005: not a grant,
or a bad argument) and that nothing changed, read as the schema owner (a digest of every
row of the ledger, thread, LangGraph and grant tables). A refused call that raises is rolled
back whatever it did, so each refusal is paired with a control: the same calls with a valid
grant, or by an entitled login, succeed and write (Probe.works), so each refusal is about
the one thing the test changed.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from helpers.db import bind, cloned_database, connect_as, drop_database, dsn_for, owner_rows
from helpers.grants import (
    B64URL,
    CANONICAL_LAST,
    SHAPE,
    claims_of,
    flip,
    issue,
    parts,
    sqlstate_of,
    table_state,
    with_claims,
    with_part,
)
from psycopg import conninfo, sql

import replaysafe_pg

Conn = psycopg.Connection[Any]
MakeRole = Callable[..., str]
Login = Callable[..., Conn]
Issue = Callable[..., str]


# --- the world: tenants A and B, and the logins ------------------------------------------

@dataclass(frozen=True)
class Roles:
    issuer: str    # LOGIN, member of replaysafe_issuer (the application server)
    issuer_a: str  # the same, bound to A in the world
    pooled: str    # LOGIN, member of replaysafe_worker only, unbound (the pooled login)
    workop: str    # LOGIN, member of replaysafe_worker and replaysafe_operator, unbound
    bound_a: str   # LOGIN, member of replaysafe_worker, bound to A
    alt: str       # NOLOGIN, member of replaysafe_worker, unbound; granted to bound_a
    auditor: str   # LOGIN, member of replaysafe_auditor, unbound


@pytest.fixture(scope="module")
def roles(admin_dsn: str) -> Iterator[Roles]:
    tag = uuid.uuid4().hex[:8]
    r = Roles(*(f"rs_tg_{tag}_{n}" for n in
                ("issuer", "issuer_a", "pooled", "workop", "bound_a", "alt", "auditor")))
    groups = {r.issuer: ["replaysafe_issuer"], r.issuer_a: ["replaysafe_issuer"],
              r.pooled: ["replaysafe_worker"],
              r.workop: ["replaysafe_worker", "replaysafe_operator"],
              r.bound_a: ["replaysafe_worker"], r.alt: ["replaysafe_worker"],
              r.auditor: ["replaysafe_auditor"]}
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        for role, member_of in groups.items():
            login = sql.SQL("NOLOGIN" if role == r.alt else "LOGIN")
            c.execute(sql.SQL("CREATE ROLE {} {}").format(sql.Identifier(role), login))
            for g in member_of:
                c.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(g), sql.Identifier(role)))
        c.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(r.alt), sql.Identifier(r.bound_a)))
    yield r
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        for role in groups:
            c.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


CLAIM_AS_OWNER = ("SELECT attempt_token FROM replaysafe.claim_action(p_tenant_id => %s, "
                  "p_action_key => %s, p_operation => 'refund', p_request => '{}', "
                  "p_worker_id => 'owner', p_lease => '1 hour')")
WRITE_AS_OWNER = ("SELECT replaysafe.write_thread(p_tenant_id => %s, p_thread_id => %s, "
                  "p_expected_version => 0, p_state => '{\"n\": 1}', p_user_id => %s)")


def seed(dsn: str) -> None:
    """Per tenant A and B, as the owner: a finished and an unknown action, a tenant-wide
    thread and alice's; in A also bob's thread and a tenant-wide LangGraph thread."""
    with psycopg.connect(dsn, autocommit=True) as c:
        for tenant in ("A", "B"):
            done = c.execute(CLAIM_AS_OWNER, (tenant, "seed_done")).fetchone()
            assert done is not None
            c.execute("SELECT replaysafe.complete_action(p_tenant_id => %s, p_action_key => "
                      "'seed_done', p_attempt => 1, p_attempt_token => %s, p_result => '{}')",
                      (tenant, done[0]))
            unknown = c.execute(CLAIM_AS_OWNER, (tenant, "seed_unknown")).fetchone()
            assert unknown is not None
            c.execute("SELECT replaysafe.mark_action_unknown(p_tenant_id => %s, p_action_key => "
                      "'seed_unknown', p_attempt => 1, p_attempt_token => %s, p_error => '{}')",
                      (tenant, unknown[0]))
            c.execute(WRITE_AS_OWNER, (tenant, "shared", None))
            c.execute(WRITE_AS_OWNER, (tenant, "alice_t", "alice"))
        c.execute(WRITE_AS_OWNER, ("A", "bob_t", "bob"))
        c.execute(LG_PUT, lg_params("A", "lg_shared", None))


@pytest.fixture(scope="module")
def world(admin_dsn: str, template_db: str, roles: Roles) -> Iterator[str]:
    """One migrated database for the module (tests name their own keys and threads; the
    revocation tests use tenants of their own)."""
    with cloned_database(admin_dsn, template_db) as dsn:
        seed(dsn)
        bind(dsn, roles.bound_a, "A")
        bind(dsn, roles.issuer_a, "A")
        yield dsn


@pytest.fixture
def login(world: str) -> Iterator[Login]:
    """Connect (autocommit) as a role, to the world or to ``dsn``; closed after the test."""
    with contextlib.ExitStack() as stack:
        def connect(role: str, dsn: str = world) -> Conn:
            return stack.enter_context(connect_as(dsn, role))
        yield connect


@pytest.fixture
def grant(login: Login, roles: Roles) -> Issue:
    """Issue a grant in the world, as the issuer login."""
    conn = login(roles.issuer)

    def make(tenant: str, **kw: Any) -> str:
        return issue(conn, tenant, **kw)
    return make


# --- the calls a grant must (not) make ----------------------------------------------------

LG_PUT = ("SELECT stored FROM replaysafe.langgraph_put(p_tenant_id => %(t)s, "
          "p_thread_id => %(lg)s, p_checkpoint_ns => '', p_checkpoint_id => %(cp)s, "
          "p_parent_id => NULL, p_checkpoint => %(checkpoint)s::jsonb, "
          "p_metadata => %(md)s::jsonb, p_channels => '{msg}', p_versions => %(version)s::text[], "
          "p_types => '{json}', p_blobs => %(blobs)s::bytea[], p_grant => %(g)s)")


def lg_params(tenant: str, thread: str, grant: str | None, *, cp: str = "cp-1",
              run: str = "run-1") -> dict[str, Any]:
    version = f"{cp}.v"
    checkpoint = {"v": 4, "id": cp, "ts": "2026-01-01T00:00:00+00:00",
                  "channel_versions": {"msg": version}, "versions_seen": {}}
    return {"t": tenant, "lg": thread, "g": grant, "cp": cp, "version": [version],
            "checkpoint": json.dumps(checkpoint), "blobs": [b'"hello"'],
            "md": json.dumps({"source": "update", "step": 0, "run_id": run})}


PROBE_CALLS = {
    "claim_action": (
        "SELECT outcome FROM replaysafe.claim_action(p_tenant_id => %(t)s, "
        "p_action_key => %(new)s, p_operation => 'refund', p_request => '{\"n\": 1}', "
        "p_worker_id => 'pooled', p_grant => %(g)s)"),
    "claim_actions": (
        "SELECT outcome FROM replaysafe.claim_actions(p_tenant_id => %(t)s, "
        "p_action_keys => ARRAY[%(batch)s], p_operations => '{refund}', "
        "p_requests => ARRAY['{}'::jsonb], p_worker_id => 'pooled', p_grant => %(g)s)"),
    "complete_action": (
        "SELECT replaysafe.complete_action(p_tenant_id => %(t)s, p_action_key => %(live)s, "
        "p_attempt => 1, p_attempt_token => %(tok)s, p_result => '{\"ok\": true}', "
        "p_grant => %(g)s)"),
    "write_thread": (
        "SELECT replaysafe.write_thread(p_tenant_id => %(t)s, p_thread_id => %(thread)s, "
        "p_expected_version => 0, p_state => '{\"n\": 1}', p_grant => %(g)s)"),
    "read_thread": (
        "SELECT version FROM replaysafe.read_thread(p_tenant_id => %(t)s, "
        "p_thread_id => %(seen)s, p_grant => %(g)s)"),
    "langgraph_put": LG_PUT,
}


class Probe:
    """One call of each kind for ``tenant``, named apart: a claim of a new key (alone and in a
    batch), the report of
    a live attempt (claimed by the owner: the caller holds its token), a thread created, a
    thread read (written by the owner), a LangGraph checkpoint stored."""

    def __init__(self, dsn: str, tenant: str = "A") -> None:
        self.dsn, self.tenant = dsn, tenant
        tag = uuid.uuid4().hex[:10]
        self.new, self.live, self.batch = f"new_{tag}", f"live_{tag}", f"batch_{tag}"
        self.thread, self.seen, self.lg = f"th_{tag}", f"seen_{tag}", f"lg_{tag}"
        with psycopg.connect(dsn, autocommit=True) as c:
            row = c.execute(CLAIM_AS_OWNER, (tenant, self.live)).fetchone()
            assert row is not None and row[0]
            self.token: str = row[0]
            c.execute(WRITE_AS_OWNER, (tenant, self.seen, None))

    def params(self, grant: str | None) -> dict[str, Any]:
        return {**lg_params(self.tenant, self.lg, grant), "new": self.new, "live": self.live,
                "batch": self.batch, "tok": self.token, "thread": self.thread, "seen": self.seen}

    def refused(self, conn: Conn, grant: str | None, expected: str = "RS004",
                without: tuple[str, ...] = ()) -> None:
        before = table_state(self.dsn)
        got = {name: sqlstate_of(conn, query, self.params(grant))
               for name, query in PROBE_CALLS.items() if name not in without}
        assert got == dict.fromkeys(got, expected)
        assert table_state(self.dsn) == before

    def works(self, conn: Conn, grant: str | None) -> None:
        got = {}
        for name, query in PROBE_CALLS.items():
            row = conn.execute(query.encode(), self.params(grant)).fetchone()
            assert row is not None, name
            got[name] = row[0]
        assert got == {"claim_action": "claimed", "claim_actions": "claimed",
                       "complete_action": "recorded", "write_thread": 1, "read_thread": 1,
                       "langgraph_put": True}
        # What was written is the probe's tenant's, and nobody else's.
        assert sorted(owner_rows(self.dsn,
            "SELECT tenant_id, action_key, state::text FROM replaysafe.actions "
            "WHERE action_key IN (%s, %s, %s)", (self.new, self.live, self.batch))) == [
            (self.tenant, self.batch, "running"), (self.tenant, self.live, "succeeded"),
            (self.tenant, self.new, "running")]
        assert owner_rows(self.dsn, "SELECT tenant_id FROM replaysafe.threads "
                          "WHERE thread_id = %s", (self.thread,)) == [(self.tenant,)]
        assert owner_rows(self.dsn, "SELECT tenant_id FROM replaysafe.langgraph_checkpoints "
                          "WHERE thread_id = %s", (self.lg,)) == [(self.tenant,)]


READ_NOTHING = ("SELECT version FROM replaysafe.read_thread(p_tenant_id => %s, "
                "p_thread_id => 'never_written', p_grant => %s)")
USE_GRANT = "SELECT replaysafe.use_grant(%s)"


def reads(conn: Conn, tenant: str, g: str | None) -> str | None:
    """The SQLSTATE of a read of ``tenant`` under ``g`` (None: it was allowed)."""
    return sqlstate_of(conn, READ_NOTHING, (tenant, g))


# --- a grant is the pooled login's capability ----------------------------------------------

def test_a_pooled_login_acts_for_a_tenant_with_its_grant_only(world: str, roles: Roles,
                                                              login: Login, grant: Issue) -> None:
    c = login(roles.pooled)
    probe = Probe(world, "A")
    probe.refused(c, None)          # unbound, without a grant: no tenant at all
    g = grant("A")
    probe.works(c, g)
    # A claim and its report, both under the grant: the action is A's.
    row = c.execute("SELECT outcome, attempt_token FROM replaysafe.claim_action(p_tenant_id => "
                    "'A', p_action_key => 'good_grant', p_operation => 'refund', p_request => "
                    "'{}', p_worker_id => 'pooled', p_grant => %s)", (g,)).fetchone()
    assert row is not None and row[0] == "claimed"
    assert c.execute("SELECT replaysafe.complete_action(p_tenant_id => 'A', p_action_key => "
                     "'good_grant', p_attempt => 1, p_attempt_token => %s, p_result => "
                     "'{\"refunded\": 1}', p_grant => %s)", (row[1], g)).fetchone() == ("recorded",)
    assert owner_rows(world, "SELECT tenant_id, state::text, result FROM replaysafe.actions "
                      "WHERE action_key = 'good_grant'") == [("A", "succeeded", {"refunded": 1})]


def test_a_grant_for_another_tenant_is_refused(world: str, roles: Roles, login: Login,
                                               grant: Issue) -> None:
    c = login(roles.pooled)
    probe = Probe(world, "A")
    probe.refused(c, grant("B"))
    probe.refused(c, grant("A "))  # no trimming, no folding
    probe.refused(c, grant("a"))
    probe.works(c, grant("A"))


# --- expired -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Expired:
    short: str                               # TTL 1 second, expired
    operator: str                            # the same, with the operator duty too
    running: str                             # TTL 2 seconds: claims made with it, then expired
    attempts: dict[str, tuple[str, str]]     # report -> (action key, attempt token)


CLAIM_WITH = ("SELECT outcome, attempt_token FROM replaysafe.claim_action(p_tenant_id => 'A', "
              "p_action_key => %s, p_operation => 'refund', p_request => '{}', "
              "p_worker_id => 'pooled', p_lease => '1 hour', p_grant => %s)")


@pytest.fixture(scope="module")
def expired(world: str, roles: Roles) -> Expired:
    """Grants that have expired by the database clock (one sleep for the module)."""
    with connect_as(world, roles.issuer) as iss, connect_as(world, roles.pooled) as c:
        short = issue(iss, "A", ttl="1 second")
        operator = issue(iss, "A", ttl="1 second", duties=["worker", "operator"])
        running = issue(iss, "A", ttl="2 seconds")  # in force for 1 s at least (exp: a second)
        attempts = {}
        for report in ("heartbeat_action", "complete_action"):
            key = f"expiring_{report}_{uuid.uuid4().hex[:6]}"
            row = c.execute(CLAIM_WITH, (key, running)).fetchone()
            assert row is not None and row[0] == "claimed", row
            attempts[report] = (key, row[1])
        clock = c.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert clock is not None
        deadline = max(claims_of(g)["exp"] for g in (short, operator, running))
        time.sleep(max(0.0, deadline - clock[0]) + 0.1)
    return Expired(short, operator, running, attempts)


def test_an_expired_grant_is_refused(world: str, roles: Roles, login: Login, grant: Issue,
                                     expired: Expired) -> None:
    claims = claims_of(expired.short)
    assert 0 < claims["exp"] - claims["iat"] <= 1
    c = login(roles.pooled)
    probe = Probe(world, "A")
    # (A report under a grant that expired while its tool ran: the next test.)
    probe.refused(c, expired.short, without=("complete_action",))
    probe.refused(c, expired.running, without=("complete_action",))
    before = table_state(world)
    assert sqlstate_of(c, USE_GRANT, (expired.short,)) == "RS004"
    # Expiry is the database clock's: a time moved back by an operator does not revive it.
    op = login(roles.workop)
    probe.refused(op, expired.operator, without=("complete_action",))
    for moved in ("-1 hour", "-1 second", "0 seconds"):
        assert sqlstate_of(op, CLAIM_AT, (f"moved_{uuid.uuid4().hex[:8]}", moved,
                                          expired.operator)) == "RS004", moved
    assert table_state(world) == before
    probe.works(c, grant("A"))


@pytest.mark.parametrize("report", ["heartbeat_action", "complete_action"])
def test_a_grant_that_expired_while_the_tool_ran_does_not_stop_its_report(
        world: str, roles: Roles, login: Login, expired: Expired, report: str) -> None:
    c = login(roles.pooled)
    key, token = expired.attempts[report]
    if report == "heartbeat_action":
        query = ("SELECT replaysafe.heartbeat_action(p_tenant_id => 'A', p_action_key => %s, "
                 "p_attempt => 1, p_attempt_token => %s, p_grant => %s) IS NOT NULL")
        expected: object = True
    else:
        query = ("SELECT replaysafe.complete_action(p_tenant_id => 'A', p_action_key => %s, "
                 "p_attempt => 1, p_attempt_token => %s, p_result => '{}', p_grant => %s)")
        expected = "recorded"
    try:
        row = c.execute(query.encode(), (key, token, expired.running)).fetchone()
    except psycopg.Error as exc:
        pytest.fail(f"{report} with the grant the claim was made under, expired since: "
                    f"{exc.sqlstate} {exc}")
    assert row == (expected,)


def test_a_grant_is_in_force_when_it_is_issued(roles: Roles, login: Login) -> None:
    iss, c = login(roles.issuer), login(roles.pooled)
    # Just after a second begins, by the database clock.
    iss.execute("SELECT pg_sleep(1.02 - (extract(epoch FROM clock_timestamp()) % 1)::float8)")
    try:
        row = iss.execute("SELECT replaysafe.issue_tenant_grant(p_tenant_id => 'A', "
                          "p_ttl => '0.6 seconds')").fetchone()
    except psycopg.Error as exc:   # refusing a TTL under a second would be an answer too
        assert exc.sqlstate == "RS005"
        return
    assert row is not None
    assert reads(c, "A", row[0]) is None


# --- altered -------------------------------------------------------------------------------

ALTERATIONS: dict[str, Callable[[str, str], str]] = {
    "claims, one character in the middle":
        lambda g, other: with_part(g, 1, flip(parts(g)[1], len(parts(g)[1]) // 2)),
    "claims, first character": lambda g, other: with_part(g, 1, flip(parts(g)[1], 0)),
    "claims, last character": lambda g, other: with_part(g, 1, flip(parts(g)[1], -1 % len(parts(g)[1]))),
    "claims re-encoded for tenant B": lambda g, other: with_claims(g, tid="B"),
    "claims re-encoded with a later expiry":
        lambda g, other: with_claims(g, exp=claims_of(g)["exp"] + 86400),
    "claims re-encoded with the operator duty":
        lambda g, other: with_claims(g, dut=["operator", "worker"]),
    "claims re-encoded for another database":
        lambda g, other: with_claims(g, iss=claims_of(g)["iss"] + "0"),
    "another grant's claims under this signature":
        lambda g, other: with_part(g, 1, parts(other)[1]),
    "signature, first character": lambda g, other: with_part(g, 2, flip(parts(g)[2], 0)),
    "signature, 21st character": lambda g, other: with_part(g, 2, flip(parts(g)[2], 20)),
    "signature, last character (another canonical one)":
        lambda g, other: with_part(g, 2, flip(parts(g)[2], 42, CANONICAL_LAST)),
    "another grant's signature": lambda g, other: with_part(g, 2, parts(other)[2]),
    "header, one character (no such key)": lambda g, other: with_part(g, 0, flip(parts(g)[0], 30)),
}


@pytest.mark.parametrize("alteration", list(ALTERATIONS))
def test_an_altered_grant_is_refused(world: str, roles: Roles, login: Login, grant: Issue,
                                     alteration: str) -> None:
    g = grant("A")
    altered = ALTERATIONS[alteration](g, grant("B", user="mallory"))
    assert altered != g
    assert SHAPE.match(altered), "still a well-formed grant: refused as invalid, not malformed"
    assert len(parts(altered)[2]) == 43
    c = login(roles.pooled)
    probe = Probe(world, "A")
    probe.refused(c, altered)
    assert sqlstate_of(c, USE_GRANT, (altered,)) == "RS004"
    probe.works(c, g)


def test_a_non_canonical_signature_is_not_a_grant(world: str, roles: Roles, login: Login,
                                                  grant: Issue) -> None:
    g = grant("A")
    c = login(roles.pooled)
    sig = parts(g)[2]
    non_canonical = [ch for ch in B64URL if ch not in CANONICAL_LAST]
    assert len(non_canonical) == 48
    for ch in non_canonical:   # same 32 bytes, or 32 bytes and stray bits: never a grant
        assert reads(c, "A", with_part(g, 2, sig[:42] + ch)) == "RS005", ch
    probe = Probe(world, "A")
    probe.refused(c, with_part(g, 2, sig[:42] + non_canonical[0]), expected="RS005")
    probe.works(c, g)


# --- another installation, another database ------------------------------------------------

def test_a_grant_of_another_installation_is_refused(world: str, empty_dsn: str, roles: Roles,
                                                    login: Login) -> None:
    replaysafe_pg.migrate(empty_dsn)   # migrated on its own: not a clone of this one
    foreign = issue(login(roles.issuer, empty_dsn), "A")
    here = issue(login(roles.issuer), "A")
    assert parts(foreign)[0] != parts(here)[0]  # its own key
    assert claims_of(foreign)["iss"].split(":")[1] != claims_of(here)["iss"].split(":")[1]
    # Valid where it was issued ...
    Probe(empty_dsn, "A").works(login(roles.pooled, empty_dsn), foreign)
    # ... and nowhere else.
    c = login(roles.pooled)
    probe = Probe(world, "A")
    probe.refused(c, foreign)
    assert sqlstate_of(c, USE_GRANT, (foreign,)) == "RS004"
    probe.works(c, here)


def test_a_grant_of_a_template_clone_is_refused_and_the_reverse(admin_dsn: str, dsn: str,
                                                                roles: Roles) -> None:
    # The original signs a grant first, so the clone copies its key and installation: the
    # database the grant's issuer names tells them apart, and the clone issues nothing until
    # it is an installation of its own.
    with connect_as(dsn, roles.issuer) as iss:
        original = issue(iss, "A")
    clone_name = f"rs_tgc_{uuid.uuid4().hex[:10]}"
    original_name = conninfo.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(clone_name), sql.Identifier(str(original_name))))
    clone = dsn_for(admin_dsn, clone_name)
    try:
        with connect_as(clone, roles.issuer) as iss:
            assert sqlstate_of(iss, "SELECT replaysafe.issue_tenant_grant(p_tenant_id => 'A')",
                               ()) == "RS004"   # a copy, with the original's keys
        with connect_as(clone, roles.pooled) as c:
            Probe(clone, "A").refused(c, original)
        with psycopg.connect(clone, autocommit=True) as owner:
            owner.execute("SELECT replaysafe.rotate_grant_key(p_keep_previous => false)")
        with connect_as(clone, roles.issuer) as iss:
            copy = issue(iss, "A")
        assert parts(copy)[0] != parts(original)[0]  # a key of its own
        ours, theirs = claims_of(original)["iss"].split(":"), claims_of(copy)["iss"].split(":")
        assert ours[1] != theirs[1] and ours[2:] != theirs[2:]  # another installation and db
        with connect_as(dsn, roles.pooled) as c:
            probe = Probe(dsn, "A")
            probe.refused(c, copy)
            assert sqlstate_of(c, USE_GRANT, (copy,)) == "RS004"
            probe.works(c, original)
        with connect_as(clone, roles.pooled) as c:
            probe = Probe(clone, "A")
            probe.refused(c, original)
            probe.works(c, copy)
    finally:
        drop_database(admin_dsn, clone_name)


@pytest.mark.xfail(strict=True, reason=(
    "honest limit (docs/isolation.md, copies of the database): a grant names the database by "
    "its name, the same on every Citus node; a copy that has the original's name (a restore, "
    "or a clone renamed into its place) shares installation, key and name, and accepts the "
    "original's grants until rotate_grant_key(p_keep_previous => false); doctor notes the copy"))
def test_a_copy_under_the_originals_name_is_told_apart(admin_dsn: str, dsn: str,
                                                       roles: Roles) -> None:
    with connect_as(dsn, roles.issuer) as iss:
        original = issue(iss, "A")
    name = str(conninfo.conninfo_to_dict(dsn)["dbname"])
    moved, copy = f"{name}_orig", f"rs_tgr_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(copy),
                                                                  sql.Identifier(name)))
        # As a restore under the same name: the original goes, the copy takes its name.
        c.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(sql.Identifier(name),
                                                                  sql.Identifier(moved)))
        c.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(sql.Identifier(copy),
                                                                  sql.Identifier(name)))
    try:
        with connect_as(dsn, roles.pooled) as c:
            Probe(dsn, "A").refused(c, original)
        with psycopg.connect(dsn, autocommit=True) as owner:  # the copy's keys of its own
            owner.execute("SELECT replaysafe.rotate_grant_key(p_keep_previous => false)")
        with connect_as(dsn, roles.pooled) as c, connect_as(dsn, roles.issuer) as iss:
            Probe(dsn, "A").works(c, issue(iss, "A"))
    finally:
        drop_database(admin_dsn, moved)


# --- revoked -------------------------------------------------------------------------------

REVOKE = "SELECT replaysafe.revoke_tenant_grants(p_tenant_id => %s, p_grant => %s)"


def test_grants_revoked_by_the_owner_are_refused(world: str, roles: Roles, login: Login,
                                                 grant: Issue) -> None:
    c = login(roles.pooled)
    old, other = grant("R1"), grant("R2")
    assert reads(c, "R1", old) is None
    with psycopg.connect(world, autocommit=True) as owner:
        row = owner.execute("SELECT replaysafe.revoke_tenant_grants(p_tenant_id => 'R1')").fetchone()
    assert row is not None and row[0] >= 1
    probe = Probe(world, "R1")
    probe.refused(c, old)
    assert sqlstate_of(c, USE_GRANT, (old,)) == "RS004"
    assert reads(c, "R2", other) is None         # another tenant's grants stand
    new = grant("R1")
    assert claims_of(new)["gen"] == row[0]
    probe.works(c, new)                         # issued after the revocation


def test_grants_revoked_by_a_pooled_operator_with_an_operator_grant_are_refused(
        world: str, roles: Roles, login: Login, grant: Issue) -> None:
    worker_grant, operator_grant = grant("R2"), grant("R2", duties=["operator"])
    op, c = login(roles.workop), login(roles.pooled)
    generation = op.execute(REVOKE, ("R2", operator_grant)).fetchone()
    assert generation is not None and generation[0] >= 1
    probe = Probe(world, "R2")
    probe.refused(c, worker_grant)
    before = table_state(world)
    assert sqlstate_of(op, REVOKE, ("R2", operator_grant)) == "RS004"  # revoked with the rest
    assert table_state(world) == before
    probe.works(c, grant("R2"))


def test_who_may_not_revoke(world: str, roles: Roles, login: Login, grant: Issue) -> None:
    operator_r1, operator_r2 = grant("R1", duties=["operator"]), grant("R2", duties=["operator"])
    worker_r1 = grant("R1", duties=["worker", "auditor"])
    before = table_state(world)
    op = login(roles.workop)
    assert sqlstate_of(op, REVOKE, ("R1", None)) == "RS004"         # unbound: no tenant
    assert sqlstate_of(op, REVOKE, ("R1", worker_r1)) == "RS004"    # no operator duty granted
    assert sqlstate_of(op, REVOKE, ("R1", operator_r2)) == "RS004"  # another tenant's grant
    for role in (roles.pooled, roles.bound_a, roles.issuer):        # no operator at all
        assert sqlstate_of(login(role), REVOKE, ("R1", operator_r1)) == "42501", role
    assert table_state(world) == before
    assert reads(login(roles.pooled), "R1", worker_r1) is None     # nothing was revoked


def test_an_operator_bound_to_a_tenant_revokes_its_grants_only(
        make_role: MakeRole, world: str, roles: Roles, login: Login, grant: Issue) -> None:
    operator = make_role("replaysafe_operator")
    bind(world, operator, "R4")
    c, op = login(roles.pooled), login(operator)
    old, other = grant("R4"), grant("R5")
    before = table_state(world)
    assert sqlstate_of(op, REVOKE, ("R5", None)) == "RS004"
    assert sqlstate_of(op, REVOKE, ("R5", grant("R5", duties=["operator"]))) == "RS004"
    assert table_state(world) == before
    assert reads(c, "R5", other) is None
    assert op.execute(REVOKE, ("R4", None)).fetchone() == (1,)
    assert (reads(c, "R4", old), reads(c, "R5", other)) == ("RS004", None)


EMPTY_BATCH = ("SELECT count(*) FROM replaysafe.claim_actions(p_tenant_id => 'A', "
               "p_action_keys => '{}', p_operations => '{}', p_requests => '{}', "
               "p_worker_id => 'pooled', p_grant => %s)")


def test_an_empty_batch_checks_its_grant_too(roles: Roles, login: Login, grant: Issue) -> None:
    c = login(roles.pooled)
    assert c.execute(EMPTY_BATCH, (grant("A"),)).fetchone() == (0,)
    assert {"garbage": sqlstate_of(c, EMPTY_BATCH, ("garbage",)),
            "another tenant's": sqlstate_of(c, EMPTY_BATCH, (grant("B"),)),
            "none": sqlstate_of(c, EMPTY_BATCH, (None,))} == {
        "garbage": "RS005", "another tenant's": "RS004", "none": "RS004"}


def test_a_rotated_key_keeps_verifying_once_and_a_dropped_one_never(dsn: str, roles: Roles,
                                                                    login: Login) -> None:
    owner = psycopg.connect(dsn, autocommit=True)   # the schema owner
    try:
        rotations(dsn, owner, roles, login)
    finally:
        owner.close()


def rotations(dsn: str, owner: Conn, roles: Roles, login: Login) -> None:
    c = login(roles.pooled, dsn)
    iss = login(roles.issuer, dsn)
    rotate = "SELECT replaysafe.rotate_grant_key(p_keep_previous => %s)"
    g0 = issue(iss, "A")
    owner.execute(rotate, (True,))
    g1 = issue(iss, "A")
    assert parts(g1)[0] != parts(g0)[0]
    assert (reads(c, "A", g0), reads(c, "A", g1)) == (None, None)
    owner.execute(rotate, (True,))
    g2 = issue(iss, "A")
    assert (reads(c, "A", g0), reads(c, "A", g1), reads(c, "A", g2)) == ("RS004", None, None)
    owner.execute(rotate, (False,))       # a key that leaked: every grant so far goes
    g3 = issue(iss, "A")
    assert (reads(c, "A", g1), reads(c, "A", g2), reads(c, "A", g3)) == ("RS004", "RS004", None)
    before = table_state(dsn)
    for role in (roles.pooled, roles.workop, roles.issuer):
        assert sqlstate_of(login(role, dsn), rotate, (False,)) == "42501", role
    assert table_state(dsn) == before
    assert reads(c, "A", g3) is None


# --- a grant that names a user --------------------------------------------------------------

THREAD_CALLS = {
    "read_thread": ("SELECT version FROM replaysafe.read_thread(p_tenant_id => 'A', "
                    "p_thread_id => %(thread)s, p_user_id => %(user)s, p_grant => %(g)s)"),
    "write_thread": ("SELECT replaysafe.write_thread(p_tenant_id => 'A', p_thread_id => %(thread)s, "
                     "p_expected_version => %(version)s, p_state => '{\"x\": 1}', "
                     "p_user_id => %(user)s, p_grant => %(g)s)"),
    "thread_history": ("SELECT count(*) FROM replaysafe.thread_history(p_tenant_id => 'A', "
                       "p_thread_id => %(thread)s, p_user_id => %(user)s, p_grant => %(g)s)"),
    "delete_thread": ("SELECT replaysafe.delete_thread(p_tenant_id => 'A', p_thread_id => %(thread)s, "
                      "p_user_id => %(user)s, p_grant => %(g)s)"),
}


def thread_call(conn: Conn, name: str, thread: str, g: str, user: str | None = None,
                version: int = 1) -> str | None:
    return sqlstate_of(conn, THREAD_CALLS[name], {"thread": thread, "user": user, "g": g,
                                                  "version": version})


def test_a_user_grant_reaches_that_users_threads_only(world: str, roles: Roles, login: Login,
                                                      grant: Issue) -> None:
    alice = grant("A", user="alice")
    assert claims_of(alice)["sub"] == "alice"
    c = login(roles.pooled)
    new = f"new_{uuid.uuid4().hex[:8]}"
    before = table_state(world)
    # bob's thread, named with or without bob's id; a new thread for bob.
    for name in THREAD_CALLS:
        for user in ("bob", None, "alice"):
            assert thread_call(c, name, "bob_t", alice, user) == "RS004", (name, user)
    assert thread_call(c, "write_thread", new, alice, "bob", version=0) == "RS004"
    assert thread_call(c, "read_thread", new, alice, "bob") == "RS004"
    assert table_state(world) == before
    # Without a user id it is alice's: her seeded thread, and a new one that becomes hers.
    assert c.execute(THREAD_CALLS["read_thread"], {"thread": "alice_t", "user": None,
                                                   "g": alice}).fetchone() == (1,)
    assert c.execute(THREAD_CALLS["write_thread"], {"thread": new, "user": None, "g": alice,
                                                    "version": 0}).fetchone() == (1,)
    assert owner_rows(world, "SELECT tenant_id, user_id FROM replaysafe.threads "
                      "WHERE thread_id = %s", (new,)) == [("A", "alice")]
    assert c.execute(THREAD_CALLS["read_thread"], {"thread": new, "user": "alice",
                                                   "g": alice}).fetchone() == (1,)
    # bob's own grant reaches bob's thread (so the refusals above are about the user).
    assert c.execute(THREAD_CALLS["read_thread"], {"thread": "bob_t", "user": None,
                                                   "g": grant("A", user="bob")}).fetchone() == (1,)


def test_a_user_grant_does_not_reach_a_thread_of_the_whole_tenant(
        world: str, roles: Roles, login: Login, grant: Issue) -> None:
    alice = grant("A", user="alice")
    c = login(roles.pooled)
    before = table_state(world)
    for name in THREAD_CALLS:
        for user in (None, "alice"):
            assert thread_call(c, name, "shared", alice, user) == "RS004", (name, user)
    assert table_state(world) == before
    assert c.execute(THREAD_CALLS["read_thread"], {"thread": "shared", "user": None,
                                                   "g": grant("A")}).fetchone() == (1,)


# --- duties: the intersection of the grant's and the login's --------------------------------

RESOLVE = ("SELECT replaysafe.resolve_action(p_tenant_id => 'A', p_action_key => %s, "
           "p_state => 'succeeded', p_result => '{}', p_note => 'checked', p_grant => %s)")


def unknown_action(dsn: str) -> str:
    key = f"unknown_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(CLAIM_AS_OWNER, ("A", key)).fetchone()
        assert row is not None
        c.execute("SELECT replaysafe.mark_action_unknown(p_tenant_id => 'A', p_action_key => %s, "
                  "p_attempt => 1, p_attempt_token => %s, p_error => '{}')", (key, row[0]))
    return key


def test_a_worker_grant_does_not_let_an_operator_login_resolve(world: str, roles: Roles,
                                                               login: Login, grant: Issue) -> None:
    key = unknown_action(world)
    op = login(roles.workop)
    before = table_state(world)
    assert sqlstate_of(op, RESOLVE, (key, grant("A"))) == "RS004"
    assert sqlstate_of(op, RESOLVE, (key, grant("A", duties=["worker", "auditor"]))) == "RS004"
    assert sqlstate_of(op, RESOLVE, (key, None)) == "RS004"        # unbound, no grant
    assert sqlstate_of(op, RESOLVE, (key, grant("B", duties=["operator"]))) == "RS004"
    assert sqlstate_of(login(roles.pooled), RESOLVE,
                       (key, grant("A", duties=["operator"]))) == "42501"  # no operator login
    assert table_state(world) == before
    assert op.execute(RESOLVE, (key, grant("A", duties=["operator"]))).fetchone() == ("succeeded",)
    assert owner_rows(world, "SELECT state::text FROM replaysafe.actions WHERE tenant_id = 'A' "
                      "AND action_key = %s", (key,)) == [("succeeded",)]


def test_an_operator_grant_does_not_let_a_worker_claim(world: str, roles: Roles, login: Login,
                                                       grant: Issue) -> None:
    op_only = grant("A", duties=["operator"])
    auditor = grant("A", duties=["auditor", "operator"])
    for role in (roles.workop, roles.pooled):
        c = login(role)
        probe = Probe(world, "A")
        probe.refused(c, op_only)
        probe.refused(c, auditor)
        probe.works(c, grant("A", duties=["worker", "operator"]))


CLAIM_AT = ("SELECT outcome, lease_expires_at - clock_timestamp() FROM replaysafe.claim_action("
            "p_tenant_id => 'A', p_action_key => %s, p_operation => 'refund', p_request => '{}', "
            "p_worker_id => 'pooled', p_lease => '30 seconds', "
            "p_now => clock_timestamp() + %s::interval, p_grant => %s)")


def test_time_moves_need_the_operator_duty_of_both_grant_and_login(
        world: str, roles: Roles, login: Login, grant: Issue) -> None:
    worker, both = grant("A"), grant("A", duties=["worker", "operator"])
    op, c = login(roles.workop), login(roles.pooled)

    def key() -> str:
        return f"moved_{uuid.uuid4().hex[:8]}"

    before = table_state(world)
    assert sqlstate_of(op, CLAIM_AT, (key(), "-1 hour", worker)) == "RS005"
    assert sqlstate_of(c, CLAIM_AT, (key(), "-1 hour", both)) == "RS005"   # the login: no operator
    assert sqlstate_of(c, CLAIM_AT, (key(), "-1 hour", worker)) == "RS005"
    assert table_state(world) == before
    # A future time within 5 minutes is taken as the clock, unless both give the duty.
    row = op.execute(CLAIM_AT, (key(), "2 minutes", worker)).fetchone()
    assert row is not None and row[0] == "claimed"
    assert row[1].total_seconds() < 60                    # clock + 30 s, not p_now + 30 s
    row = op.execute(CLAIM_AT, (key(), "2 minutes", both)).fetchone()
    assert row is not None and row[0] == "claimed"
    assert row[1].total_seconds() > 120                   # p_now + 30 s
    row = op.execute(CLAIM_AT, (key(), "-1 hour", both)).fetchone()
    assert row is not None and row[0] == "claimed"
    assert row[1].total_seconds() < -3000                 # a lease that ran out an hour ago


# --- bound sessions -------------------------------------------------------------------------

def test_a_bound_login_accepts_grants_for_its_own_tenant_only(world: str, roles: Roles,
                                                              login: Login, grant: Issue) -> None:
    c = login(roles.bound_a)
    b = grant("B")
    Probe(world, "B").refused(c, b)
    Probe(world, "A").refused(c, b)
    before = table_state(world)
    assert sqlstate_of(c, USE_GRANT, (b,)) == "RS004"
    assert table_state(world) == before
    Probe(world, "A").works(c, grant("A"))


def test_set_role_never_lets_a_grant_widen_a_binding(make_role: MakeRole, world: str,
                                                     roles: Roles, login: Login,
                                                     grant: Issue) -> None:
    b = grant("B")
    for target in (roles.alt, "replaysafe_worker"):
        c = login(roles.bound_a)
        c.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(target)))
        assert c.execute("SELECT current_user").fetchone() == (target,)
        Probe(world, "B").refused(c, b)
        assert sqlstate_of(c, USE_GRANT, (b,)) == "RS004"
        Probe(world, "A").works(c, grant("A"))
    # A pooled login that may SET ROLE to a role bound to B: its grant for A is refused there.
    bound_b = make_role("replaysafe_worker")
    bind(world, bound_b, "B")
    pooled = make_role("replaysafe_worker", bound_b)
    c = login(pooled)
    a = grant("A")
    assert reads(c, "A", a) is None
    c.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(bound_b)))
    Probe(world, "A").refused(c, a)
    Probe(world, "B").works(c, b)


# --- malformed ------------------------------------------------------------------------------

def over_2048(g: str, size: int) -> str:
    header, claims, signature = parts(g)
    return f"{header}.{claims + 'A' * (size - len(g))}.{signature}"


MALFORMED: dict[str, Callable[[str], str]] = {
    "empty": lambda g: "",
    "garbage": lambda g: "garbage",
    "dots": lambda g: "..",
    "two parts": lambda g: ".".join(parts(g)[:2]),
    "four parts": lambda g: g + ".AAAA",
    "trailing dot": lambda g: g + ".",
    "padding": lambda g: g + "=",
    "standard base64 letter": lambda g: with_part(g, 1, parts(g)[1][:-1] + "+"),
    "trailing newline": lambda g: g + "\n",
    "leading space": lambda g: " " + g,
    "signature of 42 characters": lambda g: with_part(g, 2, parts(g)[2][:42]),
    "signature of 44 characters": lambda g: with_part(g, 2, parts(g)[2] + "A"),
    "non-ASCII letter": lambda g: with_part(g, 1, "é" + parts(g)[1]),
    "over 2048 bytes": lambda g: over_2048(g, 2049),
    "non-canonical last signature character":
        lambda g: with_part(g, 2, parts(g)[2][:42] + "B"),
}




@pytest.mark.parametrize("malformed", MALFORMED)
def test_a_malformed_grant_is_invalid_argument(world: str, roles: Roles, login: Login,
                                               grant: Issue, malformed: str) -> None:
    g = grant("A")
    bad = MALFORMED[malformed](g)
    assert not SHAPE.match(bad) or len(bad.encode()) > 2048
    c = login(roles.pooled)
    probe = Probe(world, "A")
    probe.refused(c, bad, expected="RS005")
    assert sqlstate_of(c, USE_GRANT, (bad,)) == "RS005"
    probe.works(c, g)


def test_the_size_limit_is_2048_bytes(world: str, roles: Roles, login: Login,
                                      grant: Issue) -> None:
    g = grant("A")
    c = login(roles.pooled)
    at_limit, over = over_2048(g, 2048), over_2048(g, 2049)
    assert (len(at_limit.encode()), len(over.encode())) == (2048, 2049)
    assert SHAPE.match(at_limit) and SHAPE.match(over)
    before = table_state(world)
    assert reads(c, "A", at_limit) == "RS004"   # a grant's shape and size, not signed
    assert reads(c, "A", over) == "RS005"
    assert sqlstate_of(c, USE_GRANT, (at_limit,)) == "RS004"
    assert sqlstate_of(c, USE_GRANT, (over,)) == "RS005"
    assert table_state(world) == before


def test_use_grant_of_null_is_invalid_argument(world: str, roles: Roles, login: Login) -> None:
    before = table_state(world)
    for role in (roles.pooled, roles.bound_a, roles.auditor):
        assert sqlstate_of(login(role), "SELECT replaysafe.use_grant(NULL)") == "RS005", role
    assert table_state(world) == before


BAD_ISSUES = {
    "ttl zero": "p_tenant_id => 'A', p_ttl => '0 seconds'",
    "ttl negative": "p_tenant_id => 'A', p_ttl => '-1 second'",
    "ttl 8 days": "p_tenant_id => 'A', p_ttl => '8 days'",
    "ttl a second over 7 days": "p_tenant_id => 'A', p_ttl => '7 days 1 second'",
    "ttl 168 hours and a second": "p_tenant_id => 'A', p_ttl => '168:00:01'",
    "ttl 1 month": "p_tenant_id => 'A', p_ttl => '1 month'",
    "ttl 1 month -23 days": "p_tenant_id => 'A', p_ttl => '1 month -23 days'",
    "ttl 1 year": "p_tenant_id => 'A', p_ttl => '1 year'",
    "ttl NULL": "p_tenant_id => 'A', p_ttl => NULL",
    "duties empty": "p_tenant_id => 'A', p_duties => '{}'",
    "duty admin": "p_tenant_id => 'A', p_duties => '{admin}'",
    "duties worker and admin": "p_tenant_id => 'A', p_duties => '{worker,admin}'",
    "duty in capitals": "p_tenant_id => 'A', p_duties => '{WORKER}'",
    "duty issuer": "p_tenant_id => 'A', p_duties => '{issuer}'",
    "duty NULL": "p_tenant_id => 'A', p_duties => '{NULL}'",
    "duties NULL": "p_tenant_id => 'A', p_duties => NULL",
    "tenant empty": "p_tenant_id => ''",
    "tenant NULL": "p_tenant_id => NULL",
    "tenant over 512 characters": "p_tenant_id => repeat('t', 513)",
    "user empty": "p_tenant_id => 'A', p_user_id => ''",
    "ids that make a grant over 2048 bytes":
        "p_tenant_id => repeat('t', 512), p_user_id => repeat('é', 512)",
}


@pytest.mark.parametrize("case", list(BAD_ISSUES))
def test_issue_refuses_bad_arguments(world: str, roles: Roles, login: Login, case: str) -> None:
    iss = login(roles.issuer)
    before = table_state(world)
    assert sqlstate_of(iss, f"SELECT replaysafe.issue_tenant_grant({BAD_ISSUES[case]})") == "RS005"
    assert table_state(world) == before


def test_issue_accepts_the_limits(world: str, roles: Roles, login: Login) -> None:
    iss, c = login(roles.issuer), login(roles.pooled)
    for ttl, seconds in (("7 days", 7 * 86400), ("168 hours", 7 * 86400), ("1 second", 1)):
        claims = claims_of(issue(iss, "A", ttl=ttl))
        assert claims["exp"] - claims["iat"] == seconds, ttl
    g = issue(iss, "A", duties=["worker", "auditor", "operator", "worker"])
    assert claims_of(g)["dut"] == ["auditor", "operator", "worker"]
    assert reads(c, "A", g) is None
    long = issue(iss, "t" * 512, user="u" * 512)   # the longest ids that still fit
    assert len(long.encode()) <= 2048
    assert reads(c, "t" * 512, long) is None


def test_only_issuers_issue(make_role: MakeRole, dsn: str, roles: Roles,
                            login: Login) -> None:
    bind(dsn, roles.issuer_a, "A")
    issue_a = "SELECT replaysafe.issue_tenant_grant(p_tenant_id => 'A')"
    before = table_state(dsn)
    for role in (roles.pooled, roles.workop, roles.auditor):
        assert sqlstate_of(login(role, dsn), issue_a) == "42501", role  # no EXECUTE
    # EXECUTE granted by mistake opens nothing.
    mistaken = make_role("replaysafe_worker")
    with psycopg.connect(dsn, autocommit=True) as owner:
        owner.execute(sql.SQL("GRANT EXECUTE ON FUNCTION replaysafe.issue_tenant_grant("
                              "text, interval, text, text[]) TO {}").format(sql.Identifier(mistaken)))
    try:
        assert sqlstate_of(login(mistaken, dsn), issue_a) == "RS004"
        # An issuer bound to A issues for A only.
        assert sqlstate_of(login(roles.issuer_a, dsn), "SELECT replaysafe.issue_tenant_grant("
                                                       "p_tenant_id => 'B')") == "RS004"
        assert table_state(dsn) == before
        assert issue(login(roles.issuer_a, dsn), "A")
        # The issuer signs grants and does nothing else, with or without one.
        iss = login(roles.issuer, dsn)
        g = issue(iss, "A")
        for query, params in ((READ_NOTHING, ("A", g)), (USE_GRANT, (g,)),
                              ("SELECT * FROM replaysafe.actions_v", None),
                              ("SELECT * FROM replaysafe.threads_v", None)):
            assert sqlstate_of(iss, query, params) == "42501", query
    finally:
        with psycopg.connect(dsn, autocommit=True) as owner:
            owner.execute(sql.SQL("REVOKE ALL ON FUNCTION replaysafe.issue_tenant_grant("
                                  "text, interval, text, text[]) FROM {}").format(
                                      sql.Identifier(mistaken)))


# --- use_grant and the views ----------------------------------------------------------------

VIEWS = {
    "actions_v": "SELECT tenant_id, action_key FROM replaysafe.actions_v",
    "action_attempts_v": "SELECT tenant_id, action_key, attempt FROM replaysafe.action_attempts_v",
    "unresolved_actions": "SELECT tenant_id, action_key FROM replaysafe.unresolved_actions",
    "multi_effect_actions": "SELECT tenant_id, action_key FROM replaysafe.multi_effect_actions",
    "threads_v": "SELECT tenant_id, thread_id, user_id FROM replaysafe.threads_v",
}


def seen(conn: Conn) -> dict[str, list[tuple[Any, ...]]]:
    return {view: sorted(conn.execute(query).fetchall(), key=repr) for view, query in VIEWS.items()}


def expected(dsn: str, tenant: str, user: str | None = None) -> dict[str, list[tuple[Any, ...]]]:
    """What the views show of ``tenant`` (and, for threads_v, of ``user``), read as the owner,
    who reads every tenant."""
    with psycopg.connect(dsn, autocommit=True) as owner:
        rows = seen(owner)
    out = {view: [r for r in got if r[0] == tenant] for view, got in rows.items()}
    if user is not None:
        out["threads_v"] = [r for r in out["threads_v"] if r[2] == user]
    return out


NOTHING: dict[str, list[tuple[Any, ...]]] = {view: [] for view in VIEWS}


def test_use_grant_shows_its_tenant_for_the_transaction_only(world: str, roles: Roles,
                                                             login: Login, grant: Issue) -> None:
    c = login(roles.pooled)
    g = grant("A")
    assert seen(c) == NOTHING
    want = expected(world, "A")
    assert want["actions_v"] and want["threads_v"] and want["unresolved_actions"]
    assert {r[0] for rows in expected(world, "B").values() for r in rows} == {"B"}
    for end in ("COMMIT", "ROLLBACK"):
        c.execute("BEGIN")
        c.execute(USE_GRANT, (g,))
        assert seen(c) == want
        c.execute(end)
        assert seen(c) == NOTHING, end
        # Nor is the grant left in the session, for the pooler's next client to read.
        left = c.execute("SELECT current_setting('replaysafe.grant', true)").fetchone()
        assert left is not None and g not in (left[0] or ""), end
        c.execute("BEGIN")
        assert seen(c) == NOTHING, end
        c.execute("COMMIT")
    c.execute(USE_GRANT, (g,))   # in a statement of its own: over with it
    assert seen(c) == NOTHING


def test_use_grant_with_a_user_grant_shows_that_users_threads(world: str, roles: Roles,
                                                              login: Login, grant: Issue) -> None:
    c = login(roles.pooled)
    want = expected(world, "A", user="alice")
    assert want["threads_v"] and all(r[2] == "alice" for r in want["threads_v"])
    assert len(expected(world, "A")["threads_v"]) > len(want["threads_v"])
    with c.transaction():
        c.execute(USE_GRANT, (grant("A", user="alice"),))
        assert seen(c) == want     # actions stay the tenant's (documented)
    assert seen(c) == NOTHING


def test_a_setting_copied_out_of_its_transaction_is_honoured_by_nobody(
        world: str, roles: Roles, login: Login, grant: Issue) -> None:
    c, g, b = login(roles.pooled), grant("A"), grant("B")
    c.execute("BEGIN")
    c.execute(USE_GRANT, (b,))
    row = c.execute("SELECT current_setting('replaysafe.grant')").fetchone()
    assert row is not None and row[0].endswith(b)
    sealed_b = row[0]
    c.execute(USE_GRANT, (g,))
    row = c.execute("SELECT current_setting('replaysafe.grant')").fetchone()
    assert row is not None and row[0].endswith(g)
    sealed = row[0]
    assert seen(c) == expected(world, "A")
    # Another grant under this transaction's seal of B: nothing.
    c.execute("SELECT set_config('replaysafe.grant', %s, true)",
              (sealed_b[:len(sealed_b) - len(b)] + g,))
    assert seen(c) == NOTHING
    c.execute("COMMIT")
    for value in (sealed, g):
        c.execute(sql.SQL("SET replaysafe.\"grant\" = {}").format(sql.Literal(value)))  # session-level
        assert c.execute("SELECT current_setting('replaysafe.grant')").fetchone() == (value,)
        assert seen(c) == NOTHING
        c.execute("BEGIN")
        assert seen(c) == NOTHING
        c.execute("COMMIT")
        c.execute("BEGIN")
        c.execute("SELECT set_config('replaysafe.grant', %s, true)", (value,))
        assert seen(c) == NOTHING
        c.execute("ROLLBACK")
        other = login(roles.pooled)   # another session of the same login
        other.execute(sql.SQL("SET replaysafe.\"grant\" = {}").format(sql.Literal(value)))
        assert seen(other) == NOTHING
    # The same connection still honours a grant put in force by use_grant.
    with c.transaction():
        c.execute(USE_GRANT, (g,))
        assert seen(c) == expected(world, "A")


def test_use_grant_twice_the_second_replaces_the_first(world: str, roles: Roles, login: Login,
                                                       grant: Issue) -> None:
    c = login(roles.pooled)
    a, b = grant("A"), grant("B")
    alice, bob = grant("A", user="alice"), grant("A", user="bob")
    for first, second, want in ((a, b, expected(world, "B")), (b, a, expected(world, "A")),
                                (alice, a, expected(world, "A")),
                                (a, alice, expected(world, "A", user="alice")),
                                (alice, bob, expected(world, "A", user="bob"))):
        with c.transaction():
            c.execute(USE_GRANT, (first,))
            c.execute(USE_GRANT, (second,))
            assert seen(c) == want
    assert seen(c) == NOTHING


def test_use_grant_needs_a_duty_of_both_grant_and_login(world: str, roles: Roles, login: Login,
                                                        grant: Issue) -> None:
    auditor_grant = grant("A", duties=["auditor"])
    before = table_state(world)
    for role in (roles.pooled, roles.workop):
        c = login(role)
        assert sqlstate_of(c, USE_GRANT, (auditor_grant,)) == "RS004", role
        with c.transaction():
            c.execute(USE_GRANT, (grant("A", duties=["worker"]),))
            assert seen(c) == expected(world, "A")
    assert table_state(world) == before
    # An auditor login: a worker grant gives it nothing; an auditor grant narrows it to A.
    aud = login(roles.auditor)
    assert sqlstate_of(aud, USE_GRANT, (grant("A"),)) == "RS004"
    with aud.transaction():
        aud.execute(USE_GRANT, (auditor_grant,))
        assert seen(aud) == expected(world, "A")


def test_a_grant_in_force_is_verified_again_at_every_read(world: str, roles: Roles,
                                                          login: Login, grant: Issue) -> None:
    key = f"r3_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(world, autocommit=True) as owner:
        owner.execute(CLAIM_AS_OWNER, ("R3", key))
    c = login(roles.pooled)
    c.execute("BEGIN")
    c.execute(USE_GRANT, (grant("R3"),))
    assert ("R3", key) in seen(c)["actions_v"]
    with psycopg.connect(world, autocommit=True) as owner:
        owner.execute("SELECT replaysafe.revoke_tenant_grants(p_tenant_id => 'R3')")
    assert sqlstate_of(c, VIEWS["actions_v"]) == "RS004"
    c.execute("ROLLBACK")
    assert seen(c) == NOTHING


# --- LangGraph ------------------------------------------------------------------------------

def lg_calls(thread: str, g: str) -> dict[str, tuple[str, dict[str, Any]]]:
    p = {"t": "A", "thread": thread, "g": g, "blobs": [b"1"], "target": f"copy_{thread}"}
    return {
        "langgraph_get_tuple": ("SELECT checkpoint_id FROM replaysafe.langgraph_get_tuple("
                                "p_tenant_id => %(t)s, p_thread_id => %(thread)s, "
                                "p_grant => %(g)s)", p),
        "langgraph_list": ("SELECT checkpoint_id FROM replaysafe.langgraph_list(p_tenant_id => "
                           "%(t)s, p_thread_id => %(thread)s, p_grant => %(g)s)", p),
        "langgraph_delete_thread": ("SELECT replaysafe.langgraph_delete_thread(p_tenant_id => "
                                    "%(t)s, p_thread_id => %(thread)s, p_grant => %(g)s)", p),
        "langgraph_put": (LG_PUT, lg_params("A", thread, g, cp="cp-2")),
        "langgraph_put_writes": ("SELECT replaysafe.langgraph_put_writes(p_tenant_id => %(t)s, "
                                 "p_thread_id => %(thread)s, p_checkpoint_ns => '', "
                                 "p_checkpoint_id => 'cp-1', p_task_id => 'task', "
                                 "p_task_path => '', p_idx => '{0}', p_channels => '{msg}', "
                                 "p_types => '{json}', p_blobs => %(blobs)s::bytea[], "
                                 "p_grant => %(g)s)", p),
        "langgraph_copy_thread": ("SELECT replaysafe.langgraph_copy_thread(p_tenant_id => %(t)s, "
                                  "p_source_thread_id => %(thread)s, "
                                  "p_target_thread_id => %(target)s, p_grant => %(g)s)", p),
        "langgraph_prune": ("SELECT replaysafe.langgraph_prune(p_tenant_id => %(t)s, "
                            "p_thread_ids => ARRAY[%(thread)s], p_strategy => 'delete', "
                            "p_grant => %(g)s)", p),
    }


LG_LIST_ALL = ("SELECT thread_id, checkpoint_id FROM replaysafe.langgraph_list("
               "p_tenant_id => 'A', p_grant => %s)")


def test_langgraph_threads_under_a_user_grant_are_that_users(world: str, roles: Roles,
                                                             login: Login, grant: Issue) -> None:
    alice, bob, tenant = grant("A", user="alice"), grant("A", user="bob"), grant("A")
    c = login(roles.pooled)
    tag = uuid.uuid4().hex[:8]
    hers, his = f"lg_alice_{tag}", f"lg_bob_{tag}"
    assert c.execute(LG_PUT, lg_params("A", hers, alice, run=f"run-{hers}")).fetchone() == (True,)
    assert c.execute(LG_PUT, lg_params("A", his, bob, run=f"run-{his}")).fetchone() == (True,)
    assert owner_rows(world, "SELECT tenant_id, user_id FROM replaysafe.langgraph_thread_users "
                      "WHERE thread_id IN (%s, %s) ORDER BY user_id", (hers, his)) == [
        ("A", "alice"), ("A", "bob")]
    before = table_state(world)
    for name, (query, params) in lg_calls(hers, bob).items():
        assert sqlstate_of(c, query, params) == "RS004", name
    assert c.execute("SELECT replaysafe.langgraph_delete_for_runs(p_tenant_id => 'A', "
                     "p_run_ids => ARRAY[%s], p_grant => %s)",
                     (f"run-{hers}", bob)).fetchone() == (0,)
    listed = c.execute(LG_LIST_ALL, (bob,)).fetchall()
    assert listed == [(his, "cp-1")]    # bob's own, none of alice's nor the tenant's
    assert table_state(world) == before
    # Alice reaches hers (so bob's refusals are about the user), the tenant reaches both.
    get = lg_calls(hers, alice)["langgraph_get_tuple"]
    assert c.execute(get[0], get[1]).fetchall() == [("cp-1",)]
    assert c.execute(LG_LIST_ALL, (alice,)).fetchall() == [(hers, "cp-1")]
    everyone = {r[0] for r in c.execute(LG_LIST_ALL, (tenant,)).fetchall()}
    assert {hers, his, "lg_shared"} <= everyone
    delete = lg_calls(hers, alice)["langgraph_delete_thread"]
    assert c.execute(delete[0], delete[1]).fetchone() == (True,)


def test_a_user_grant_does_not_reach_a_langgraph_thread_of_the_whole_tenant(
        world: str, roles: Roles, login: Login, grant: Issue) -> None:
    alice = grant("A", user="alice")
    c = login(roles.pooled)
    before = table_state(world)
    for name, (query, params) in lg_calls("lg_shared", alice).items():
        assert sqlstate_of(c, query, params) == "RS004", name
    assert table_state(world) == before
    get = lg_calls("lg_shared", grant("A"))["langgraph_get_tuple"]
    assert c.execute(get[0], get[1]).fetchall() == [("cp-1",)]
