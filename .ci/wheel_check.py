"""CI: the installed wheel (not the checkout) migrates a fresh embedded Postgres to the head,
installs exactly the functions of its own SQL tree, and serves a claim."""

import sys
import tempfile
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", module="platformdirs")

import psycopg  # noqa: E402

import replaysafe_pg  # noqa: E402
from replaysafe_pg import _sqltree, embedded, schema  # noqa: E402
from replaysafe_pg._paths import migrations_dir, sql_dir  # noqa: E402

venv = Path(sys.argv[1]).resolve()
package = Path(replaysafe_pg.__file__).resolve().parent
for path in (package, sql_dir(), migrations_dir()):
    assert venv in path.parents, f"{path} is not inside the wheel's venv {venv}"
assert (sql_dir() / "functions" / "ledger_claim.sql").is_file()
assert (migrations_dir() / "snapshots").is_dir()
assert (package / "alerts" / "replaysafe-rules.yml").is_file()  # replaysafe-pg metrics --alert-rules

with tempfile.TemporaryDirectory(prefix="replaysafe-wheel-", dir="/tmp") as tmp:
    server = embedded.start(Path(tmp) / "pgdata")
    try:
        replaysafe_pg.migrate(server.dsn)
        head = schema.head_revision()
        assert replaysafe_pg.current_revision(server.dsn) == head
        with psycopg.connect(server.dsn) as c:
            installed = {r[0] for r in c.execute(
                "SELECT p.oid::regprocedure::text FROM pg_proc p "
                "WHERE p.pronamespace = 'replaysafe'::regnamespace")}
            expected = {c.execute("SELECT %s::regprocedure::text", (s,)).fetchone()[0]  # type: ignore[index]
                        for s in _sqltree.signatures(_sqltree.function_set_sql())}
        assert installed == expected, installed ^ expected
        with replaysafe_pg.Ledger(server.dsn, tenant_id="t") as ledger:
            assert ledger.claim("k", "op", {}).outcome == "claimed"
        replaysafe_pg.downgrade(server.dsn, schema.revisions()[-2].revision)
        replaysafe_pg.migrate(server.dsn)
    finally:
        embedded.stop(server)
print(f"wheel {package.parent.name}: migrated to {head}, {len(installed)} functions, a claim served")
