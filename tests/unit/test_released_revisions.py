"""A released revision is never edited in place: deployed databases would never run the
change. Every file of a released revision is in ``replaysafe_pg/migrations/released.sha256``
with its checksum; files of a revision newer than every released one are in development."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

from replaysafe_pg._paths import migrations_dir


def released(directory: Path) -> dict[str, str]:
    text = (directory / "released.sha256").read_text(encoding="utf-8")
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    return {name: digest for digest, name in (ln.split(None, 1) for ln in lines)}


def revision(name: str) -> int:
    match = re.match(r"versions/(\d{4})_", name)
    assert match, f"{name}: revision files are named NNNN_..."
    return int(match.group(1))


def problems(directory: Path) -> list[str]:
    manifest = released(directory)
    found = [f"{name} was released and has changed: write a new revision instead"
             for name, digest in manifest.items()
             if hashlib.sha256((directory / name).read_bytes()).hexdigest() != digest]
    newest = max(revision(n) for n in manifest)
    for path in sorted((directory / "versions").iterdir()):
        name = f"versions/{path.name}"
        if path.suffix in (".py", ".sql") and name not in manifest and revision(name) <= newest:
            found.append(f"{name} belongs to a released revision but has no checksum")
    return found


def test_released_revisions_are_as_released() -> None:
    assert released(migrations_dir())
    assert problems(migrations_dir()) == []


def test_an_edit_or_a_stray_file_in_a_released_revision_is_seen(tmp_path: Path) -> None:
    copy = tmp_path / "migrations"
    shutil.copytree(migrations_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    with (copy / "versions" / "0001_ledger.sql").open("a", encoding="utf-8") as f:
        f.write("\n-- edited in place\n")
    (copy / "versions" / "0002_extra.sql").write_text("SELECT 1;\n", encoding="utf-8")
    (copy / "versions" / "9999_next.sql").write_text("SELECT 1;\n", encoding="utf-8")  # in development
    assert problems(copy) == [
        "versions/0001_ledger.sql was released and has changed: write a new revision instead",
        "versions/0002_extra.sql belongs to a released revision but has no checksum"]
