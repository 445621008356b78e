-- Every statement the Python driver sends, one per "-- name: ... --" marker.
-- Each is one round trip: a bare call of a replaysafe function with named arguments.

-- name: claim_action --
SELECT * FROM replaysafe.claim_action(p_tenant_id => %(tenant_id)s, p_action_key => %(action_key)s, p_operation => %(operation)s, p_request => %(request)s::jsonb, p_worker_id => %(worker_id)s, p_lease => %(lease)s::interval, p_thread_id => %(thread_id)s::text, p_on_expired => %(on_expired)s, p_now => %(now)s::timestamptz, p_claim_token => %(claim_token)s::text)

-- name: claim_actions --
SELECT * FROM replaysafe.claim_actions(p_tenant_id => %(tenant_id)s, p_action_keys => %(action_keys)s::text[], p_operations => %(operations)s::text[], p_requests => %(requests)s::jsonb[], p_worker_id => %(worker_id)s, p_lease => %(lease)s::interval, p_thread_id => %(thread_id)s::text, p_on_expired => %(on_expired)s, p_now => %(now)s::timestamptz, p_claim_tokens => %(claim_tokens)s::text[])

-- name: heartbeat_action --
SELECT replaysafe.heartbeat_action(p_tenant_id => %(tenant_id)s, p_action_key => %(action_key)s, p_attempt => %(attempt)s::integer, p_attempt_token => %(attempt_token)s::text, p_lease => %(lease)s::interval, p_now => %(now)s::timestamptz)

-- name: complete_action --
SELECT replaysafe.complete_action(p_tenant_id => %(tenant_id)s, p_action_key => %(action_key)s, p_attempt => %(attempt)s::integer, p_attempt_token => %(attempt_token)s::text, p_result => %(result)s::jsonb, p_provider_reference => %(provider_reference)s::text, p_now => %(now)s::timestamptz)

-- name: fail_action --
SELECT replaysafe.fail_action(p_tenant_id => %(tenant_id)s, p_action_key => %(action_key)s, p_attempt => %(attempt)s::integer, p_attempt_token => %(attempt_token)s::text, p_error => %(error)s::jsonb, p_retryable => %(retryable)s::boolean, p_now => %(now)s::timestamptz)

-- name: mark_action_unknown --
SELECT replaysafe.mark_action_unknown(p_tenant_id => %(tenant_id)s, p_action_key => %(action_key)s, p_attempt => %(attempt)s::integer, p_attempt_token => %(attempt_token)s::text, p_error => %(error)s::jsonb, p_now => %(now)s::timestamptz)

-- name: resolve_action --
SELECT replaysafe.resolve_action(p_tenant_id => %(tenant_id)s, p_action_key => %(action_key)s, p_state => %(state)s, p_result => %(result)s::jsonb, p_error => %(error)s::jsonb, p_provider_reference => %(provider_reference)s::text, p_note => %(note)s::text, p_now => %(now)s::timestamptz, p_expected_attempt => %(expected_attempt)s::integer)

-- name: reopen_action --
SELECT replaysafe.reopen_action(p_tenant_id => %(tenant_id)s, p_action_key => %(action_key)s, p_note => %(note)s::text, p_now => %(now)s::timestamptz)

-- name: sweep_expired_actions --
SELECT replaysafe.sweep_expired_actions(p_limit => %(limit)s::integer, p_now => %(now)s::timestamptz)

-- name: purge_actions --
SELECT replaysafe.purge_actions(p_older_than => %(older_than)s::interval, p_limit => %(limit)s::integer, p_now => %(now)s::timestamptz)

-- name: get_action --
SELECT tenant_id, action_key, thread_id, operation, state, attempt, on_expired, idempotency_key, request, result, error, provider_reference, lease_expires_at, created_at, updated_at, completed_at, worker_id, resolution_note, resolved_at FROM replaysafe.actions_v WHERE tenant_id = %(tenant_id)s AND action_key = %(action_key)s

-- name: unknown_actions --
-- Reconciliation's work list: the tenant's unknown actions, oldest first (the operator is
-- qualified: an enum comparison must not resolve through a caller's search_path).
SELECT tenant_id, action_key, thread_id, operation, state, attempt, on_expired, idempotency_key, request, result, error, provider_reference, lease_expires_at, created_at, updated_at, completed_at, worker_id, resolution_note, resolved_at FROM replaysafe.actions_v WHERE tenant_id = %(tenant_id)s AND state OPERATOR(pg_catalog.=) 'unknown' AND updated_at <= clock_timestamp() - %(older_than)s::interval ORDER BY updated_at, action_key LIMIT %(limit)s::integer

-- name: list_attempts --
SELECT tenant_id, action_key, attempt, worker_id, claimed_at, ended_at, outcome, superseded, error, result, provider_reference FROM replaysafe.action_attempts_v WHERE tenant_id = %(tenant_id)s AND action_key = %(action_key)s ORDER BY attempt

-- name: listen_actions --
-- Ledger.run waits for an action's owner: the channel every report notifies (payload: the
-- action's idempotency_key), LISTENed before claiming again so no wake-up is missed.
LISTEN replaysafe_actions

-- name: unlisten_actions --
UNLISTEN replaysafe_actions

-- name: read_thread --
SELECT * FROM replaysafe.read_thread(p_tenant_id => %(tenant_id)s, p_thread_id => %(thread_id)s, p_user_id => %(user_id)s::text)

-- name: write_thread --
SELECT replaysafe.write_thread(p_tenant_id => %(tenant_id)s, p_thread_id => %(thread_id)s, p_expected_version => %(expected_version)s::bigint, p_state => %(state)s::jsonb, p_user_id => %(user_id)s::text, p_history_limit => %(history_limit)s::integer)

-- name: thread_history --
SELECT * FROM replaysafe.thread_history(p_tenant_id => %(tenant_id)s, p_thread_id => %(thread_id)s, p_user_id => %(user_id)s::text, p_limit => %(limit)s::integer)

-- name: delete_thread --
SELECT replaysafe.delete_thread(p_tenant_id => %(tenant_id)s, p_thread_id => %(thread_id)s, p_user_id => %(user_id)s::text)

-- name: langgraph_put --
SELECT * FROM replaysafe.langgraph_put(p_tenant_id => %(tenant_id)s, p_thread_id => %(thread_id)s, p_checkpoint_ns => %(checkpoint_ns)s, p_checkpoint_id => %(checkpoint_id)s, p_parent_id => %(parent_id)s::text, p_checkpoint => %(checkpoint)s::jsonb, p_metadata => %(metadata)s::jsonb, p_channels => %(channels)s::text[], p_versions => %(versions)s::text[], p_types => %(types)s::text[], p_blobs => %(blobs)b::bytea[], p_history_limit => %(history_limit)s::integer)

-- name: langgraph_put_writes --
SELECT replaysafe.langgraph_put_writes(p_tenant_id => %(tenant_id)s, p_thread_id => %(thread_id)s, p_checkpoint_ns => %(checkpoint_ns)s, p_checkpoint_id => %(checkpoint_id)s, p_task_id => %(task_id)s, p_task_path => %(task_path)s, p_idx => %(idx)s::integer[], p_channels => %(channels)s::text[], p_types => %(types)s::text[], p_blobs => %(blobs)b::bytea[], p_replace => %(replace)s::boolean)

-- name: langgraph_get_tuple --
SELECT * FROM replaysafe.langgraph_get_tuple(p_tenant_id => %(tenant_id)s, p_thread_id => %(thread_id)s, p_checkpoint_ns => %(checkpoint_ns)s, p_checkpoint_id => %(checkpoint_id)s::text)

-- name: langgraph_list --
SELECT * FROM replaysafe.langgraph_list(p_tenant_id => %(tenant_id)s, p_thread_id => %(thread_id)s::text, p_checkpoint_ns => %(checkpoint_ns)s::text, p_checkpoint_id => %(checkpoint_id)s::text, p_filter => %(filter)s::jsonb, p_before => %(before)s::text, p_limit => %(limit)s::integer)

-- name: langgraph_delete_thread --
SELECT replaysafe.langgraph_delete_thread(p_tenant_id => %(tenant_id)s, p_thread_id => %(thread_id)s)

-- name: langgraph_delete_for_runs --
SELECT replaysafe.langgraph_delete_for_runs(p_tenant_id => %(tenant_id)s, p_run_ids => %(run_ids)s::text[])

-- name: langgraph_copy_thread --
SELECT replaysafe.langgraph_copy_thread(p_tenant_id => %(tenant_id)s, p_source_thread_id => %(source_thread_id)s, p_target_thread_id => %(target_thread_id)s)

-- name: langgraph_prune --
SELECT replaysafe.langgraph_prune(p_tenant_id => %(tenant_id)s, p_thread_ids => %(thread_ids)s::text[], p_strategy => %(strategy)s)
