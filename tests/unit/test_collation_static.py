"""The COLLATE guard of the tenant check (docs/isolation.md): every argument of a PL/pgSQL call
carries the call's collation, and so does the name ``pg_collation_for`` returns. Compared
under the caller's collation, an attacker's nondeterministic one could make its own name
equal '"default"' and its tenant id equal another's: every
such comparison in the schema is made under "C"."""

from __future__ import annotations

import re

from replaysafe_pg import schema


def test_every_collation_guard_compares_under_c() -> None:
    text = schema.schema_sql()
    guards = re.findall(r"pg_collation_for\(.*", text)
    assert len(guards) >= 8, guards  # _acts_for and the hot functions' inline checks
    for guard in guards:
        assert re.match(r'pg_collation_for\(p_tenant_id\) COLLATE "C" IS DISTINCT FROM', guard), guard


def test_the_inline_tenant_comparison_is_under_c() -> None:
    text = schema.schema_sql()
    inline = re.findall(r"\(replaysafe\._binding\(\)(.*)", text)
    assert len(inline) >= 7, inline
    for rest in inline:
        assert rest.startswith(' = p_tenant_id COLLATE "C") IS NOT TRUE'), rest
