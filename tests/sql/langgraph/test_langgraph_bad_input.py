"""Bad input to the LangGraph functions is RS005 at the write, never a raw error later (a
channel_versions that is not an object, NULL elements, unbounded channels, versions or
namespaces), as a worker bound to tenant A."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

pytest.importorskip("langgraph")
from helpers.db import connect_as, sqlstate
from helpers.langgraph_rows import PUT, PUT_WRITES, login, put_params
from langgraph.checkpoint.base import empty_checkpoint

MakeRole = Callable[..., str]


# =============================================================================================
# A channel_versions that is not a JSON object is RS005. What it would do otherwise:
# A worker poisoned reads of its whole tenant. langgraph_put accepts any JSON
# object as p_checkpoint; a "channel_versions" that is not an object makes jsonb_each_text
# raise 22023 in every get_tuple of that thread, in every langgraph_list of the tenant without
# a thread (the saver's list(None)), and in every later put with a history limit once the
# checkpoint is among the oldest. Expected: RS005 at the write.
# =============================================================================================

@pytest.mark.parametrize("versions", ["[]", '"x"', "1", "null"])
def test_a_checkpoint_whose_channel_versions_is_not_an_object_is_refused(
        checkpointed_world: str, make_role: MakeRole, versions: str) -> None:
    """A channel_versions that is not an object poisoned reads of the whole
    tenant; fixed: RS005."""
    attacker = login(checkpointed_world, make_role, "A")
    with connect_as(checkpointed_world, attacker) as worker:
        cp = empty_checkpoint()
        body = {k: v for k, v in cp.items() if k != "channel_values"}
        body["channel_versions"] = json.loads(versions)
        state = sqlstate(worker, PUT, put_params(thread="poison", id=cp["id"],
                                                 cp=json.dumps(body)))
        poisoned = sqlstate(worker, "SELECT * FROM replaysafe.langgraph_list(p_tenant_id => 'A')")
    assert (state, poisoned) == ("RS005", None)


# =============================================================================================
# NULL elements are refused and channels, versions and namespaces bounded. Otherwise:
# Inputs the functions do not check end in raw errors (a NOT NULL violation,
# an index row too large: 23502 / 54000) instead of RS005; docs/isolation.md made ids bounded
# in bytes for this very reason.
# =============================================================================================

# Text that compresses poorly (an index row is compressed before its size is checked).
NOISE = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(1300))  # 3,900 bytes


BAD_PUTS = {
    "null channel": {"channels": [None], "versions": ["1"], "types": ["null"], "blobs": [b""]},
    "null version": {"channels": ["c"], "versions": [None], "types": ["null"], "blobs": [b""]},
    "null type": {"channels": ["c"], "versions": ["1"], "types": [None], "blobs": [b""]},
    "huge channel": {"channels": [NOISE], "versions": ["1"], "types": ["null"], "blobs": [b""]},
    "huge version": {"channels": ["c"], "versions": [NOISE], "types": ["null"], "blobs": [b""]},
    "huge namespace": {"ns": NOISE},
}


@pytest.mark.parametrize("case", list(BAD_PUTS))
def test_bad_put_arguments_are_rs005(checkpointed_world: str, make_role: MakeRole, case: str) -> None:
    """Unchecked inputs ended in raw errors (23502, 54000); fixed: NULL elements
    refused, channel/version/namespace bounded."""
    with connect_as(checkpointed_world, login(checkpointed_world, make_role, "A")) as worker:
        assert sqlstate(worker, PUT, put_params(thread="bad", **BAD_PUTS[case])) == "RS005"


BAD_WRITES = {
    "null idx": {"idx": [None]},
    "null channel": {"channels": [None]},
    "null type": {"types": [None]},
    "null blob": {"blobs": [None]},
    "huge namespace": {"ns": NOISE},
}


@pytest.mark.parametrize("case", list(BAD_WRITES))
def test_bad_put_writes_arguments_are_rs005(checkpointed_world: str, make_role: MakeRole,
                                                    case: str) -> None:
    """Unchecked inputs ended in raw errors (23502, 54000); fixed: NULL elements
    refused, channel/version/namespace bounded."""
    params = {"tenant": "A", "thread": "bad", "ns": "", "id": "c1", "task": "x", "path": "",
              "idx": [0], "channels": ["c"], "types": ["null"], "blobs": [b""], "replace": False}
    params.update(BAD_WRITES[case])
    with connect_as(checkpointed_world, login(checkpointed_world, make_role, "A")) as worker:
        assert sqlstate(worker, PUT_WRITES, params) == "RS005"
