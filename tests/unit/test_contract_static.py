"""The contract, read from the files: outcome names and SQLSTATEs of the SQL against Python,
no Python helper for the idempotency key."""

from __future__ import annotations

import re

from replaysafe_pg import errors
from replaysafe_pg.models import ClaimOutcome, ReportOutcome
from replaysafe_pg.schema import schema_sql


def test_outcome_names_in_sql_equal_python_enums() -> None:
    sql = schema_sql()
    claim_outcomes = set(re.findall(r"RETURN \('(\w+)', a.state", sql))
    report_outcomes = set(re.findall(r"v_outcome := '(\w+)'", sql))
    assert claim_outcomes == {o.value for o in ClaimOutcome}
    assert report_outcomes == {o.value for o in ReportOutcome}


def test_every_rs_sqlstate_raised_in_sql_is_mapped() -> None:
    raised = set(re.findall(r"'(RS\d{3})'", schema_sql()))
    assert raised <= set(errors.BY_SQLSTATE)
    assert set(errors.BY_SQLSTATE) == {f"RS00{i}" for i in range(1, 7)}
    classes = list(errors.BY_SQLSTATE.values())
    assert len(set(classes)) == len(classes)
    assert all(issubclass(c, errors.ReplaysafeError) for c in classes)


def test_no_python_helper_computes_the_idempotency_key() -> None:
    """docs/isolation.md: the key reaches a caller only in the answer to its own claim."""
    import replaysafe_pg
    from replaysafe_pg import keys

    assert not hasattr(keys, "idempotency_key")
    assert not any("idempotency" in name for name in replaysafe_pg.__all__)
