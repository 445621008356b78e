"""A released revision is never edited in place: deployed databases would never run the
change. Every SQL file of a released revision, and the snapshot of its function set, is in
``migrations/released.sha256`` with its checksum; files of a revision newer than every
released one are in development. From 0010 on a revision holds no function body: its
function set comes from the tree (``sql/``) and, once released, from its snapshot."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

from replaysafe_pg import _sqltree, schema
from replaysafe_pg._paths import migrations_dir

FIRST_WITH_FUNCTION_SETS = 10


def revision_of(name: str) -> int:
    match = re.match(r"(?:versions/(\d{4})_|snapshots/(\d{4})\.sql$)", name)
    assert match, f"{name}: revision files are named versions/NNNN_..., snapshots NNNN.sql"
    return int(match.group(1) or match.group(2))


def problems(directory: Path) -> list[str]:
    manifest = _sqltree.released(directory)
    found = [f"{name} was released and has changed: write a new revision instead"
             for name, digest in manifest.items()
             if hashlib.sha256((directory / name).read_bytes()).hexdigest() != digest]
    newest = max(revision_of(n) for n in manifest)
    candidates = sorted((directory / "versions").glob("*.sql")) + sorted(
        (directory / "snapshots").glob("*.sql"))
    for path in candidates:
        name = path.relative_to(directory).as_posix()
        if name not in manifest and revision_of(name) <= newest:
            found.append(f"{name} belongs to a released revision but has no checksum")
    for rev in sorted(_sqltree.released_revisions(directory)):
        if int(rev) >= FIRST_WITH_FUNCTION_SETS - 1 and f"snapshots/{rev}.sql" not in manifest:
            found.append(f"revision {rev} is released without a snapshot of its function set")
    return found


def test_released_revisions_are_as_released() -> None:
    assert _sqltree.released(migrations_dir())
    assert problems(migrations_dir()) == []


def test_an_edit_or_a_stray_file_in_a_released_revision_is_seen(tmp_path: Path) -> None:
    copy = tmp_path / "migrations"
    shutil.copytree(migrations_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    with (copy / "versions" / "0001_ledger.sql").open("a", encoding="utf-8") as f:
        f.write("\n-- edited in place\n")
    with (copy / "snapshots" / "0009.sql").open("a", encoding="utf-8") as f:
        f.write("\n-- edited in place\n")
    (copy / "versions" / "0002_extra.sql").write_text("SELECT 1;\n", encoding="utf-8")
    (copy / "versions" / "9999_next.sql").write_text("SELECT 1;\n", encoding="utf-8")  # in development
    (copy / "released.sha256").write_text("\n".join(
        ln for ln in (copy / "released.sha256").read_text().splitlines()
        if "snapshots/0010.sql" not in ln) + "\n")
    found = problems(copy)
    assert "versions/0001_ledger.sql was released and has changed: write a new revision instead" in found
    assert "snapshots/0009.sql was released and has changed: write a new revision instead" in found
    assert "versions/0002_extra.sql belongs to a released revision but has no checksum" in found
    assert not any("9999" in p for p in found)
    if "0010" in _sqltree.released_revisions(migrations_dir()):
        assert "revision 0010 is released without a snapshot of its function set" in found


def test_the_released_head_is_the_tree() -> None:
    """Once the head is released, its snapshot is the tree's function set: a change to
    sql/functions, sql/views or sql/grants.sql needs a new revision."""
    head = schema.head_revision()
    if head in _sqltree.released_revisions():
        snapshot = _sqltree.snapshot_path(head).read_text(encoding="utf-8")
        assert snapshot == _sqltree.function_set_sql(), (
            f"sql/ changed after revision {head} was released: add a revision for the change "
            "(docs/migrations.md)")


def test_no_revision_after_0009_carries_a_function_body() -> None:
    for path in sorted((migrations_dir() / "versions").glob("*.sql")):
        if revision_of(f"versions/{path.name}") >= FIRST_WITH_FUNCTION_SETS:
            text = path.read_text(encoding="utf-8")
            body = re.search(r"CREATE\s+(OR\s+REPLACE\s+)?(FUNCTION|VIEW|PROCEDURE)", text, re.I)
            assert body is None, path.name


def test_revisions_from_0010_apply_function_sets() -> None:
    for path in sorted((migrations_dir() / "versions").glob("*.py")):
        if revision_of(f"versions/{path.name}") >= FIRST_WITH_FUNCTION_SETS:
            text = path.read_text(encoding="utf-8")
            assert "run_revision(" in text and "run_revision_sql(" not in text, path.name
