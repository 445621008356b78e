"""What the console tests share: a console subprocess on a free loopback port, and the
database state they check afterwards."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg

HOSTILE = "refund-<script>alert(1)</script>"


@dataclass
class Served:
    proc: subprocess.Popen[str]
    base: str
    token: str

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.base, follow_redirects=False, timeout=10, **kwargs)

    @contextlib.contextmanager
    def signed_in(self) -> Iterator[httpx.Client]:
        with self.client() as client:
            assert client.get(f"/?token={self.token}").status_code == 303
            yield client

    def form_token(self, client: httpx.Client, tenant: str, key: str) -> str:
        page = client.get("/action", params={"tenant": tenant, "key": key}).text
        found = re.search(r'name="form_token" value="([0-9a-f]+)"', page)
        assert found, "the page has no form"
        return found.group(1)


def start_console(dsn: str) -> Served:
    env = {**os.environ, "REPLAYSAFE_DSN": dsn}
    proc = subprocess.Popen([sys.executable, "-m", "replaysafe_pg.cli", "console", "--serve",
                             "127.0.0.1:0"], env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        found = re.search(r"open (http://127\.0\.0\.1:\d+)/\?token=(\S+)", line)
        if found:
            return Served(proc, found.group(1), found.group(2))
    proc.kill()
    raise AssertionError(f"the console did not start: {''.join(lines)}")


def state_of(dsn: str, key: str) -> tuple[str, str | None]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT state::text, resolution_note FROM replaysafe.actions_v "
                           "WHERE tenant_id = 'acme' AND action_key = %s", (key,)).fetchone()
    assert row is not None
    return row[0], row[1]


