-- The action ledger's tables, indexes and row types.

CREATE TYPE replaysafe.action_state AS ENUM ('running', 'succeeded', 'failed', 'retryable', 'unknown');

CREATE TABLE replaysafe.actions (
    tenant_id          text NOT NULL,
    action_key         text NOT NULL,
    thread_id          text,
    operation          text NOT NULL,
    request            jsonb NOT NULL,
    state              replaysafe.action_state NOT NULL,
    attempt            integer NOT NULL,
    on_expired         text NOT NULL CHECK (on_expired IN ('unknown', 'reclaim')),
    idempotency_key    text NOT NULL,
    worker_id          text NOT NULL,
    lease_expires_at   timestamptz NOT NULL,
    -- Someone is waiting (LISTEN) for the current attempt to leave "running".
    has_waiters        boolean NOT NULL DEFAULT false,
    result             jsonb,
    error              jsonb,
    provider_reference text,
    resolution_note    text,
    created_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL,
    completed_at       timestamptz,
    resolved_at        timestamptz,
    -- sha256 of the current attempt's claim token: a claim repeating the token while that
    -- attempt runs under a live lease gets the claim's lost answer again. Written with the
    -- claim itself (no extra write); never compared once the attempt left "running".
    claim_token_hash   bytea,
    -- sha256 of the current attempt's attempt token: heartbeats and reports of the attempt
    -- must present the token (the attempt's capability; the token itself is never stored).
    attempt_token_hash bytea,
    PRIMARY KEY (tenant_id, action_key)
);

-- sweep_expired_actions and unresolved_actions: only running rows, ordered by lease.
CREATE INDEX actions_running_lease_idx ON replaysafe.actions (lease_expires_at)
    WHERE state = 'running';
-- A tenant's sweep: its own expired leases only (running rows are few: in flight or stuck).
CREATE INDEX actions_tenant_running_lease_idx ON replaysafe.actions (tenant_id, lease_expires_at)
    WHERE state = 'running';
-- purge_actions: only terminal rows, oldest first.
CREATE INDEX actions_terminal_completed_idx ON replaysafe.actions (completed_at)
    WHERE state IN ('succeeded', 'failed');
-- A tenant's purge: its own old actions only.
CREATE INDEX actions_tenant_terminal_completed_idx ON replaysafe.actions (tenant_id, completed_at)
    WHERE state IN ('succeeded', 'failed');
-- unresolved_actions and reconciliation: a tenant's unknown rows, oldest first, without a scan.
CREATE INDEX actions_unknown_idx ON replaysafe.actions (tenant_id, updated_at)
    WHERE state = 'unknown';

-- metrics() counts the retryable actions, as the running and unknown ones, from their rows only.
CREATE INDEX actions_retryable_idx ON replaysafe.actions (tenant_id, updated_at)
    WHERE state = 'retryable';

CREATE TABLE replaysafe.action_attempts (
    tenant_id          text NOT NULL,
    action_key         text NOT NULL,
    attempt            integer NOT NULL,
    worker_id          text NOT NULL,
    claimed_at         timestamptz NOT NULL,
    ended_at           timestamptz,
    outcome            replaysafe.action_state,
    -- The attempt's report did not reach the action (a newer attempt or a final outcome won).
    superseded         boolean NOT NULL DEFAULT false,
    result             jsonb,
    error              jsonb,
    provider_reference text,
    -- sha256 of the attempt's token (a first attempt's is copied from the action row when the
    -- row is written): a superseded report must present it too.
    attempt_token_hash bytea,
    PRIMARY KEY (tenant_id, action_key, attempt)
);

-- metrics() counts multi-effect actions from their superseded successful reports only.
CREATE INDEX action_attempts_superseded_success_idx
    ON replaysafe.action_attempts (tenant_id, action_key) WHERE outcome = 'succeeded' AND superseded;

CREATE TYPE replaysafe.claim_record AS (
    outcome            text,
    state              replaysafe.action_state,
    attempt            integer,
    lease_expires_at   timestamptz,
    result             jsonb,
    error              jsonb,
    idempotency_key    text,
    provider_reference text,
    -- The attempt's capability, in a "claimed" answer only (NULL in every other).
    attempt_token      text
);

ALTER TABLE replaysafe.actions ENABLE ROW LEVEL SECURITY;
ALTER TABLE replaysafe.action_attempts ENABLE ROW LEVEL SECURITY;
