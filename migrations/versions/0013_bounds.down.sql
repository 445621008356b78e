-- Back to 0012: no size limits; unbound auditors read every tenant again; roles named by
-- bind_role_to_all_tenants() lose that (an unbound operator acts for no tenant in 0012).

DROP FUNCTION replaysafe.bind_role_to_all_tenants(text);
DROP FUNCTION replaysafe.acting_for(text);
DROP FUNCTION replaysafe._role_to_bind(text);
DROP FUNCTION replaysafe._due_actions(integer, timestamptz, timestamptz);
DROP FUNCTION replaysafe._long_number(jsonb, bigint);
DROP FUNCTION replaysafe._oversize(jsonb, bigint, bigint);
DROP FUNCTION replaysafe._check_size(text, jsonb, text, bigint, bigint);
DROP FUNCTION replaysafe._check_bytes(text, bigint, text, bigint);
DROP FUNCTION replaysafe._langgraph_check_keys(bigint, bigint, bigint, text[], text[]);
DROP FUNCTION replaysafe._langgraph_check_blobs(text, bytea[], text, bigint);

-- The views read the new table: 0012's function set makes them again.
DROP VIEW replaysafe.threads_v, replaysafe._visible_threads, replaysafe.actions_v,
    replaysafe.unresolved_actions, replaysafe._visible_actions, replaysafe.action_attempts_v,
    replaysafe.multi_effect_actions, replaysafe._visible_first_attempts,
    replaysafe._visible_attempts, replaysafe._reader, replaysafe._caller_scope;

DROP TABLE replaysafe.all_tenant_roles;
DROP TABLE replaysafe.limits;
