"""Size limits (replaysafe.limits, owner-only): a request, result, error or provider reference
over 1 MiB, a thread state or LangGraph checkpoint, blob or pending write over 32 MiB (stored
size), and a number of more than 1,000 digits are RS005 before anything is written; a result
over its limit comes after the side effect and is recorded ``unknown``; the key columns of a
LangGraph row take at most 2,000 bytes together."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from helpers.db import bind, connect_as

MIB = 1024 * 1024

CLAIM = ("SELECT c.outcome, c.attempt_token FROM replaysafe.claim_action(p_tenant_id => 'A', "
         "p_action_key => %s, p_operation => 'op', p_request => %s::jsonb, p_worker_id => 'w') c")
COMPLETE = ("SELECT replaysafe.complete_action(p_tenant_id => 'A', p_action_key => %s, "
            "p_attempt => 1, p_attempt_token => %s, p_result => %s::jsonb, "
            "p_provider_reference => %s)")


@pytest.fixture
def worker(dsn: str, make_role: Callable[..., str]) -> Iterator[psycopg.Connection[Any]]:
    role = make_role("replaysafe_worker")
    bind(dsn, role, "A")
    with connect_as(dsn, role) as c:
        c.autocommit = True
        yield c


def _stored(conn: psycopg.Connection[Any], value: str) -> int:
    row = conn.execute("SELECT pg_catalog.pg_column_size(%s::jsonb)", (value,)).fetchone()
    assert row is not None
    return int(row[0])


def _object_of_size(conn: psycopg.Connection[Any], target: int) -> str:
    """A JSON object whose stored (jsonb) size is exactly ``target`` bytes."""
    text = json.dumps({"s": "x" * (target - 64)})
    size = _stored(conn, text)
    text = json.dumps({"s": "x" * (target - 64 + target - size)})
    assert _stored(conn, text) == target
    return text


def _count(conn: psycopg.Connection[Any], table: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM replaysafe.{table}").fetchone()
    assert row is not None
    return int(row[0])


def _sqlstate(conn: psycopg.Connection[Any], query: str, params: Any) -> str | None:
    try:
        conn.execute(query, params)
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


def test_a_two_mib_request_is_refused_in_one_statement_within_a_second(
        dsn: str, worker: psycopg.Connection[Any]) -> None:
    big = json.dumps({"s": "x" * (2 * MIB)})
    started = time.monotonic()
    with pytest.raises(psycopg.Error) as caught:
        worker.execute(CLAIM, ("big", big))
    assert time.monotonic() - started < 1.0
    assert caught.value.sqlstate == "RS005"
    assert "p_request" in str(caught.value) and "1048576" in str(caught.value)
    with psycopg.connect(dsn) as owner:
        assert _count(owner, "actions") == 0


def test_exactly_at_the_limit_is_accepted_and_one_byte_more_refused(
        dsn: str, worker: psycopg.Connection[Any]) -> None:
    at = _object_of_size(worker, MIB)
    over = _object_of_size(worker, MIB + 1)
    assert worker.execute(CLAIM, ("at", at)).fetchone()[0] == "claimed"  # type: ignore[index]
    assert _sqlstate(worker, CLAIM, ("over", over)) == "RS005"
    with psycopg.connect(dsn) as owner:
        assert _count(owner, "actions") == 1


def test_the_request_is_checked_on_creation_only(dsn: str, worker: psycopg.Connection[Any]) -> None:
    request = _object_of_size(worker, 4096)
    assert worker.execute(CLAIM, ("k", request)).fetchone()[0] == "claimed"  # type: ignore[index]
    with psycopg.connect(dsn, autocommit=True) as owner:
        owner.execute("UPDATE replaysafe.limits SET request_bytes = 1024")
    # A later claim of the same action compares the request; the new limit does not apply.
    assert worker.execute(CLAIM, ("k", request)).fetchone()[0] == "running"  # type: ignore[index]
    assert _sqlstate(worker, CLAIM, ("k2", request)) == "RS005"


def test_a_result_over_its_limit_is_recorded_unknown(dsn: str, worker: psycopg.Connection[Any]) -> None:
    token = worker.execute(CLAIM, ("r", "{}")).fetchone()[1]  # type: ignore[index]
    result = _object_of_size(worker, MIB + 1)
    outcome = worker.execute(COMPLETE, ("r", token, result, "ref-1")).fetchone()[0]  # type: ignore[index]
    assert outcome == "recorded"
    row = worker.execute("SELECT state, result, error FROM replaysafe.actions_v "
                         "WHERE action_key = 'r'").fetchone()
    assert row == ("unknown", None, {"reason": "result_too_large", "bytes": MIB + 1,
                                     "provider_reference": "ref-1"})
    # At the limit it is a success.
    token = worker.execute(CLAIM, ("r2", "{}")).fetchone()[1]  # type: ignore[index]
    at = _object_of_size(worker, MIB)
    assert worker.execute(COMPLETE, ("r2", token, at, None)).fetchone()[0] == "recorded"  # type: ignore[index]
    row = worker.execute("SELECT state FROM replaysafe.actions_v WHERE action_key = 'r2'").fetchone()
    assert row == ("succeeded",)


def test_a_provider_reference_over_its_limit_is_recorded_unknown(
        worker: psycopg.Connection[Any]) -> None:
    token = worker.execute(CLAIM, ("p", "{}")).fetchone()[1]  # type: ignore[index]
    outcome = worker.execute(COMPLETE, ("p", token, "{}", "r" * (MIB + 1))).fetchone()[0]  # type: ignore[index]
    assert outcome == "recorded"
    row = worker.execute("SELECT state, error, provider_reference "
                         "FROM replaysafe.actions_v WHERE action_key = 'p'").fetchone()
    assert row == ("unknown", {"reason": "result_too_large",
                               "provider_reference_bytes": MIB + 5}, None)


def test_a_provider_reference_that_fits_is_kept_with_a_result_too_large(
        worker: psycopg.Connection[Any]) -> None:
    token = worker.execute(CLAIM, ("p2", "{}")).fetchone()[1]  # type: ignore[index]
    result = _object_of_size(worker, MIB + 1)
    assert worker.execute(COMPLETE, ("p2", token, result, "re_123")).fetchone()[0] == "recorded"  # type: ignore[index]
    row = worker.execute("SELECT state, error, provider_reference "
                         "FROM replaysafe.actions_v WHERE action_key = 'p2'").fetchone()
    assert row == ("unknown", {"reason": "result_too_large", "bytes": MIB + 1,
                               "provider_reference": "re_123"}, "re_123")


@pytest.mark.parametrize("number", ["1e1000", "-1e1000", "0e-1000", "1e-1000",
                                    "1" * 1001, "0." + "1" * 1000, "1e131071",
                                    "1." + "0" * 1000, "-2." + "0" * 2000])
def test_a_number_of_more_than_a_thousand_digits_is_refused(
        dsn: str, worker: psycopg.Connection[Any], number: str) -> None:
    request = '{"a": [1, {"b": ' + number + "}]}"
    assert _sqlstate(worker, CLAIM, ("n", request)) == "RS005"
    with psycopg.connect(dsn) as owner:
        assert _count(owner, "actions") == 0


@pytest.mark.parametrize("number", ["1e999", "9" * 1000, "0." + "1" * 999, "0e-999", "-1.5",
                                    "0", "12345678901234567890.5"])
def test_a_number_of_at_most_a_thousand_digits_is_accepted(
        worker: psycopg.Connection[Any], number: str) -> None:
    request = '{"a": [1, {"b": ' + number + "}]}"
    assert worker.execute(CLAIM, ("n", request)).fetchone()[0] == "claimed"  # type: ignore[index]


def test_a_result_with_a_too_long_number_is_recorded_unknown(worker: psycopg.Connection[Any]) -> None:
    token = worker.execute(CLAIM, ("d", "{}")).fetchone()[1]  # type: ignore[index]
    assert worker.execute(COMPLETE, ("d", token, '{"n": 1e5000}', None)).fetchone()[0] == "recorded"  # type: ignore[index]
    row = worker.execute("SELECT state, error FROM replaysafe.actions_v WHERE action_key = 'd'").fetchone()
    assert row == ("unknown", {"reason": "result_too_large", "digits": 5001})


def test_an_error_over_its_limit_is_refused_and_changes_nothing(
        worker: psycopg.Connection[Any]) -> None:
    token = worker.execute(CLAIM, ("e", "{}")).fetchone()[1]  # type: ignore[index]
    error = json.dumps({"message": "x" * (MIB + 10)})
    for fn in ("fail_action", "mark_action_unknown"):
        assert _sqlstate(worker, f"SELECT replaysafe.{fn}(p_tenant_id => 'A', p_action_key => 'e', "
                                 "p_attempt => 1, p_attempt_token => %s, p_error => %s::jsonb)",
                         (token, error)) == "RS005"
    row = worker.execute("SELECT state FROM replaysafe.actions_v WHERE action_key = 'e'").fetchone()
    assert row == ("running",)


def test_an_operator_resolution_over_its_limit_is_refused(
        dsn: str, worker: psycopg.Connection[Any]) -> None:
    token = worker.execute(CLAIM, ("u", "{}")).fetchone()[1]  # type: ignore[index]
    worker.execute("SELECT replaysafe.mark_action_unknown(p_tenant_id => 'A', p_action_key => 'u', "
                   "p_attempt => 1, p_attempt_token => %s, p_error => '{}')", (token,))
    with psycopg.connect(dsn, autocommit=True) as owner:
        big = json.dumps({"s": "x" * (MIB + 10)})
        assert _sqlstate(owner, "SELECT replaysafe.resolve_action(p_tenant_id => 'A', "
                                "p_action_key => 'u', p_state => 'succeeded', p_result => %s::jsonb)",
                         (big,)) == "RS005"
        assert _sqlstate(owner, "SELECT replaysafe.resolve_action(p_tenant_id => 'A', "
                                "p_action_key => 'u', p_state => 'succeeded', "
                                "p_provider_reference => %s)", ("r" * (MIB + 10),)) == "RS005"
        row = owner.execute("SELECT state FROM replaysafe.actions WHERE action_key = 'u'").fetchone()
        assert row == ("unknown",)


def test_a_thread_state_over_its_limit_is_refused(dsn: str, worker: psycopg.Connection[Any]) -> None:
    with psycopg.connect(dsn, autocommit=True) as owner:
        owner.execute("UPDATE replaysafe.limits SET thread_state_bytes = 4096")
    write = ("SELECT replaysafe.write_thread(p_tenant_id => 'A', p_thread_id => 't', "
             "p_expected_version => 0, p_state => %s::jsonb)")
    assert _sqlstate(worker, write, (_object_of_size(worker, 4097),)) == "RS005"
    worker.execute(write, (_object_of_size(worker, 4096),))
    with psycopg.connect(dsn) as owner:
        assert _count(owner, "thread_versions") == 1


def test_the_default_thread_state_limit_is_thirty_two_mib(dsn: str,
                                                          worker: psycopg.Connection[Any]) -> None:
    # Incompressible text would take 32 MiB over the wire; a stored size over the limit is
    # what counts, so a value that the server expands from a short input shows it.
    write = ("SELECT replaysafe.write_thread(p_tenant_id => 'A', p_thread_id => 't', "
             "p_expected_version => 0, p_state => jsonb_build_object('s', repeat('x', %s)))")
    assert _sqlstate(worker, write, (32 * MIB,)) == "RS005"
    worker.execute(write, (32 * MIB - 64,))


PUT = ("SELECT * FROM replaysafe.langgraph_put(p_tenant_id => 'A', p_thread_id => %s, "
       "p_checkpoint_ns => %s, p_checkpoint_id => %s, p_parent_id => NULL, "
       "p_checkpoint => '{}', p_metadata => '{}', p_channels => %s, p_versions => %s, "
       "p_types => %s, p_blobs => %s)")


def test_langgraph_key_columns_over_two_thousand_bytes_are_rs005_not_54000(
        worker: psycopg.Connection[Any]) -> None:
    import secrets

    def rnd(n: int) -> str:  # random ids do not compress
        return secrets.token_hex(n)[:n]

    def wide(n: int) -> str:  # n bytes of random two-byte characters (ids: 512 characters)
        return "".join(chr(0x100 + secrets.randbelow(0x600)) for _ in range(n // 2))

    # Each id within its own bounds, together over the index's row size: RS005, not 54000.
    assert _sqlstate(worker, PUT, (wide(1024), wide(1024), wide(1024), [], [], [], [])) == "RS005"
    thread, ns = wide(900), wide(900)
    assert _sqlstate(worker, PUT, (thread, ns, rnd(201), [], [], [], [])) == "RS005"
    worker.execute(PUT, (thread, ns, rnd(200), [], [], [], []))
    # A channel and version of a blob row count with the thread and namespace.
    assert _sqlstate(worker, PUT, (thread, ns, "c2", [rnd(150)], [rnd(51)], ["t"], [b"x"])) == "RS005"
    writes = ("SELECT replaysafe.langgraph_put_writes(p_tenant_id => 'A', p_thread_id => %s, "
              "p_checkpoint_ns => %s, p_checkpoint_id => 'c3', p_task_id => %s, p_task_path => '', "
              "p_idx => '{0}', p_channels => %s, p_types => '{t}', p_blobs => %s)")
    assert _sqlstate(worker, writes, (thread, ns, rnd(150), [rnd(49)], [b"x"])) == "RS005"
    assert _sqlstate(worker, writes, (thread, ns, rnd(150), [rnd(48)], [b"x"])) is None


def test_langgraph_blobs_and_pending_writes_over_their_limits_are_refused(
        dsn: str, worker: psycopg.Connection[Any]) -> None:
    with psycopg.connect(dsn, autocommit=True) as owner:
        owner.execute("UPDATE replaysafe.limits SET blob_bytes = 1000, pending_write_bytes = 1000, "
                      "checkpoint_bytes = 1000")
    assert _sqlstate(worker, PUT, ("t", "", "c1", ["ch"], ["1"], ["t"], [b"x" * 1000])) == "RS005"
    assert _sqlstate(worker, PUT, ("t", "", "c1", ["ch"], ["1"], ["t"], [b"x" * 990])) is None
    writes = ("SELECT replaysafe.langgraph_put_writes(p_tenant_id => 'A', p_thread_id => 't', "
              "p_checkpoint_ns => '', p_checkpoint_id => 'c1', p_task_id => 'task', "
              "p_task_path => '', p_idx => '{0}', p_channels => '{ch}', p_types => '{t}', "
              "p_blobs => %s)")
    assert _sqlstate(worker, writes, ([b"x" * 1000],)) == "RS005"
    big_checkpoint = PUT.replace("p_checkpoint => '{}'", "p_checkpoint => %s::jsonb")
    assert _sqlstate(worker, big_checkpoint, ("t", "", "c2", json.dumps({"v": "x" * 1000}),
                                              [], [], [], [])) == "RS005"
    with psycopg.connect(dsn) as owner:
        assert _count(owner, "langgraph_writes") == 0


def test_no_group_role_reads_or_changes_the_limits(worker: psycopg.Connection[Any]) -> None:
    assert _sqlstate(worker, "SELECT * FROM replaysafe.limits", None) == "42501"
    assert _sqlstate(worker, "UPDATE replaysafe.limits SET request_bytes = 1", None) == "42501"


@pytest.mark.parametrize("built", ["round(1::numeric, 16383)", "round(0::numeric, 1000)",
                                   "round(12.5::numeric, 999)"])
def test_a_number_whose_scale_prints_more_digits_than_it_stores_is_refused(
        worker: psycopg.Connection[Any], built: str) -> None:
    # Built in SQL, the value keeps its scale without spelling out its zeros: a few bytes
    # stored print thousands of digits (a thousand of them would print a gigabyte).
    query = CLAIM.replace("%s::jsonb", f"jsonb_build_object('a', jsonb_build_array(1, {built}))")
    assert _sqlstate(worker, query, ("n",)) == "RS005"


def test_the_poison_array_of_scaled_numbers_is_refused_quickly(worker: psycopg.Connection[Any]) -> None:
    query = CLAIM.replace("%s::jsonb", "jsonb_build_object('a', (SELECT jsonb_agg(round(1::numeric, "
                                       "16383)) FROM generate_series(1, 20000)))")
    started = time.monotonic()
    assert _sqlstate(worker, query, ("poison",)) == "RS005"
    assert time.monotonic() - started < 5


def test_langgraph_key_columns_with_a_long_tenant_id_are_rs005_not_54000(
        dsn: str, make_role: Callable[..., str]) -> None:
    import secrets

    tenant = "".join(chr(0x100 + secrets.randbelow(0x600)) for _ in range(500))  # 1,000 bytes
    role = make_role("replaysafe_worker")
    bind(dsn, role, tenant)
    wide = "".join(chr(0x100 + secrets.randbelow(0x600)) for _ in range(450))  # 900 bytes
    with connect_as(dsn, role) as c:
        c.autocommit = True
        put = PUT.replace("p_tenant_id => 'A'", "p_tenant_id => %s")
        assert _sqlstate(c, put, (tenant, wide, wide, "c1", [], [], [], [])) == "RS005"


def test_copying_a_langgraph_thread_keeps_the_key_limit(worker: psycopg.Connection[Any]) -> None:
    import secrets

    def wide(n: int) -> str:
        return "".join(chr(0x100 + secrets.randbelow(0x600)) for _ in range(n // 2))

    ns, checkpoint = wide(900), wide(900)
    worker.execute(PUT, ("s", ns, checkpoint, [], [], [], []))
    copy = ("SELECT replaysafe.langgraph_copy_thread(p_tenant_id => 'A', p_source_thread_id => 's', "
            "p_target_thread_id => %s)")
    assert _sqlstate(worker, copy, (wide(900),)) == "RS005"
    assert worker.execute(copy, ("t",)).fetchone() == (1,)
