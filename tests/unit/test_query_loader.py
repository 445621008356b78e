"""The query loader: p_now is sent only when the caller gives a time, p_grant only with a grant;
bytea goes in binary."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from replaysafe_pg import queries

TIMED = {"claim_action", "claim_actions", "heartbeat_action", "complete_action", "fail_action",
         "mark_action_unknown", "resolve_action", "reopen_action", "sweep_expired_actions",
         "purge_actions", "purge_threads"}
NOW_WORD = re.compile(r"\b(p_now|now)\b")
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def test_time_sensitive_queries_pass_p_now_in_one_form_only() -> None:
    for name, query in queries.all_queries().items():
        if NOW_WORD.search(query):
            assert query.count(queries.NOW_ARGUMENT) == 1, name
            assert not NOW_WORD.search(query.replace(queries.NOW_ARGUMENT, "")), name
    assert {n for n in queries.all_queries() if queries.takes_now(n)} == TIMED


@pytest.mark.parametrize("name", sorted(TIMED))
def test_every_query_with_p_now_has_a_variant_without_it(name: str) -> None:
    given = queries.get(name, {"now": T0})
    assert queries.NOW_ARGUMENT in given
    for params in (None, {}, {"now": None}, {"tenant_id": "t", "now": None}):
        defaulted = queries.get(name, params)
        assert not NOW_WORD.search(defaulted), (params, defaulted)
        assert defaulted == given.replace(queries.NOW_ARGUMENT, "")


def test_queries_without_time_are_the_same_whatever_the_params() -> None:
    for name in set(queries.all_queries()) - TIMED:
        written = queries.all_queries()[name]
        assert queries.get(name, {"now": T0, "grant": "g"}) == written
        assert queries.get(name) == queries.get(name, {"now": T0}) == queries.get(
            name, {"grant": None}) == written.replace(queries.GRANT_ARGUMENT, "")


# Every tenant-scoped function's query, and the grant function that takes one itself.
GRANTED = TIMED | {
    "read_thread", "write_thread", "thread_history",
    "delete_thread", "langgraph_put", "langgraph_put_writes", "langgraph_get_tuple",
    "langgraph_list", "langgraph_delete_thread", "langgraph_delete_for_runs",
    "langgraph_copy_thread", "langgraph_prune", "use_grant", "revoke_tenant_grants",
    "acting_for"}
# The grant functions whose only argument is the grant: always sent, NULL without one.
GRANT_ONLY = {"use_grant", "acting_for"}


def test_p_grant_is_sent_only_with_a_grant() -> None:
    assert {n for n in queries.all_queries() if queries.takes_grant(n)} == GRANTED - GRANT_ONLY
    for name in GRANTED - GRANT_ONLY:
        for now in (None, T0):
            with_grant = queries.get(name, {"now": now, "grant": "g"})
            assert with_grant.count(queries.GRANT_ARGUMENT) == 1, name
            assert with_grant.endswith(queries.GRANT_ARGUMENT + ")"), name
            assert queries.get(name, {"now": now}) == with_grant.replace(queries.GRANT_ARGUMENT, "")


def test_a_query_passing_the_time_another_way_is_refused() -> None:
    with pytest.raises(ValueError, match="p_now"):
        queries.without_now("SELECT f(p_now => coalesce(%(now)s::timestamptz, now()))")


def test_bytea_parameters_go_in_binary() -> None:
    # In text format psycopg hex-encodes each value and escapes it with a regular expression
    # (a 2 KB checkpoint value became 4 KB on the wire, ~11 us of client time per put), and
    # the server parses the hex back.
    typed = re.compile(r"%\((\w+)\)([sbt])::(?:pg_catalog\.)?bytea\b")
    found = [(name, m.group(1), m.group(2)) for name, query in queries.all_queries().items()
             for m in typed.finditer(query)]
    assert found, "no bytea parameter found: the pattern is out of date"
    assert [f for f in found if f[2] != "b"] == []
