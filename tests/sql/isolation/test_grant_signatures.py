"""The primitives tenant grants are made of (sql/functions/tenant_grants.sql): HMAC-SHA256
built from sha256() against every RFC 4231 test vector, base64url against Python's, and a
grant as a standard compact JWS (HS256) that any JWT library verifies with the key. The
helpers are private (owner only): called here as the schema owner."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from helpers.db import cloned_database, connect_as
from helpers.grants import claims_of, header_of, parts, unb64url

Conn = psycopg.Connection[Any]
MakeRole = Callable[..., str]


@pytest.fixture(scope="module")
def owner(admin_dsn: str, template_db: str) -> Iterator[Conn]:
    """The schema owner, on a migrated database of the module's own."""
    with cloned_database(admin_dsn, template_db) as dsn, psycopg.connect(dsn, autocommit=True) as c:
        yield c


# RFC 4231 section 4: (key, data, HMAC-SHA-256). Test case 5's output is truncated to 128 bits.
RFC4231 = {
    1: (b"\x0b" * 20, b"Hi There",
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
    2: (b"Jefe", b"what do ya want for nothing?",
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
    3: (b"\xaa" * 20, b"\xdd" * 50,
        "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"),
    4: (bytes(range(0x01, 0x1a)), b"\xcd" * 50,
        "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"),
    5: (b"\x0c" * 20, b"Test With Truncation",
        "a3b6167473100ee06e0c796c2955552b"),
    6: (b"\xaa" * 131, b"Test Using Larger Than Block-Size Key - Hash Key First",
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"),
    7: (b"\xaa" * 131,
        b"This is a test using a larger than block-size key and a larger than block-size data."
        b" The key needs to be hashed before being used by the HMAC algorithm.",
        "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"),
}


def hmac_sql(owner: Conn, key: bytes, data: bytes) -> bytes:
    row = owner.execute("SELECT replaysafe._hmac_sha256(%s::bytea, %s::bytea)", (key, data)).fetchone()
    assert row is not None
    return bytes(row[0])


@pytest.mark.parametrize("case", sorted(RFC4231))
def test_hmac_sha256_meets_rfc_4231(owner: Conn, case: int) -> None:
    key, data, expected = RFC4231[case]
    mac = hmac_sql(owner, key, data)
    assert len(mac) == 32
    if case == 5:
        assert mac[:16].hex() == expected
    else:
        assert mac.hex() == expected


def test_hmac_sha256_agrees_with_python_around_the_block_size(owner: Conn) -> None:
    rng = random.Random(4231)
    for length in (*range(0, 70), 127, 128, 129, 200):   # keys shorter, as long, longer than a block
        key = rng.randbytes(length)
        data = rng.randbytes(rng.randrange(0, 300))
        assert hmac_sql(owner, key, data) == hmac.new(key, data, hashlib.sha256).digest(), length


def test_base64url_round_trips_as_python_spells_it(owner: Conn) -> None:
    # The decoding helper, where the function set has one (else grants decode inline).
    decode = owner.execute("SELECT to_regprocedure('replaysafe._base64url_decode(text)') IS NOT NULL"
                           ).fetchone() == (True,)
    rng = random.Random(4648)
    for length in range(71):    # past 57 bytes: encode() breaks lines at 76 characters
        for data in (rng.randbytes(length), b"\xff" * length, b"\xfb\xef" * (length // 2)):
            want = base64.urlsafe_b64encode(data).rstrip(b"=").decode()
            row = owner.execute("SELECT replaysafe._base64url(%s::bytea)", (data,)).fetchone()
            assert row == (want,), length
            if decode:
                row = owner.execute(
                    "SELECT replaysafe._base64url_decode(replaysafe._base64url(%s::bytea)), "
                    "replaysafe._base64url_decode(%s)", (data, want)).fetchone()
                assert row is not None
                assert (bytes(row[0]), bytes(row[1])) == (data, data), length
            assert base64.urlsafe_b64decode(want + "=" * (-len(want) % 4)) == data


def test_a_grant_is_a_compact_hs256_jws_under_the_installations_key(owner: Conn) -> None:
    row = owner.execute("SELECT replaysafe.issue_tenant_grant(p_tenant_id => 'A', "
                        "p_ttl => '90 minutes', p_user_id => 'alice', "
                        "p_duties => '{worker,auditor}')").fetchone()
    assert row is not None
    grant: str = row[0]
    header, claims_part, signature = parts(grant)
    keys = owner.execute("SELECT header, key_id, inner_pad, outer_pad "
                         "FROM replaysafe.grant_keys").fetchall()
    assert len(keys) == 1 and keys[0][0] == header
    _, key_id, inner_pad, outer_pad = keys[0]
    assert header_of(grant) == {"alg": "HS256", "kid": key_id, "typ": "JWT"}
    # The key (zero-padded to a block, as HMAC pads it) from its stored pads.
    key = bytes(b ^ 0x36 for b in bytes(inner_pad))
    assert bytes(outer_pad) == bytes(b ^ 0x5C for b in key)
    assert key.rstrip(b"\0") and len(key.rstrip(b"\0")) <= 32
    mac = hmac.new(key, f"{header}.{claims_part}".encode(), hashlib.sha256).digest()
    assert unb64url(signature) == mac
    assert base64.urlsafe_b64encode(mac).rstrip(b"=").decode() == signature
    claims = claims_of(grant)
    installation = owner.execute("SELECT i.installation_id::text, d.oid::text, d.datname::text "
                                 "FROM replaysafe.installation i, pg_database d "
                                 "WHERE d.datname = current_database()").fetchone()
    assert installation is not None
    # It names the installation, and this database (by OID or by name).
    assert claims["iss"] in (f"replaysafe:{installation[0]}:{installation[1]}",
                             f"replaysafe:{installation[0]}:{installation[2]}")
    assert (claims["tid"], claims["sub"], claims["dut"], claims["gen"]) == (
        "A", "alice", ["auditor", "worker"], 0)
    assert claims["exp"] - claims["iat"] == 5400
    assert set(claims) == {"iss", "tid", "sub", "dut", "iat", "exp", "gen"}
    assert json.loads(unb64url(claims_part)) == claims


def test_the_helpers_are_the_owners_alone(owner: Conn, make_role: MakeRole) -> None:
    """No group role (nor a member of one) may run a private helper: every function of the
    schema whose name starts with "_", the grant machinery's among them."""
    private = [r[0] for r in owner.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p "
        "WHERE p.pronamespace = 'replaysafe'::regnamespace AND p.proname LIKE '\\_%' "
        "ORDER BY 1").fetchall()]
    assert {"replaysafe._hmac_sha256(bytea,bytea)", "replaysafe._base64url(bytea)",
            "replaysafe._hmac_pads(bytea)", "replaysafe._new_grant_key()",
            "replaysafe._grant_seal(text)"} <= set(private), private
    dsn = owner.info.dsn
    for group in ("replaysafe_worker", "replaysafe_operator", "replaysafe_auditor",
                  "replaysafe_issuer"):
        member = make_role(group)
        for role in (group, member):
            executable = [f for f in private if owner.execute(
                "SELECT has_function_privilege(%s, %s, 'EXECUTE')", (role, f)).fetchone() != (False,)]
            assert executable == [], role
        with connect_as(dsn, member) as c:
            for call in ("_hmac_sha256(''::bytea, ''::bytea)", "_base64url(''::bytea)",
                         "_new_grant_key()"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    c.execute(f"SELECT replaysafe.{call}".encode())
