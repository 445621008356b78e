"""Every command example of docs/cli.md and README.md runs, so the docs cannot go stale.

A fenced ``text``/``console`` block whose lines start with ``$ `` is a transcript: each
``$`` command runs (in one bash session per block, so ``export`` and ``echo $?`` work) against
databases made for that block, and what the docs show under it is checked:

* the exit status: 2 when the shown output is an error (``replaysafe-pg: error: ...``),
  else 0 — unless the next command is ``echo $?``, whose shown output then says it;
* the first shown line (stdout, or stderr when stdout is empty or for an error) equals the
  real first line, with every run of digits masked, blanks collapsed and the test's
  database, role and directory names put back to the docs' names; a first line ``...``
  is not compared;
* after ``<!-- docs-test: full -->`` every shown line is compared so.

A fenced ``bash`` block runs each ``replaysafe-pg`` line the same way (exit status 0).
``<!-- docs-test: skip: REASON -->`` before a block keeps the block out (few, each with its
reason: listed in :data:`EXPECTED_SKIPS`). Transcripts may only show the head revision.

The docs' DSNs name the databases a block gets: ``postgresql://app@db/app`` (and no
``--dsn``: REPLAYSAFE_DSN) a migrated database seeded with the docs' story (tenant acme),
``.../fresh`` an empty one, ``.../squatted`` one whose ``replaysafe`` schema the migration
did not create, ``.../tampered`` a migrated one with a function of a stranger in the schema,
``postgresql://acme_app@db/app`` a worker login bound to acme; ``myapp.reconcile:LOOKUPS``
is a lookups module in the block's working directory.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers.cli import console_script, script_env
from helpers.db import clone_database, drop_database, dsn_for
from psycopg import conninfo as pg_conninfo

from replaysafe_pg import Ledger, Threads, embedded, schema

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "docs" / "cli.md", ROOT / "README.md"]
EXPECTED_SKIPS = 5
DOCS_PGDATA = ("/tmp/replaysafe-pg/pgdata", "~/.local/share/replaysafe-pg/pgdata")
_MARK = "@@docs-test-rc@@"


@dataclass
class Command:
    line: str
    shown: list[str]


@dataclass
class Block:
    source: str
    lineno: int
    kind: str  # transcript | bash
    commands: list[Command]
    full: bool = False
    skip: str | None = None

    @property
    def id(self) -> str:
        return f"{self.source}:{self.lineno}"


def parse(path: Path) -> list[Block]:
    blocks: list[Block] = []
    lines = path.read_text().splitlines()
    marker: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        found = re.match(r"<!-- docs-test: (.*?) -->", line.strip())
        if found:
            marker = found.group(1)
        fence = re.match(r"```(\w*)$", line)
        if not fence:
            i += 1
            continue
        lang, start = fence.group(1), i + 1
        i += 1
        body: list[str] = []
        while not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        block = _block(path.name, start, lang, body)
        if block is not None:
            if marker is not None and marker.startswith("skip"):
                block.skip = marker.removeprefix("skip").lstrip(": ")
            block.full = marker == "full"
            blocks.append(block)
        marker = None
    return blocks


def _block(source: str, lineno: int, lang: str, body: list[str]) -> Block | None:
    if lang in ("text", "console") and any(line.startswith("$ ") for line in body):
        commands: list[Command] = []
        for line in body:
            if line.startswith("$ "):
                commands.append(Command(line[2:], []))
            elif commands and commands[-1].line.endswith("\\") and not commands[-1].shown:
                commands[-1].line = commands[-1].line[:-1] + " " + line.strip()
            elif commands:
                commands[-1].shown.append(line)
        return Block(source, lineno, "transcript", commands)
    if lang == "bash":
        runs = [Command(line.split("  #")[0].strip(), []) for line in body
                if "replaysafe-pg" in line]
        return Block(source, lineno, "bash", runs) if runs else None
    return None


BLOCKS = [b for path in DOCS for b in parse(path)]


# --- the databases a block talks to ---------------------------------------------------------

T0 = datetime.now(UTC) - timedelta(hours=3)
LEASE = timedelta(seconds=30)


def seed_story(dsn: str) -> None:
    """The docs' story, tenant acme: refund:o_41 succeeded, refund:o_42 unknown (thread th_1),
    refund:o_43 failed, one running action, one more unknown; thread support-7 of user u_19."""
    at = lambda minutes: T0 + timedelta(minutes=minutes)  # noqa: E731
    with Ledger(dsn, tenant_id="acme", worker_id="worker-1") as led:
        c = led.claim("refund:o_41", "refund_order", {"order_id": "o_41", "amount_cents": 900},
                      lease=LEASE, now=at(0))
        led.complete(c, {"refund_id": "re_3fba651dce7149"},
                     provider_reference="re_3fba651dce7149", now=at(1))
        for key, thread in (("refund:o_42", "th_1"), ("tc:4.th_1:5.msg_7:6.call_3", "th_1")):
            led.claim(key, "refund_order", {"order_id": "o_42", "amount_cents": 2500},
                      thread_id=thread, lease=LEASE, now=at(2))
            led.claim(key, "refund_order", {"order_id": "o_42", "amount_cents": 2500},
                      thread_id=thread, lease=LEASE, now=at(4))
        c = led.claim("refund:o_43", "refund_order", {"order_id": "o_43", "amount_cents": 100},
                      lease=LEASE, now=at(5))
        led.fail(c, {"reason": "card_closed"}, now=at(6))
        led.claim("refund:o_77:req_2", "refund_order", {"order_id": "o_77"},
                  lease=timedelta(hours=6), now=at(7))
    with Threads(dsn, tenant_id="acme", user_id="u_19") as th:
        for version in range(5):
            th.write("support-7", {"messages": [{"role": "user", "content": "I was charged twice"}],
                                   "step": version}, version)


LOOKUPS = '''
from replaysafe_pg.reconcile import Succeeded

def refund_order(action):
    return Succeeded({"refund_id": "re_a3db4ac5793c46"}, provider_reference="re_a3db4ac5793c46")

LOOKUPS = {"refund_order": refund_order}
'''


@dataclass
class Place:
    """The databases, role and directories of one block, made on first mention."""

    admin_dsn: str
    template: str
    make_role: Callable[..., str]
    cwd: Path
    pgdata: Path
    dsns: dict[str, str] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)  # test name -> docs name
    databases: list[str] = field(default_factory=list)

    def database(self, docs_name: str) -> str:
        if docs_name in self.dsns:
            return self.dsns[docs_name]
        if docs_name == "fresh" or docs_name == "squatted":
            name = f"rs_d_{uuid.uuid4().hex[:10]}"
            with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
        else:
            name = clone_database(self.admin_dsn, self.template)
        self.databases.append(name)
        dsn = dsn_for(self.admin_dsn, name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            if docs_name == "squatted":
                conn.execute("CREATE SCHEMA replaysafe")
            if docs_name == "tampered":
                conn.execute("CREATE FUNCTION replaysafe.helper() RETURNS int LANGUAGE sql "
                             "AS 'SELECT 1'")
        if docs_name == "app":
            seed_story(dsn)
            with psycopg.connect(dsn, autocommit=True) as conn:
                # Statistics, as autovacuum keeps them: metrics' estimates need them.
                conn.execute("ANALYZE replaysafe.actions, replaysafe.threads")
        self.dsns[docs_name] = dsn
        self.names[name] = docs_name
        return dsn

    def acme_app(self) -> str:
        app = self.database("app")
        if "acme_app" not in self.dsns:
            role = self.make_role("replaysafe_worker")
            with psycopg.connect(app, autocommit=True) as conn:
                conn.execute("SELECT replaysafe.bind_role_to_tenant(p_role => %s, "
                             "p_tenant_id => 'acme')", (role,))
            self.dsns["acme_app"] = pg_conninfo.make_conninfo(app, user=role)
            self.names[role] = "acme_app"
        return self.dsns["acme_app"]

    def substitute(self, command: str) -> str:
        def dsn(match: re.Match[str]) -> str:
            user, db = match.group(1), match.group(2)
            real = self.acme_app() if user == "acme_app" else self.database(db)
            return "'" + real.replace("'", "'\\''") + "'"
        return re.sub(r"postgresql://(\w+)@db/(\w+)", dsn, command)

    def restore(self, text: str) -> str:
        """Real output with the docs' names put back."""
        for real, docs in self.names.items():
            text = text.replace(real, docs)
        return text.replace(str(self.pgdata), DOCS_PGDATA[0])

    def drop(self) -> None:
        for name in self.databases:
            drop_database(self.admin_dsn, name)


def normalise(line: str) -> str:
    for default in DOCS_PGDATA:
        line = line.replace(default, "PGDATA")
    line = re.sub(r"(PostgreSQL [\d.]+) \([^)]*\)", r"\1", line)  # a distribution's suffix
    return " ".join(re.sub(r"\d+", "9", line).split())


@pytest.fixture
def place(admin_dsn: str, template_db: str, make_role: Any, tmp_path: Path) -> Iterator[Place]:
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "reconcile.py").write_text(LOOKUPS)
    top = Path(tempfile.mkdtemp(prefix="rs-doc-", dir="/tmp"))  # short: a socket lives there
    p = Place(admin_dsn, template_db, make_role, tmp_path, top / "pgdata")
    try:
        yield p
    finally:
        try:
            for pid in embedded.postmasters_of(p.pgdata):
                embedded.stop_pid(pid, timeout=5)
        finally:
            shutil.rmtree(top, ignore_errors=True)
            p.drop()


def run_block(place: Place, commands: list[str]) -> list[tuple[int, str, str]]:
    """Each command's exit status, stdout and stderr: in-process when every command is a
    plain ``replaysafe-pg ...`` (fast), else in one bash session."""
    if not any(re.search(r"[$|>&;`]", c) or not c.startswith("replaysafe-pg ") for c in commands):
        return [_in_process(place, c) for c in commands]
    script = "".join(f"{c}\n__rc=$?; echo {_MARK} $__rc; echo {_MARK} >&2; (exit $__rc)\n"
                     for c in commands)
    env = script_env(REPLAYSAFE_DSN=place.database("app"), REPLAYSAFE_PGDATA=str(place.pgdata),
                     PATH=f"{Path(console_script()).parent}:{os.environ['PATH']}",
                     COLUMNS="200")
    done = subprocess.run(["bash", "--noprofile", "--norc", "-c", script], env=env,
                          cwd=place.cwd, capture_output=True, text=True, timeout=300)
    outs, errs = done.stdout.split(_MARK), done.stderr.split(_MARK)
    results = []
    for n in range(len(commands)):
        rc_and_rest = outs[n + 1].lstrip().split("\n", 1)[0] if n + 1 < len(outs) else "-1"
        out = outs[n] if n == 0 else outs[n].split("\n", 1)[1] if "\n" in outs[n] else ""
        err = errs[n] if n == 0 else errs[n].split("\n", 1)[1] if "\n" in errs[n] else ""
        results.append((int(rc_and_rest), out, err))
    return results


def _in_process(place: Place, command: str) -> tuple[int, str, str]:
    from helpers.cli import run

    cwd = os.getcwd()
    os.chdir(place.cwd)
    try:
        result = run(*shlex.split(command)[1:], env={
            "REPLAYSAFE_DSN": place.database("app"), "REPLAYSAFE_PGDATA": str(place.pgdata)})
    finally:
        os.chdir(cwd)
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.skip is None], ids=lambda b: b.id)
def test_docs_example_runs_as_shown(block: Block, place: Place) -> None:
    commands = [place.substitute(c.line) for c in block.commands]
    results = run_block(place, commands)
    for n, (command, (rc, out, err)) in enumerate(zip(block.commands, results, strict=True)):
        shown = command.shown
        out, err = place.restore(out), place.restore(err)
        error = bool(shown) and shown[0].startswith("replaysafe-pg: error:")
        following = block.commands[n + 1].line if n + 1 < len(block.commands) else ""
        where = f"{block.id}: $ {command.line}\n--- stdout:\n{out}--- stderr:\n{err}"
        if error:
            assert rc == 2, where
        elif following.strip() != "echo $?":
            assert rc == 0, where
        if not shown or shown[0].strip() == "...":
            continue
        real = (err if error or not out.strip() else out).splitlines()
        if error:  # after a progress bar's label, say
            real = real[next((i for i, x in enumerate(real) if x.startswith("replaysafe-pg:")), 0):]
        count = len(shown) if block.full else 1
        assert [normalise(x) for x in real[:count]] == [normalise(x) for x in shown[:count]], where


def test_skipped_examples_are_few_and_say_why() -> None:
    skipped = [b for b in BLOCKS if b.skip is not None]
    assert len(skipped) == EXPECTED_SKIPS, [b.id for b in skipped]
    assert all(len(b.skip or "") > 10 for b in skipped), [(b.id, b.skip) for b in skipped]


def test_every_command_of_the_cli_has_a_run_example() -> None:
    from helpers.cli import run

    run_lines = " ".join(c.line for b in BLOCKS if b.skip is None for c in b.commands)
    for name in ("migrate", "migrate current", "doctor", "actions list", "actions show", "audit",
                 "resolve", "reconcile", "reopen", "sweep", "purge", "threads show",
                 "threads history", "server start", "server status", "server url",
                 "server stop", "--version"):
        assert re.search(rf"replaysafe-pg (--\S+ \S+ )*{re.escape(name)}\b", run_lines), name
    assert run("--help").exit_code == 0


def test_transcripts_show_only_the_head_revision() -> None:
    head = schema.head_revision()
    pattern = r"(?<![\w+:.-])0\d{3}(?![\w:.])"
    for block in BLOCKS:
        for command in block.commands:
            # A revision the command names (``--revision 0002``) may be shown too.
            allowed = {head, *re.findall(pattern, command.line)}
            for line in command.shown:
                for revision in re.findall(pattern, line):
                    assert revision in allowed, (block.id, line)
