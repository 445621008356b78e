"""A worker process for the Ledger.run crash and storm tests (see helpers.run.Worker).

It prints progress markers on stdout; a ``STOP`` marker is followed by blocking on stdin,
so the test can SIGKILL (or SIGSTOP) it at exactly that point.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from typing import Any

import psycopg

from helpers.run import add_effect, execution_json
from replaysafe_pg import Execution, Ledger


def say(*parts: object) -> None:
    print(*parts, flush=True)


def block() -> None:
    sys.stdin.read()  # until killed


def report(ex: Execution) -> None:
    say("EXEC", json.dumps(execution_json(ex)))


def storm(cfg: dict[str, Any]) -> None:
    with Ledger(cfg["dsn"], tenant_id="t1", worker_id=cfg["worker"]) as led:
        def tool(n: int) -> dict[str, Any]:
            add_effect(cfg["dsn"], cfg["key"], cfg["worker"])
            time.sleep(cfg["hold"])
            return {"n": n, "by": cfg["worker"]}

        led.get("warm-up")  # connected before the start line
        say("READY")
        sys.stdin.readline()
        report(led.run("storm", tool, {"n": 42}, key=cfg["key"], wait_timeout=30))


def charge(cfg: dict[str, Any]) -> None:
    stop = cfg.get("stop")

    def tool(amount: int, idempotency_key: str) -> dict[str, Any]:
        if stop == "before_send":
            say("STOP before_send")
            block()
        req = urllib.request.Request(cfg["url"], data=json.dumps({"amount": amount}).encode(),
                                     headers={"Idempotency-Key": idempotency_key,
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            body: dict[str, Any] = json.loads(resp.read())
        if stop == "after_send":
            say("STOP after_send")
            block()
        return body

    with Ledger(cfg["dsn"], tenant_id="t1", worker_id=cfg["worker"]) as led:
        ex = led.run("charge", tool, {"amount": 500}, key=cfg["key"], lease=cfg["lease"],
                     on_expired=cfg["on_expired"], wait_timeout=cfg.get("wait_timeout", 20))
        report(ex)
        if stop == "after_record":
            say("STOP after_record")
            block()


def fencing(cfg: dict[str, Any]) -> None:
    with Ledger(cfg["dsn"], tenant_id="t1", worker_id=cfg["worker"]) as led:
        def tool() -> dict[str, Any]:
            say("STARTED")
            time.sleep(cfg["hold"])
            return {"by": "owner"}

        report(led.run("fenced", tool, {}, key=cfg["key"], lease=cfg["lease"],
                       on_expired="reclaim"))


def many(cfg: dict[str, Any]) -> None:
    dsn = cfg["dsn"]

    def quick(name: str) -> dict[str, Any]:
        add_effect(dsn, name)
        return {"done": name}

    def slow(name: str) -> dict[str, Any]:
        add_effect(dsn, name)
        # Wait until both siblings are recorded, then let the test kill us.
        with psycopg.connect(dsn, autocommit=True) as c:
            while True:
                row = c.execute("SELECT count(*) FROM replaysafe.actions WHERE action_key "
                                "IN ('m:a', 'm:c') AND state = 'succeeded'").fetchone()
                if row is not None and row[0] == 2:
                    break
                time.sleep(0.01)
        say("STOP slow")
        block()
        return {"done": name}

    with Ledger(dsn, tenant_id="t1", worker_id=cfg["worker"]) as led:
        led.run_many([("tool", quick, {"name": "m:a"}, "m:a"), ("tool", slow, {"name": "m:b"}, "m:b"),
                      ("tool", quick, {"name": "m:c"}, "m:c")], lease=cfg["lease"])


if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    {"storm": storm, "charge": charge, "fencing": fencing, "many": many}[config["mode"]](config)
