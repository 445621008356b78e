"""What both savers share: the parameters of each SQL function and the decoding of its rows.

Pure (nothing here sends anything), so ``ReplaysafeSaver`` and ``AsyncReplaysafeSaver`` are
only I/O shells around it. Channel values and pending writes go through LangGraph's
serializer (``serde.dumps_typed``) and are stored as ``(type, bytes)``; a value is stored
once per channel version (the versions a checkpoint brings are ``new_versions``).
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Sequence
from typing import Any, LiteralString

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from replaysafe_pg import queries
from replaysafe_pg._args import text_id
from replaysafe_pg._grant import GrantArg, grant_of, tenant_of
from replaysafe_pg.errors import InvalidArgument, StaleCheckpointError
from replaysafe_pg.limits import DEFAULT_LIMITS, Limits, Payload, limits_of

Row = tuple[Any, ...]
PRUNE_STRATEGIES = ("keep_latest", "delete")


def next_version(current: str | int | float | None) -> str:
    """The next channel version: a zero-padded counter (so versions sort as text) and a random
    fraction, so two branches of one thread that reach the same counter (time travel, an
    update of an older checkpoint) never share a stored value."""
    if current is None:
        n = 0
    elif isinstance(current, (int, float)):
        n = int(current)
    else:
        n = int(current.split(".")[0])
    return f"{n + 1:032}.{random.random():016}"


def strict_serde() -> JsonPlusSerializer:
    """The savers' default serializer: LangGraph's, in strict mode (a msgpack value may name
    only LangGraph's safe types and those the graph allows through ``with_allowlist``; any
    other is returned as its raw data, never imported and called)."""
    return JsonPlusSerializer(allowed_msgpack_modules=None)


PICKLE_REFUSED = (
    "refusing to {what} a value of type tag 'pickle': whoever can write this tenant's "
    "checkpoints (any of its workers) could run code in every process that loads it; build "
    "the saver with allow_pickle=True only if every writer of the tenant is trusted")


def _json(value: Any) -> str:
    # Postgres refuses \u0000 in jsonb; LangGraph's own metadata helper strips it likewise.
    return json.dumps(value, separators=(",", ":"), default=str)


class Codec:
    """The calls of one saver: tenant, serializer and tenant grant bound (``grant``: see
    :class:`~replaysafe_pg.statements.Statements`; ``tenant_id`` None is then the grant's tenant).
    ``limits``: a checkpoint (its JSON, and its metadata's), a channel value or a pending
    write over them is refused before anything is sent."""

    def __init__(self, tenant_id: str | None, serde: SerializerProtocol,
                 history_limit: int | None = None, *, allow_pickle: bool = False,
                 grant: GrantArg | None = None, limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits_of(limits)
        self.grant = grant_of(grant, tenant_id)
        self.tenant_id = text_id(tenant_of(tenant_id, self.grant), "tenant_id")
        self.serde = serde
        self.allow_pickle = allow_pickle is True
        if history_limit is not None and (isinstance(history_limit, bool)
                                          or not isinstance(history_limit, int)
                                          or history_limit < 1):
            raise InvalidArgument(f"history_limit must be a positive int or None, "
                                  f"got {history_limit!r}")
        self.history_limit = history_limit

    def with_serde(self, serde: SerializerProtocol) -> Codec:
        """The same calls with another serializer (``with_allowlist``'s copy of a saver)."""
        clone = copy.copy(self)
        clone.serde = serde
        return clone

    def dumps(self, value: Any, payload: Payload, what: str) -> tuple[str, bytes]:
        type_, blob = self.serde.dumps_typed(value)
        if type_ == "pickle" and not self.allow_pickle:
            raise InvalidArgument(PICKLE_REFUSED.format(what="store"))
        self.limits.check_size(len(blob), payload, what)
        return type_, blob

    def checked_json(self, value: Any, what: str) -> str:
        """A checkpoint's JSON (or its metadata's), within the checkpoint's limits."""
        return self.limits.check(_json(value), "checkpoint", what)

    def loads(self, type_: str, blob: bytes) -> Any:
        # The type tag comes from the database: a worker of the tenant may have written it.
        if type_ == "pickle" and not self.allow_pickle:
            raise InvalidArgument(PICKLE_REFUSED.format(what="load"))
        return self.serde.loads_typed((type_, blob))

    @staticmethod
    def query(name: str) -> LiteralString:
        return queries.get(name)

    def statement(self, name: str, params: dict[str, Any]
                  ) -> tuple[LiteralString, dict[str, Any]]:
        """The query ``name`` and the parameters to send: under a grant, with the current
        grant (asked for here, once per statement); without one, exactly ``params``."""
        if self.grant is None:
            return queries.get(name), params
        params = params | {"grant": self.grant.current()}
        return queries.get(name, params), params

    # --- put ------------------------------------------------------------------------------

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> tuple[dict[str, Any], RunnableConfig]:
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        ns = conf.get("checkpoint_ns", "") or ""
        values = checkpoint["channel_values"]
        stored = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        channels: list[str] = []
        versions: list[str] = []
        types: list[str] = []
        blobs: list[bytes | None] = []
        for channel, version in new_versions.items():
            channels.append(channel)
            versions.append(str(version))
            if channel in values:
                type_, blob = self.dumps(values[channel], "blob",
                                         f"the value of channel {channel!r}")
                types.append(type_)
                blobs.append(blob)
            else:
                types.append("empty")
                blobs.append(None)
        params = {
            "tenant_id": self.tenant_id, "thread_id": thread_id, "checkpoint_ns": ns,
            "checkpoint_id": checkpoint["id"], "parent_id": conf.get("checkpoint_id"),
            "checkpoint": self.checked_json(stored, "the checkpoint"),
            "metadata": self.checked_json(get_serializable_checkpoint_metadata(config, metadata),
                                          "the checkpoint's metadata"),
            "channels": channels, "versions": versions, "types": types, "blobs": blobs,
            "history_limit": self.history_limit,
        }
        next_config: RunnableConfig = {"configurable": {
            "thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}
        return params, next_config

    @staticmethod
    def check_put(rows: list[Row], params: dict[str, Any]) -> None:
        """Raise :class:`StaleCheckpointError` when the database refused the checkpoint."""
        stored, head = rows[0]
        if stored:
            return
        detail = {"thread_id": params["thread_id"], "checkpoint_ns": params["checkpoint_ns"],
                  "checkpoint_id": params["checkpoint_id"],
                  "expected_checkpoint_id": params["parent_id"], "current_checkpoint_id": head}
        ns = f" (namespace {params['checkpoint_ns']!r})" if params["checkpoint_ns"] else ""
        raise StaleCheckpointError(
            f"stale checkpoint: thread {params['thread_id']!r}{ns} has moved on to checkpoint "
            f"{head}, but this run continued from {params['parent_id'] or 'an empty thread'}; "
            f"checkpoint {params['checkpoint_id']} was not saved (another run wrote to the "
            "thread meanwhile)", detail=json.dumps(detail))

    # --- put_writes ----------------------------------------------------------------------

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str) -> dict[str, Any]:
        conf = config["configurable"]
        idx: list[int] = []
        channels: list[str] = []
        types: list[str] = []
        blobs: list[bytes] = []
        for i, (channel, value) in enumerate(writes):
            idx.append(WRITES_IDX_MAP.get(channel, i))
            channels.append(channel)
            type_, blob = self.dumps(value, "pending_write",
                                     f"the pending write to channel {channel!r}")
            types.append(type_)
            blobs.append(blob)
        return {
            "tenant_id": self.tenant_id, "thread_id": str(conf["thread_id"]),
            "checkpoint_ns": conf.get("checkpoint_ns", "") or "",
            "checkpoint_id": conf["checkpoint_id"], "task_id": task_id, "task_path": task_path,
            "idx": idx, "channels": channels, "types": types, "blobs": blobs,
            # LangGraph's rule: special writes (errors, interrupts...) replace, others are kept.
            "replace": all(w[0] in WRITES_IDX_MAP for w in writes),
        }

    # --- reads ---------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> dict[str, Any]:
        conf = config["configurable"]
        return {"tenant_id": self.tenant_id, "thread_id": str(conf["thread_id"]),
                "checkpoint_ns": conf.get("checkpoint_ns", "") or "",
                "checkpoint_id": get_checkpoint_id(config)}

    def list(self, config: RunnableConfig | None, filter: dict[str, Any] | None,
             before: RunnableConfig | None, limit: int | None) -> dict[str, Any]:
        conf = config["configurable"] if config else {}
        thread_id = conf.get("thread_id")
        return {
            "tenant_id": self.tenant_id,
            "thread_id": str(thread_id) if thread_id is not None else None,
            "checkpoint_ns": conf.get("checkpoint_ns"),
            "checkpoint_id": conf.get("checkpoint_id"),
            "filter": _json(filter) if filter else None,
            "before": get_checkpoint_id(before) if before else None,
            "limit": int(limit) if limit is not None else None,
        }

    def tuple(self, row: Row) -> CheckpointTuple:
        (thread_id, ns, checkpoint_id, parent_id, checkpoint, metadata, channels, types, blobs,
         w_tasks, w_channels, w_types, w_blobs) = row
        loads = self.loads
        checkpoint["channel_values"] = {
            c: loads(t, b) for c, t, b in zip(channels or (), types or (), blobs or (), strict=True)
            if t != "empty"}
        writes = [(task, c, loads(t, b)) for task, c, t, b
                  in zip(w_tasks or (), w_channels or (), w_types or (), w_blobs or (), strict=True)]
        return CheckpointTuple(
            config={"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                     "checkpoint_id": checkpoint_id}},
            checkpoint=checkpoint,
            metadata=metadata,
            parent_config=({"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                             "checkpoint_id": parent_id}}
                           if parent_id else None),
            pending_writes=writes,
        )

    # --- deletes, copies -------------------------------------------------------------------

    def delete_thread(self, thread_id: str) -> dict[str, Any]:
        return {"tenant_id": self.tenant_id, "thread_id": str(thread_id)}

    def delete_for_runs(self, run_ids: Sequence[str]) -> dict[str, Any]:
        if isinstance(run_ids, str):
            raise TypeError("run_ids must be a sequence of run ids, not a str")
        return {"tenant_id": self.tenant_id, "run_ids": [str(r) for r in run_ids]}

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> dict[str, Any]:
        return {"tenant_id": self.tenant_id, "source_thread_id": str(source_thread_id),
                "target_thread_id": str(target_thread_id)}

    def prune(self, thread_ids: Sequence[str], strategy: str) -> dict[str, Any]:
        if isinstance(thread_ids, str):
            raise TypeError("thread_ids must be a sequence of thread ids, not a str")
        if strategy not in PRUNE_STRATEGIES:
            raise ValueError(f"unknown prune strategy {strategy!r} (keep_latest or delete)")
        return {"tenant_id": self.tenant_id, "thread_ids": [str(t) for t in thread_ids],
                "strategy": strategy}

    def probe(self) -> dict[str, Any]:
        """``setup()``: a list of nothing, which needs the schema and the right to the tenant."""
        return {"tenant_id": self.tenant_id, "thread_id": None, "checkpoint_ns": None,
                "checkpoint_id": None, "filter": None, "before": None, "limit": 0}
