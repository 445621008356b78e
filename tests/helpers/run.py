"""Helpers for the Ledger.run tests: a side-effect table, a fake payment provider on
127.0.0.1, and worker processes (tests/helpers/run_worker.py) that can be killed at chosen points."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg

from replaysafe_pg import Execution

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


# --- side effects counted in the database -------------------------------------------------

def make_effects_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS public.effects (key text NOT NULL, worker text, "
                  "at timestamptz NOT NULL DEFAULT clock_timestamp())")


def add_effect(dsn: str, key: str, worker: str = "") -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO public.effects (key, worker) VALUES (%s, %s)", (key, worker))


def count_effects(dsn: str, key: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT count(*) FROM public.effects WHERE key = %s", (key,)).fetchone()
    assert row is not None
    return int(row[0])


def action_row(dsn: str, key: str, tenant: str = "t1") -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as c:
        cur = c.cursor(row_factory=psycopg.rows.dict_row)
        row = cur.execute("SELECT * FROM replaysafe.actions_v WHERE tenant_id = %s AND action_key = %s",
                          (tenant, key)).fetchone()
    assert row is not None, f"no action {key}"
    return row


def attempt_rows(dsn: str, key: str) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        cur = c.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute("SELECT * FROM replaysafe.action_attempts_v WHERE action_key = %s "
                           "ORDER BY attempt", (key,)).fetchall()


def execution_json(ex: Execution) -> dict[str, Any]:
    return {"status": str(ex.status), "result": ex.result, "error": ex.error, "replay": ex.replay,
            "attempt": ex.attempt, "idempotency_key": ex.idempotency_key,
            "lease_lost": ex.lease_lost, "outcome": None if ex.outcome is None else str(ex.outcome)}


# --- a payment provider that honours Idempotency-Key ---------------------------------------

@dataclass
class Provider:
    """POST /charges {"amount": n} with an Idempotency-Key header: the first request per key
    charges (an effect); repeats get the stored response. Counts requests and effects per key.
    GET /charges?idempotency_key=K answers the charge made for K, or 404."""

    requests: dict[str, int] = field(default_factory=dict)
    effects: dict[str, int] = field(default_factory=dict)
    responses: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None
    lookups: int = 0

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/charges"

    def handle(self, key: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.requests[key] = self.requests.get(key, 0) + 1
            if key in self.responses:
                return self.responses[key]
            self.effects[key] = self.effects.get(key, 0) + 1
            response = {"charge_id": f"ch_{len(self.responses) + 1}", "amount": body.get("amount")}
            self.responses[key] = response
            return response

    def start(self) -> Provider:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                key = self.headers.get("Idempotency-Key") or f"nokey-{time.monotonic_ns()}"
                data = json.dumps(provider.handle(key, body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                # GET /charges?idempotency_key=K: the charge made for K, or 404 (reconciliation)
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                key = (query.get("idempotency_key") or [""])[0]
                with provider.lock:
                    provider.lookups += 1
                    found = provider.responses.get(key)
                data = json.dumps(found or {"error": "not found"}).encode()
                self.send_response(200 if found else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def charge_tool(url: str) -> Callable[..., dict[str, Any]]:
    """The charge a worker runs against the provider (for workers that are threads of the
    test process), passing the derived key as the Idempotency-Key header."""
    def charge(amount: int, idempotency_key: str) -> dict[str, Any]:
        req = urllib.request.Request(url, data=json.dumps({"amount": amount}).encode(),
                                     headers={"Idempotency-Key": idempotency_key,
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            body: dict[str, Any] = json.loads(resp.read())
        return body
    return charge


# --- worker processes ------------------------------------------------------------------

class Worker:
    """``python tests/helpers/run_worker.py CONFIG``; its stdout lines arrive on a queue."""

    def __init__(self, **config: Any) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(TESTS), env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(
            [sys.executable, str(TESTS / "helpers" / "run_worker.py"), json.dumps(config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, prefix: str, timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"worker did not print {prefix!r} in {timeout} s; "
                                     f"saw {self.seen}; stderr: {self._stderr()}") from None
            if line is None:
                raise AssertionError(f"worker exited before printing {prefix!r}; saw {self.seen}; "
                                     f"stderr: {self._stderr()}")
            self.seen.append(line)
            if line.startswith(prefix):
                return line[len(prefix):].strip()

    def _stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return "(running)"
        return self.proc.stderr.read()[-3000:]

    def execution(self, timeout: float = 30) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.expect("EXEC", timeout))
        return result

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
