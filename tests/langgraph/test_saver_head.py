"""The head of a thread and namespace is the checkpoint ``put`` stored last, not the greatest
id: a checkpoint whose id was made on a host whose clock lags (it sorts below its parent)
stays the head for get_tuple, the history limit, prune and copy_thread."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.base import Checkpoint, empty_checkpoint

from replaysafe_pg import FingerprintConflict
from replaysafe_pg.langgraph import ReplaysafeSaver


def lagging_id(parent_id: str) -> str:
    """An id that sorts below ``parent_id``, as a uuid6 made 2 s earlier would."""
    lower = f"{int(parent_id[:8], 16) - 1:08x}" + parent_id[8:]
    assert lower < parent_id
    return lower


def chain(saver: ReplaysafeSaver, thread_id: str, *, lag_last: bool) -> list[str]:
    """Two run-loop checkpoints, the second a child of the first; with ``lag_last`` its id
    sorts below its parent's. Each brings a new value of channel ``v``."""
    ids: list[str] = []
    parent: str | None = None
    for n in range(2):
        cp: Checkpoint = empty_checkpoint()
        if lag_last and parent is not None:
            cp["id"] = lagging_id(parent)
        cp["channel_values"] = {"v": f"value {n}"}
        cp["channel_versions"] = {"v": saver.get_next_version(None if n == 0 else "1")}
        conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
        if parent is not None:
            conf["checkpoint_id"] = parent
        md: Any = {"source": "input" if n == 0 else "loop", "step": n - 1, "parents": {}}
        saver.put({"configurable": conf}, cp, md, cp["channel_versions"])
        parent = cp["id"]
        ids.append(cp["id"])
    return ids


def head(saver: ReplaysafeSaver, thread_id: str) -> tuple[str, str]:
    found = saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
    assert found is not None
    return found.checkpoint["id"], found.checkpoint["channel_values"]["v"]


def test_the_checkpoint_stored_last_is_the_head_whatever_its_id(dsn: str) -> None:
    with ReplaysafeSaver(dsn, tenant_id="A") as saver:
        ids = chain(saver, "lag", lag_last=True)
        assert head(saver, "lag") == (ids[1], "value 1")
        # The run goes on from it: its next checkpoint is no fork.
        cp = empty_checkpoint()
        cp["channel_values"] = {"v": "value 2"}
        cp["channel_versions"] = {"v": "2"}
        md: Any = {"source": "loop", "step": 1, "parents": {}}
        saver.put({"configurable": {"thread_id": "lag", "checkpoint_ns": "",
                                    "checkpoint_id": ids[1]}}, cp, md, cp["channel_versions"])
        assert head(saver, "lag")[0] == cp["id"]


def test_the_history_limit_never_deletes_the_head(dsn: str) -> None:
    with ReplaysafeSaver(dsn, tenant_id="A", history_limit=1) as saver:
        ids = chain(saver, "lag", lag_last=True)
        assert head(saver, "lag") == (ids[1], "value 1")
        kept = [t.checkpoint["id"] for t in saver.list({"configurable": {"thread_id": "lag"}})]
    assert kept == [ids[1]]


@pytest.mark.parametrize("how", ["prune", "copy_thread"])
def test_prune_and_copy_thread_keep_the_head(dsn: str, how: str) -> None:
    with ReplaysafeSaver(dsn, tenant_id="A") as saver:
        ids = chain(saver, "lag", lag_last=True)
        target = "lag"
        if how == "prune":
            saver.prune(["lag"])
        else:
            target = f"copy-{uuid.uuid4()}"
            saver.copy_thread("lag", target)
        assert head(saver, target) == (ids[1], "value 1")
        listed = {t.checkpoint["id"] for t in saver.list({"configurable": {"thread_id": target}})}
    assert listed == ({ids[1]} if how == "prune" else set(ids))


def test_deleting_the_heads_run_makes_the_newest_remaining_checkpoint_the_head(
        dsn: str) -> None:
    with ReplaysafeSaver(dsn, tenant_id="A") as saver:
        config = {"configurable": {"thread_id": "runs", "checkpoint_ns": ""}}
        stored = []
        for n, run in enumerate(("r1", "r2")):
            cp = empty_checkpoint()
            cp["channel_values"] = {"v": run}
            cp["channel_versions"] = {"v": saver.get_next_version(str(n) if n else None)}
            md: Any = {"source": "update", "step": n, "run_id": run}
            conf = stored[-1] if stored else config
            stored.append(saver.put(conf, cp, md, cp["channel_versions"]))
        saver.delete_for_runs(["r2"])
        found = saver.get_tuple(config)
        assert found is not None and found.checkpoint["channel_values"] == {"v": "r1"}
    with psycopg.connect(dsn) as owner:
        row = owner.execute("SELECT head FROM replaysafe.langgraph_namespaces "
                            "WHERE tenant_id = 'A' AND thread_id = 'runs'").fetchone()
    assert row == (stored[0]["configurable"]["checkpoint_id"],)


def test_saving_a_stored_checkpoint_again_from_the_head_leaves_the_head(dsn: str) -> None:
    """A put whose parent is the head normally moves the head to it (in the statement that
    locks the namespace); when that checkpoint was stored before, the head stays where it
    was — and a stored checkpoint is never changed in place: saved again with other content
    it is refused (FingerprintConflict), and its stored metadata stays."""
    with ReplaysafeSaver(dsn, tenant_id="A") as saver:
        ids = chain(saver, "again", lag_last=False)
        with psycopg.connect(dsn, autocommit=True) as owner:
            # The head back on the first checkpoint (as no saver call leaves it, so the
            # second one is stored already and its parent is the head).
            owner.execute("UPDATE replaysafe.langgraph_namespaces SET head = %s "
                          "WHERE tenant_id = 'A' AND thread_id = 'again'", (ids[0],))
            cp = empty_checkpoint()
            cp["id"] = ids[1]
            cp["channel_values"] = {"v": "value 1"}
            cp["channel_versions"] = {"v": "2"}
            md: Any = {"source": "loop", "step": 0, "parents": {}, "again": True}
            with pytest.raises(FingerprintConflict, match="never changed in place"):
                saver.put({"configurable": {"thread_id": "again", "checkpoint_ns": "",
                                            "checkpoint_id": ids[0]}}, cp, md, {})
            row = owner.execute(
                "SELECT n.head, c.metadata ->> 'again' FROM replaysafe.langgraph_namespaces n "
                "JOIN replaysafe.langgraph_checkpoints c USING (tenant_id, thread_id, "
                "checkpoint_ns) WHERE n.tenant_id = 'A' AND n.thread_id = 'again' "
                "AND c.checkpoint_id = %s", (ids[1],)).fetchone()
    assert row == (ids[0], None)
