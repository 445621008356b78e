"""Release a revision: freeze its function set and checksum its files.

    python migrations/release.py 0010

writes ``migrations/snapshots/0010.sql`` (the tree's function set, ``sql/functions``,
``sql/views``, ``sql/grants.sql``, as the revision installs it) and adds the sha256 of that
snapshot and of the revision's SQL files to ``migrations/released.sha256``. From then on a
step arriving at the revision applies the snapshot, whatever the tree becomes, and
``tests/unit/test_released_revisions.py`` refuses any edit of those files. Release the head
revision only, when it lands: the tree must still be its desired state.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from replaysafe_pg import _sqltree, schema

HERE = Path(__file__).resolve().parent


def release(revision: str, directory: Path = HERE) -> list[str]:
    if revision != schema.head_revision():
        raise SystemExit(f"release.py: only the head revision ({schema.head_revision()}) can be "
                         f"released: the tree (sql/) is its function set, not {revision}'s")
    if revision in _sqltree.released_revisions(directory):
        raise SystemExit(f"release.py: revision {revision} is released already")
    snapshot = _sqltree.snapshot_path(revision, directory)
    snapshot.parent.mkdir(exist_ok=True)
    snapshot.write_text(_sqltree.function_set_sql(), encoding="utf-8")
    files = [*sorted((directory / "versions").glob(f"{revision}_*.sql")), snapshot]
    lines = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(directory).as_posix()}"
             for p in files]
    with (directory / "released.sha256").open("a", encoding="utf-8") as manifest:
        manifest.write("\n".join(lines) + "\n")
    return lines


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python migrations/release.py REVISION")
    print("\n".join(release(sys.argv[1])))
