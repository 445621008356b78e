-- Every statement the Python driver sends, one per "-- name: ... --" marker (but for the
-- LISTEN and the probe of replaysafe_pg/_listen.py).
-- Each is one round trip: a bare call of a replaysafe function with named arguments.
-- p_now and p_grant are sent only when the caller has them (replaysafe_pg/queries.py).
-- Every name in them (type, function, operator) is qualified, so that none resolves through
-- the caller's search_path (tests/unit/test_qualified_statements.py).

-- name: claim_action --
SELECT * FROM replaysafe.claim_action(p_tenant_id => %(tenant_id)s, p_action_key => %(action_key)s, p_operation => %(operation)s, p_request => %(request)s::pg_catalog.jsonb, p_worker_id => %(worker_id)s, p_lease => %(lease)s::pg_catalog.interval, p_thread_id => %(thread_id)s::pg_catalog.text, p_on_expired => %(on_expired)s, p_now => %(now)s::pg_catalog.timestamptz, p_claim_token => %(claim_token)s::pg_catalog.text, p_grant => %(grant)s::pg_catalog.text)

-- name: claim_actions --
SELECT * FROM replaysafe.claim_actions(p_tenant_id => %(tenant_id)s, p_action_keys => %(action_keys)s::pg_catalog.text[], p_operations => %(operations)s::pg_catalog.text[], p_requests => %(requests)s::pg_catalog.jsonb[], p_worker_id => %(worker_id)s, p_lease => %(lease)s::pg_catalog.interval, p_thread_id => %(thread_id)s::pg_catalog.text, p_on_expired => %(on_expired)s, p_now => %(now)s::pg_catalog.timestamptz, p_claim_tokens => %(claim_tokens)s::pg_catalog.text[], p_grant => %(grant)s::pg_catalog.text)

-- name: heartbeat_action --
SELECT replaysafe.heartbeat_action(p_tenant_id => %(tenant_id)s, p_action_key => %(action_key)s, p_attempt => %(attempt)s::pg_catalog.int4, p_attempt_token => %(attempt_token)s::pg_catalog.text, p_lease => %(lease)s::pg_catalog.interval, p_now => %(now)s::pg_catalog.timestamptz, p_grant => %(grant)s::pg_catalog.text)

-- name: complete_action --
SELECT replaysafe.complete_action(p_tenant_id => %(tenant_id)s, p_action_key => %(action_key)s, p_attempt => %(attempt)s::pg_catalog.int4, p_attempt_token => %(attempt_token)s::pg_catalog.text, p_result => %(result)s::pg_catalog.jsonb, p_provider_reference => %(provider_reference)s::pg_catalog.text, p_now => %(now)s::pg_catalog.timestamptz, p_grant => %(grant)s::pg_catalog.text)

-- name: fail_action --
SELECT replaysafe.fail_action(p_tenant_id => %(tenant_id)s, p_action_key => %(action_key)s, p_attempt => %(attempt)s::pg_catalog.int4, p_attempt_token => %(attempt_token)s::pg_catalog.text, p_error => %(error)s::pg_catalog.jsonb, p_retryable => %(retryable)s::pg_catalog.bool, p_now => %(now)s::pg_catalog.timestamptz, p_grant => %(grant)s::pg_catalog.text)

-- name: mark_action_unknown --
SELECT replaysafe.mark_action_unknown(p_tenant_id => %(tenant_id)s, p_action_key => %(action_key)s, p_attempt => %(attempt)s::pg_catalog.int4, p_attempt_token => %(attempt_token)s::pg_catalog.text, p_error => %(error)s::pg_catalog.jsonb, p_now => %(now)s::pg_catalog.timestamptz, p_grant => %(grant)s::pg_catalog.text)

-- name: resolve_action --
SELECT replaysafe.resolve_action(p_tenant_id => %(tenant_id)s, p_action_key => %(action_key)s, p_state => %(state)s, p_result => %(result)s::pg_catalog.jsonb, p_error => %(error)s::pg_catalog.jsonb, p_provider_reference => %(provider_reference)s::pg_catalog.text, p_note => %(note)s::pg_catalog.text, p_now => %(now)s::pg_catalog.timestamptz, p_expected_attempt => %(expected_attempt)s::pg_catalog.int4, p_grant => %(grant)s::pg_catalog.text)

-- name: reopen_action --
SELECT replaysafe.reopen_action(p_tenant_id => %(tenant_id)s, p_action_key => %(action_key)s, p_note => %(note)s::pg_catalog.text, p_now => %(now)s::pg_catalog.timestamptz, p_grant => %(grant)s::pg_catalog.text)

-- name: sweep_expired_actions --
SELECT replaysafe.sweep_expired_actions(p_limit => %(limit)s::pg_catalog.int4, p_now => %(now)s::pg_catalog.timestamptz, p_grant => %(grant)s::pg_catalog.text)

-- name: purge_actions --
SELECT replaysafe.purge_actions(p_older_than => %(older_than)s::pg_catalog.interval, p_limit => %(limit)s::pg_catalog.int4, p_now => %(now)s::pg_catalog.timestamptz, p_grant => %(grant)s::pg_catalog.text)

-- name: purge_threads --
SELECT replaysafe.purge_threads(p_older_than => %(older_than)s::pg_catalog.interval, p_limit => %(limit)s::pg_catalog.int4, p_now => %(now)s::pg_catalog.timestamptz, p_grant => %(grant)s::pg_catalog.text)

-- name: get_action --
SELECT tenant_id, action_key, thread_id, operation, state, attempt, on_expired, idempotency_key, request, result, error, provider_reference, lease_expires_at, created_at, updated_at, completed_at, worker_id, resolution_note, resolved_at FROM replaysafe.actions_v WHERE tenant_id OPERATOR(pg_catalog.=) %(tenant_id)s AND action_key OPERATOR(pg_catalog.=) %(action_key)s

-- name: unknown_actions --
-- The tenant's unknown actions, oldest first, whole (reconciliation reads reconcile_due).
SELECT tenant_id, action_key, thread_id, operation, state, attempt, on_expired, idempotency_key, request, result, error, provider_reference, lease_expires_at, created_at, updated_at, completed_at, worker_id, resolution_note, resolved_at FROM replaysafe.actions_v WHERE tenant_id OPERATOR(pg_catalog.=) %(tenant_id)s AND state OPERATOR(pg_catalog.=) 'unknown' AND updated_at OPERATOR(pg_catalog.<=) (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) %(older_than)s::pg_catalog.interval) ORDER BY updated_at, action_key LIMIT %(limit)s::pg_catalog.int4

-- name: reconcile_due --
-- Reconciliation's work list without the payloads: the tenant's unknown actions, oldest
-- first; reconcile_page reads the payloads of a few at a time, when their lookups are about
-- to run.
SELECT tenant_id, action_key, operation, attempt, provider_reference FROM replaysafe.actions_v WHERE tenant_id OPERATOR(pg_catalog.=) %(tenant_id)s AND state OPERATOR(pg_catalog.=) 'unknown' AND updated_at OPERATOR(pg_catalog.<=) (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) %(older_than)s::pg_catalog.interval) ORDER BY updated_at, action_key LIMIT %(limit)s::pg_catalog.int4

-- name: reconcile_page --
-- One page of the work list, whole: the payloads as JSON text, decoded row by row by the
-- driver (a row it cannot decode is that action's error, not the page's). A row whose
-- payloads add up to more than row_bytes (not NULL) comes without them, and fits false: it
-- is read again alone. Their stored sizes are measured first (pg_column_size: nothing
-- detoasted or printed), and only a row whose stored payloads fit is turned into text and
-- measured again, as text (a jsonb value can print to far more than it stores). (OFFSET 0:
-- each payload is turned into text once.)
SELECT a.tenant_id, a.action_key, a.thread_id, a.operation, a.state, a.attempt, a.on_expired, a.idempotency_key, CASE WHEN p.fits THEN p.request END, CASE WHEN p.fits THEN p.result END, CASE WHEN p.fits THEN p.error END, a.provider_reference, a.lease_expires_at, a.created_at, a.updated_at, a.completed_at, a.worker_id, a.resolution_note, a.resolved_at, p.fits FROM replaysafe.actions_v a CROSS JOIN LATERAL (SELECT %(row_bytes)s::pg_catalog.int8 IS NULL OR coalesce(pg_catalog.pg_column_size(a.request)::pg_catalog.int8, 0) OPERATOR(pg_catalog.+) coalesce(pg_catalog.pg_column_size(a.result)::pg_catalog.int8, 0) OPERATOR(pg_catalog.+) coalesce(pg_catalog.pg_column_size(a.error)::pg_catalog.int8, 0) OPERATOR(pg_catalog.<=) %(row_bytes)s::pg_catalog.int8 AS stored_fits OFFSET 0) s CROSS JOIN LATERAL (SELECT t.request, t.result, t.error, s.stored_fits AND (%(row_bytes)s::pg_catalog.int8 IS NULL OR coalesce(pg_catalog.octet_length(t.request)::pg_catalog.int8, 0) OPERATOR(pg_catalog.+) coalesce(pg_catalog.octet_length(t.result)::pg_catalog.int8, 0) OPERATOR(pg_catalog.+) coalesce(pg_catalog.octet_length(t.error)::pg_catalog.int8, 0) OPERATOR(pg_catalog.<=) %(row_bytes)s::pg_catalog.int8) AS fits FROM (SELECT CASE WHEN s.stored_fits THEN a.request::pg_catalog.text END AS request, CASE WHEN s.stored_fits THEN a.result::pg_catalog.text END AS result, CASE WHEN s.stored_fits THEN a.error::pg_catalog.text END AS error OFFSET 0) t OFFSET 0) p WHERE a.tenant_id OPERATOR(pg_catalog.=) %(tenant_id)s AND a.action_key OPERATOR(pg_catalog.=) ANY (%(action_keys)s::pg_catalog.text[])

-- name: reconcile_lock_wait --
-- Sent before reconciliation's resolve_action, in its transaction: the call waits at most
-- this long for a lock another transaction holds (then SQLSTATE 55P03). SET LOCAL's scope: it
-- ends with the transaction, so no pooler's server session keeps it.
SELECT pg_catalog.set_config('lock_timeout', %(lock_timeout)s::pg_catalog.text, true)

-- name: list_attempts --
SELECT tenant_id, action_key, attempt, worker_id, claimed_at, ended_at, outcome, superseded, error, result, provider_reference FROM replaysafe.action_attempts_v WHERE tenant_id OPERATOR(pg_catalog.=) %(tenant_id)s AND action_key OPERATOR(pg_catalog.=) %(action_key)s ORDER BY attempt

-- name: read_thread --
SELECT * FROM replaysafe.read_thread(p_tenant_id => %(tenant_id)s, p_thread_id => %(thread_id)s, p_user_id => %(user_id)s::pg_catalog.text, p_grant => %(grant)s::pg_catalog.text)

-- name: write_thread --
SELECT replaysafe.write_thread(p_tenant_id => %(tenant_id)s, p_thread_id => %(thread_id)s, p_expected_version => %(expected_version)s::pg_catalog.int8, p_state => %(state)s::pg_catalog.jsonb, p_user_id => %(user_id)s::pg_catalog.text, p_history_limit => %(history_limit)s::pg_catalog.int4, p_grant => %(grant)s::pg_catalog.text)

-- name: thread_history --
SELECT * FROM replaysafe.thread_history(p_tenant_id => %(tenant_id)s, p_thread_id => %(thread_id)s, p_user_id => %(user_id)s::pg_catalog.text, p_limit => %(limit)s::pg_catalog.int4, p_grant => %(grant)s::pg_catalog.text)

-- name: delete_thread --
SELECT replaysafe.delete_thread(p_tenant_id => %(tenant_id)s, p_thread_id => %(thread_id)s, p_user_id => %(user_id)s::pg_catalog.text, p_grant => %(grant)s::pg_catalog.text)

-- name: langgraph_put --
SELECT * FROM replaysafe.langgraph_put(p_tenant_id => %(tenant_id)s, p_thread_id => %(thread_id)s, p_checkpoint_ns => %(checkpoint_ns)s, p_checkpoint_id => %(checkpoint_id)s, p_parent_id => %(parent_id)s::pg_catalog.text, p_checkpoint => %(checkpoint)s::pg_catalog.jsonb, p_metadata => %(metadata)s::pg_catalog.jsonb, p_channels => %(channels)s::pg_catalog.text[], p_versions => %(versions)s::pg_catalog.text[], p_types => %(types)s::pg_catalog.text[], p_blobs => %(blobs)b::pg_catalog.bytea[], p_history_limit => %(history_limit)s::pg_catalog.int4, p_grant => %(grant)s::pg_catalog.text)

-- name: langgraph_put_writes --
SELECT replaysafe.langgraph_put_writes(p_tenant_id => %(tenant_id)s, p_thread_id => %(thread_id)s, p_checkpoint_ns => %(checkpoint_ns)s, p_checkpoint_id => %(checkpoint_id)s, p_task_id => %(task_id)s, p_task_path => %(task_path)s, p_idx => %(idx)s::pg_catalog.int4[], p_channels => %(channels)s::pg_catalog.text[], p_types => %(types)s::pg_catalog.text[], p_blobs => %(blobs)b::pg_catalog.bytea[], p_replace => %(replace)s::pg_catalog.bool, p_grant => %(grant)s::pg_catalog.text)

-- name: langgraph_get_tuple --
SELECT * FROM replaysafe.langgraph_get_tuple(p_tenant_id => %(tenant_id)s, p_thread_id => %(thread_id)s, p_checkpoint_ns => %(checkpoint_ns)s, p_checkpoint_id => %(checkpoint_id)s::pg_catalog.text, p_grant => %(grant)s::pg_catalog.text)

-- name: langgraph_list --
SELECT * FROM replaysafe.langgraph_list(p_tenant_id => %(tenant_id)s, p_thread_id => %(thread_id)s::pg_catalog.text, p_checkpoint_ns => %(checkpoint_ns)s::pg_catalog.text, p_checkpoint_id => %(checkpoint_id)s::pg_catalog.text, p_filter => %(filter)s::pg_catalog.jsonb, p_before => %(before)s::pg_catalog.text, p_limit => %(limit)s::pg_catalog.int4, p_grant => %(grant)s::pg_catalog.text)

-- name: langgraph_delete_thread --
SELECT replaysafe.langgraph_delete_thread(p_tenant_id => %(tenant_id)s, p_thread_id => %(thread_id)s, p_grant => %(grant)s::pg_catalog.text)

-- name: langgraph_delete_for_runs --
SELECT replaysafe.langgraph_delete_for_runs(p_tenant_id => %(tenant_id)s, p_run_ids => %(run_ids)s::pg_catalog.text[], p_grant => %(grant)s::pg_catalog.text)

-- name: langgraph_copy_thread --
SELECT replaysafe.langgraph_copy_thread(p_tenant_id => %(tenant_id)s, p_source_thread_id => %(source_thread_id)s, p_target_thread_id => %(target_thread_id)s, p_grant => %(grant)s::pg_catalog.text)

-- name: langgraph_prune --
SELECT replaysafe.langgraph_prune(p_tenant_id => %(tenant_id)s, p_thread_ids => %(thread_ids)s::pg_catalog.text[], p_strategy => %(strategy)s, p_grant => %(grant)s::pg_catalog.text)

-- name: acting_for --
-- What the caller acts for (its tenant, every tenant, or neither), under its grant if any:
-- asked when a reconciliation finds nothing to do, which a role that acts for no tenant
-- must not take for an answer.
SELECT * FROM replaysafe.acting_for(p_grant => %(grant)s::pg_catalog.text)

-- name: use_grant --
-- Before a view's query, in its transaction, under a tenant grant.
SELECT replaysafe.use_grant(p_grant => %(grant)s::pg_catalog.text)

-- name: revoke_tenant_grants --
SELECT replaysafe.revoke_tenant_grants(p_tenant_id => %(tenant_id)s, p_grant => %(grant)s::pg_catalog.text)

-- name: issue_tenant_grant --
SELECT replaysafe.issue_tenant_grant(p_tenant_id => %(tenant_id)s, p_ttl => %(ttl)s::pg_catalog.interval, p_user_id => %(user_id)s::pg_catalog.text, p_duties => %(duties)s::pg_catalog.text[])
