-- Back to 0011: no tenant grants. Every grant issued stops working; LangGraph threads made
-- under a user's grant become the whole tenant's.

-- The caller and reader views lose a column: they and the views over them are made again
-- by 0011's function set.
DROP VIEW replaysafe.threads_v, replaysafe._visible_threads, replaysafe.actions_v,
    replaysafe.unresolved_actions, replaysafe._visible_actions, replaysafe.action_attempts_v,
    replaysafe.multi_effect_actions, replaysafe._visible_first_attempts,
    replaysafe._visible_attempts, replaysafe._reader, replaysafe._caller_scope,
    replaysafe._caller;

DROP FUNCTION replaysafe.issue_tenant_grant(text, interval, text, text[]);
DROP FUNCTION replaysafe.revoke_tenant_grants(text, text);
DROP FUNCTION replaysafe.rotate_grant_key(boolean);
DROP FUNCTION replaysafe.use_grant(text);
DROP FUNCTION replaysafe.grant_in_force();
DROP FUNCTION replaysafe._grant_seal(text);
DROP FUNCTION replaysafe._acts_with_grant(text, text, text[], boolean);
DROP FUNCTION replaysafe._grant_user(text, text);
DROP FUNCTION replaysafe._new_grant_key();
DROP FUNCTION replaysafe._hmac_sha256(bytea, bytea);
DROP FUNCTION replaysafe._hmac_pads(bytea);
DROP FUNCTION replaysafe._base64url(bytea);
DROP FUNCTION replaysafe._sweep_scope(text, text, text[]);
DROP FUNCTION replaysafe._langgraph_user_thread(text, text, text, boolean);
DROP FUNCTION replaysafe._durable();
DROP FUNCTION replaysafe._binding();

DROP FUNCTION replaysafe._acts_for(text, text, text[], boolean);
DROP FUNCTION replaysafe._check_now(timestamptz, text, boolean);
DROP FUNCTION replaysafe.claim_action(text, text, text, jsonb, text, interval, text, text,
                                      timestamptz, text, text);
DROP FUNCTION replaysafe._claim_locked(text, text, text, jsonb, text, interval, text, text,
                                       timestamptz, text, text);
DROP FUNCTION replaysafe.claim_actions(text, text[], text[], jsonb[], text, interval, text, text,
                                       timestamptz, text[], text);
DROP FUNCTION replaysafe.heartbeat_action(text, text, integer, text, interval, timestamptz, text);
DROP FUNCTION replaysafe._report(text, text, integer, text, replaysafe.action_state, jsonb, jsonb,
                                 text, timestamptz, text);
DROP FUNCTION replaysafe.complete_action(text, text, integer, text, jsonb, text, timestamptz, text);
DROP FUNCTION replaysafe.fail_action(text, text, integer, text, jsonb, boolean, timestamptz, text);
DROP FUNCTION replaysafe.mark_action_unknown(text, text, integer, text, jsonb, timestamptz, text);
DROP FUNCTION replaysafe.resolve_action(text, text, text, jsonb, jsonb, text, text, timestamptz,
                                        integer, text);
DROP FUNCTION replaysafe.reopen_action(text, text, text, timestamptz, text);
DROP FUNCTION replaysafe.sweep_expired_actions(integer, timestamptz, text, text);
DROP FUNCTION replaysafe.purge_actions(interval, integer, timestamptz, text, text);
DROP FUNCTION replaysafe.read_thread(text, text, text, text);
DROP FUNCTION replaysafe.write_thread(text, text, bigint, jsonb, text, integer, text);
DROP FUNCTION replaysafe.thread_history(text, text, text, integer, text);
DROP FUNCTION replaysafe.delete_thread(text, text, text, text);
DROP FUNCTION replaysafe.langgraph_put(text, text, text, text, text, jsonb, jsonb, text[], text[],
                                       text[], bytea[], integer, text);
DROP FUNCTION replaysafe.langgraph_put_writes(text, text, text, text, text, text, integer[], text[],
                                              text[], bytea[], boolean, text);
DROP FUNCTION replaysafe.langgraph_get_tuple(text, text, text, text, text);
DROP FUNCTION replaysafe.langgraph_list(text, text, text, text, jsonb, text, integer, text);
DROP FUNCTION replaysafe.langgraph_delete_thread(text, text, text);
DROP FUNCTION replaysafe.langgraph_delete_for_runs(text, text[], text);
DROP FUNCTION replaysafe.langgraph_copy_thread(text, text, text, text);
DROP FUNCTION replaysafe.langgraph_prune(text, text[], text, text);

DROP TABLE replaysafe.langgraph_thread_users, replaysafe.grant_generations, replaysafe.grant_keys;
ALTER TABLE replaysafe.installation DROP COLUMN installation_id, DROP COLUMN database_oid;
