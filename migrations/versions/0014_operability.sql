-- Operability: the indexes metrics() counts from (retryable actions, superseded successful
-- reports); when each LangGraph namespace was last written, which purge_threads() finds old
-- LangGraph threads by; a row per LangGraph thread, the lock its writers hold. The function
-- set that follows brings metrics() and purge_threads(). IF NOT EXISTS: an administrator may
-- have built the indexes CONCURRENTLY beforehand (docs/migrations.md).

CREATE INDEX IF NOT EXISTS actions_retryable_idx ON replaysafe.actions (tenant_id, updated_at)
    WHERE state = 'retryable';
CREATE INDEX IF NOT EXISTS action_attempts_superseded_success_idx
    ON replaysafe.action_attempts (tenant_id, action_key) WHERE outcome = 'succeeded' AND superseded;

-- A namespace was last written when its newest checkpoint was stored (or now, for one
-- without any).
ALTER TABLE replaysafe.langgraph_namespaces ADD COLUMN written_at timestamptz;
UPDATE replaysafe.langgraph_namespaces n
SET written_at = coalesce((SELECT max(c.created_at) FROM replaysafe.langgraph_checkpoints c
                           WHERE c.tenant_id = n.tenant_id AND c.thread_id = n.thread_id
                             AND c.checkpoint_ns = n.checkpoint_ns), now());
ALTER TABLE replaysafe.langgraph_namespaces
    ALTER COLUMN written_at SET DEFAULT clock_timestamp(),
    ALTER COLUMN written_at SET NOT NULL;

CREATE TABLE replaysafe.langgraph_threads (
    tenant_id text NOT NULL,
    thread_id text NOT NULL,
    PRIMARY KEY (tenant_id, thread_id)
);
ALTER TABLE replaysafe.langgraph_threads ENABLE ROW LEVEL SECURITY;
INSERT INTO replaysafe.langgraph_threads (tenant_id, thread_id)
SELECT DISTINCT n.tenant_id, n.thread_id FROM replaysafe.langgraph_namespaces n;
