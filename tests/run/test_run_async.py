"""AsyncLedger.run / run_many: storms of tasks, cancellation, timeouts (real Postgres)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from helpers.db import derived_key
from helpers.run import action_row, add_effect, attempt_rows, count_effects, make_effects_table

from replaysafe_pg import AsyncLedger, InvalidArgument, UnstorableResult


def test_a_storm_of_tasks_runs_the_tool_once(dsn: str) -> None:
    make_effects_table(dsn)

    async def main() -> list[Any]:
        ledgers = [AsyncLedger(dsn, tenant_id="t1", worker_id=f"a{i}") for i in range(16)]
        seen: list[str] = []

        async def charge(amount: int, idempotency_key: str) -> dict[str, Any]:
            seen.append(idempotency_key)
            await asyncio.to_thread(add_effect, dsn, "s")
            await asyncio.sleep(0.3)
            return {"amount": amount}

        try:
            for led in ledgers:
                await led.get("warm-up")
            outs = await asyncio.gather(*(led.run("charge", charge, {"amount": 5}, key="s")
                                          for led in ledgers))
        finally:
            for led in ledgers:
                await led.close()
        assert seen == [derived_key(dsn, "t1", "s")]
        return outs

    outs = asyncio.run(main())
    assert count_effects(dsn, "s") == 1
    assert {(e.status, repr(e.result)) for e in outs} == {("succeeded", "{'amount': 5}")}
    assert sorted(e.replay for e in outs) == [False] + [True] * 15
    assert len(attempt_rows(dsn, "s")) == 1


def test_cancellation_marks_unknown_and_propagates(dsn: str) -> None:
    async def main() -> None:
        go = asyncio.Event()

        async def slow() -> str:
            go.set()
            await asyncio.sleep(30)
            return "never"

        async with AsyncLedger(dsn, tenant_id="t1") as led:
            task = asyncio.create_task(led.run("slow", slow, {}, key="c"))
            await go.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            again = await led.run("slow", slow, {}, key="c")
            assert (again.status, again.replay) == ("unknown", True)

    asyncio.run(main())
    row = action_row(dsn, "c")
    assert row["state"] == "unknown" and row["error"]["reason"] == "cancelled"


def test_timeout_marks_unknown_but_the_tools_own_timeout_error_is_a_failure(dsn: str) -> None:
    async def main() -> None:
        async def slow() -> str:
            await asyncio.sleep(5)
            return "late"

        async def gives_up() -> str:
            raise TimeoutError("provider timed out")

        async with AsyncLedger(dsn, tenant_id="t1") as led:
            t0 = time.monotonic()
            ex = await led.run("slow", slow, {}, key="t", timeout=0.2)
            assert time.monotonic() - t0 < 1.0
            assert (ex.status, ex.error["reason"]) == ("unknown", "timeout")
            own = await led.run("api", gives_up, {}, key="own", timeout=5)
            assert (own.status, own.error["type"]) == ("failed", "builtins.TimeoutError")

    asyncio.run(main())
    assert action_row(dsn, "t")["state"] == "unknown"


def test_plain_functions_run_in_a_thread_and_waiters_wake_on_notify(dsn: str) -> None:
    def blocking() -> str:
        time.sleep(0.5)  # would block the loop if not in a thread
        return "done"

    async def main() -> None:
        async with AsyncLedger(dsn, tenant_id="t1", worker_id="o") as owner, \
                AsyncLedger(dsn, tenant_id="t1", worker_id="w") as waiter:
            first = asyncio.create_task(owner.run("b", blocking, {}, key="b"))
            await asyncio.sleep(0.1)  # let the owner claim
            t0 = time.monotonic()
            ex = await waiter.run("b", blocking, {}, key="b", wait_timeout=5)
            assert ex.replay and ex.result == "done" and time.monotonic() - t0 < 2
            assert (await first).replay is False

    asyncio.run(main())


def test_async_run_many_and_argument_checks(dsn: str) -> None:
    async def double(x: int) -> int:
        await asyncio.sleep(0.05)
        return 2 * x

    async def main() -> None:
        async with AsyncLedger(dsn, tenant_id="t1") as led:
            out = await led.run_many([("d", double, {"x": i}, f"k{i}") for i in range(4)])
            assert [e.result for e in out] == [0, 2, 4, 6] and not any(e.replay for e in out)
            again = await led.run_many([("d", double, {"x": i}, f"k{i}") for i in range(4)])
            assert all(e.replay for e in again)
            with pytest.raises(InvalidArgument):
                await led.run("d", double, {"x": float("nan")}, key="bad")
            with pytest.raises(UnstorableResult):
                await led.run("d", lambda: object(), {}, key="obj")
            assert (await led.run("d", lambda: 1, {}, key="obj")).status == "unknown"

    asyncio.run(main())
