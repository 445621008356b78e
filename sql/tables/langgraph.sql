-- LangGraph checkpoints (replaysafe_pg.langgraph, docs/langgraph.md): one function per
-- method of a LangGraph checkpointer (sql/functions/langgraph.sql). Channel values are stored
-- once per (channel, version) in langgraph_blobs; a checkpoint row holds the rest. The newest
-- checkpoint of a thread and namespace (its head) is the one put stored last, kept on its
-- langgraph_namespaces row (not the greatest id: an id made on a host whose clock lags sorts
-- below its parent).

CREATE TABLE replaysafe.langgraph_checkpoints (
    tenant_id            text NOT NULL,
    thread_id            text NOT NULL,
    checkpoint_ns        text NOT NULL,
    -- LangGraph's ids sort by time as bytes ("C"): the newest is the greatest.
    checkpoint_id        text COLLATE "C" NOT NULL,
    parent_checkpoint_id text COLLATE "C",
    -- metadata ->> 'run_id', for delete_for_runs.
    run_id               text,
    -- The checkpoint without its channel values (those are in langgraph_blobs).
    checkpoint           jsonb NOT NULL,
    metadata             jsonb NOT NULL,
    created_at           timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, thread_id, checkpoint_ns, checkpoint_id)
);

CREATE INDEX langgraph_checkpoints_run_idx ON replaysafe.langgraph_checkpoints (tenant_id, run_id)
    WHERE run_id IS NOT NULL;

CREATE TABLE replaysafe.langgraph_blobs (
    tenant_id     text NOT NULL,
    thread_id     text NOT NULL,
    checkpoint_ns text NOT NULL,
    channel       text NOT NULL,
    version       text NOT NULL,
    -- The serializer's type tag; "empty" (and no blob) for a channel emptied at this version.
    type          text NOT NULL,
    blob          bytea,
    PRIMARY KEY (tenant_id, thread_id, checkpoint_ns, channel, version)
);

CREATE TABLE replaysafe.langgraph_writes (
    tenant_id     text NOT NULL,
    thread_id     text NOT NULL,
    checkpoint_ns text NOT NULL,
    checkpoint_id text COLLATE "C" NOT NULL,
    task_id       text NOT NULL,
    idx           integer NOT NULL,
    channel       text NOT NULL,
    type          text NOT NULL,
    blob          bytea NOT NULL,
    task_path     text NOT NULL,
    PRIMARY KEY (tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
);

-- One row per thread and namespace: the lock that orders its checkpoint writes, its head (the
-- checkpoint put stored last; when that one was deleted since, the greatest id is the head),
-- and the ids of the latest checkpoints it refused (their pending writes are dropped, also
-- late ones).
CREATE TABLE replaysafe.langgraph_namespaces (
    tenant_id     text NOT NULL,
    thread_id     text NOT NULL,
    checkpoint_ns text NOT NULL,
    head          text COLLATE "C",
    refused       text[] NOT NULL DEFAULT '{}',
    -- When a put last stored a checkpoint here (or a copy made the namespace): purge_threads
    -- finds the threads not written for a while by it. Not indexed: the head's update stays HOT.
    written_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (tenant_id, thread_id, checkpoint_ns)
);

ALTER TABLE replaysafe.langgraph_checkpoints ENABLE ROW LEVEL SECURITY;
ALTER TABLE replaysafe.langgraph_blobs ENABLE ROW LEVEL SECURITY;
ALTER TABLE replaysafe.langgraph_writes ENABLE ROW LEVEL SECURITY;
ALTER TABLE replaysafe.langgraph_namespaces ENABLE ROW LEVEL SECURITY;

CREATE TYPE replaysafe.langgraph_checkpoint_record AS (
    thread_id            text,
    checkpoint_ns        text,
    checkpoint_id        text,
    parent_checkpoint_id text,
    checkpoint           jsonb,
    metadata             jsonb,
    -- Channel values: parallel arrays, one element per stored channel.
    channels             text[],
    types                text[],
    blobs                bytea[],
    -- Pending writes in LangGraph's order (task path, task id, index).
    write_task_ids       text[],
    write_channels       text[],
    write_types          text[],
    write_blobs          bytea[]
);

CREATE TYPE replaysafe.langgraph_put_record AS (
    -- false: refused (a run-loop checkpoint whose parent is not the newest); nothing stored.
    stored             boolean,
    -- The newest checkpoint of the thread and namespace after the call.
    head_checkpoint_id text
);

-- The user a thread belongs to, for threads first stored into under a tenant grant that
-- names a user (only that user's grants reach them); other threads are the whole tenant's.
CREATE TABLE replaysafe.langgraph_thread_users (
    tenant_id text NOT NULL,
    thread_id text NOT NULL,
    user_id   text NOT NULL,
    PRIMARY KEY (tenant_id, thread_id)
);
ALTER TABLE replaysafe.langgraph_thread_users ENABLE ROW LEVEL SECURITY;

-- One row per LangGraph thread: the thread's lock (_langgraph_hold_thread). Writers hold it
-- FOR KEY SHARE until they commit; langgraph_delete_thread takes it FOR UPDATE, purge_threads
-- FOR UPDATE SKIP LOCKED.
CREATE TABLE replaysafe.langgraph_threads (
    tenant_id text NOT NULL,
    thread_id text NOT NULL,
    PRIMARY KEY (tenant_id, thread_id)
);
ALTER TABLE replaysafe.langgraph_threads ENABLE ROW LEVEL SECURITY;
