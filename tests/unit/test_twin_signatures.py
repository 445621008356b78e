"""The sync and async flavours are written twice (the shared policy once, in run_policy,
statements and the ``_Base`` classes); their public faces must not drift apart. For every
twin pair, every public member of one exists in the other with the same signature (names,
kinds, defaults and annotations, with ``Async`` types read as their sync twins), and the
async flavour's methods that touch the database are coroutines. The differences that are
meant are listed here with their reason; anything else fails."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import pytest

from replaysafe_pg import AsyncLedger, Ledger
from replaysafe_pg.langgraph import AsyncReplaysafeSaver, ReplaysafeSaver
from replaysafe_pg.run_async import AsyncRunner
from replaysafe_pg.run_sync import Runner
from replaysafe_pg.threads import AsyncThreads, Threads

# An async member's name and annotation words, read as the sync twin's.
ASYNC_NAMES = {"__aenter__": "__enter__", "__aexit__": "__exit__", "aclose": "close"}
ASYNC_WORDS = {"AsyncConninfo": "Conninfo", "AsyncSource": "SyncSource",
               "AsyncIterator": "Iterator", "AsyncReplaysafeSaver": "ReplaysafeSaver",
               "AsyncHeartbeats": "Heartbeats", "AsyncLedger": "Ledger",
               "AsyncThreads": "Threads", "AsyncRunner": "Runner"}

# Meant differences: (pair, member) -> why.
MEANT = {
    ("Ledger", "run_many"): "max_workers sizes the sync flavour's thread pool; the async one "
                            "runs its calls as tasks on the event loop",
    ("Runner", "run_many"): "as Ledger.run_many: the thread pool's size",
    ("Runner", "__init__"): "the sync shell shares its ledger's heartbeat thread; the async "
                            "shell beats from tasks of its own",
}

# LangGraph's saver interface has both method sets on both savers (``get_tuple`` beside
# ``aget_tuple``); there the rule is LangGraph's: an ``a``-method is a coroutine (or an async
# generator) on both, and the async saver's ``setup`` is awaited.
LANGGRAPH_ASYNC_SETUP = {"setup"}


def _public(cls: type) -> dict[str, Any]:
    return {name: getattr(cls, name) for name in dir(cls)
            if (not name.startswith("_") or name in ("__init__", "__enter__", "__exit__",
                                                     "__aenter__", "__aexit__"))
            and not (name.startswith("__") and getattr(cls, name) is getattr(object, name, None))}


def _as_sync(text: str) -> str:
    return re.sub(r"\b(" + "|".join(ASYNC_WORDS) + r")\b", lambda m: ASYNC_WORDS[m.group(1)], text)


def _is_async(member: Any) -> bool:
    return inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member)


def differences(sync: type, async_: type, *, coroutines: Callable[[str, Any], bool]) -> list[str]:
    """What differs between the twins' public faces, meant differences left out."""
    pair = sync.__name__
    mine = _public(sync)
    theirs = {ASYNC_NAMES.get(name, name): member for name, member in _public(async_).items()}
    out = [f"{pair}: {name} only in the sync flavour" for name in sorted(mine.keys() - theirs.keys())]
    out += [f"{pair}: {name} only in the async flavour"
            for name in sorted(theirs.keys() - mine.keys())]
    for name in sorted(mine.keys() & theirs.keys()):
        if (pair, name) in MEANT:
            continue
        a, b = mine[name], theirs[name]
        if callable(a) != callable(b):
            out.append(f"{pair}.{name}: a method in one flavour only")
            continue
        if not callable(a):
            continue
        sa, sb = _as_sync(str(inspect.signature(a))), _as_sync(str(inspect.signature(b)))
        if sa != sb:
            out.append(f"{pair}.{name}: {sa}  !=  {sb}")
        if coroutines(name, a) and not _is_async(b):
            out.append(f"{pair}.{name}: not a coroutine in the async flavour")
    return out


def _io_methods(name: str, member: Any) -> bool:
    """Ledger, Threads, the runners: every public method but the constructor does I/O."""
    return name not in ("__init__",)


def _langgraph(name: str, member: Any) -> bool:
    return name in LANGGRAPH_ASYNC_SETUP or name == "__exit__"


TWINS = [(Ledger, AsyncLedger, _io_methods), (Threads, AsyncThreads, _io_methods),
         (Runner, AsyncRunner, _io_methods), (ReplaysafeSaver, AsyncReplaysafeSaver, _langgraph)]


@pytest.mark.parametrize(("sync", "async_", "coroutines"), TWINS,
                         ids=[s.__name__ for s, _, _ in TWINS])
def test_the_twins_have_one_public_face(sync: type, async_: type,
                                        coroutines: Callable[[str, Any], bool]) -> None:
    assert differences(sync, async_, coroutines=coroutines) == []


def test_the_langgraph_a_methods_are_coroutines_on_both_savers() -> None:
    for saver in (ReplaysafeSaver, AsyncReplaysafeSaver):
        a_methods = [n for n in dir(saver) if re.fullmatch(r"a(get|put|list|delete|copy|prune)\w*", n)]
        assert len(a_methods) >= 8
        assert [n for n in a_methods if not _is_async(getattr(saver, n))] == []


def test_a_drifted_twin_is_found() -> None:
    """The comparison itself: a default, a missing method and a sync coroutine all show."""

    class Sync:
        def __init__(self, conninfo: str) -> None: ...

        def get(self, key: str, *, lease: float = 30) -> None: ...

        def only_here(self) -> None: ...

    class Async:
        def __init__(self, conninfo: str) -> None: ...

        def get(self, key: str, *, lease: float = 60) -> None: ...  # not a coroutine either

    found = differences(Sync, Async, coroutines=_io_methods)
    assert any("only_here only in the sync flavour" in d for d in found)
    assert any("Sync.get:" in d and "lease: 'float' = 30" in d and "lease: 'float' = 60" in d
               for d in found)
    assert any("Sync.get: not a coroutine" in d for d in found)
