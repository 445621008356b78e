-- The group roles and their privileges: EXECUTE on the public functions, SELECT on the audit
-- views, USAGE on the schema; nothing on a table or a private helper. Applied with the
-- function set after every revision step (a dropped and re-created function lost its
-- grants).

-- Group roles, created only where the migrating role may create roles. Roles are
-- cluster-wide, so another database may have created them already.
DO $roles$
DECLARE
    r text;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = current_user
               AND (rolsuper OR rolcreaterole)) THEN
        FOREACH r IN ARRAY ARRAY['replaysafe_worker', 'replaysafe_operator', 'replaysafe_auditor',
                                 'replaysafe_issuer'] LOOP
            BEGIN
                IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
                    EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', r);
                END IF;
            EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
            END;
        END LOOP;
    END IF;
END
$roles$;

-- Every privilege but the owner's goes first, whoever granted it (PUBLIC's default EXECUTE
-- on functions, and what ALTER DEFAULT PRIVILEGES may have added, on the schema too); then
-- the grants below.
DO $revoke$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT 'FUNCTION ' || p.oid::regprocedure::text AS object, a.grantee
        FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
        WHERE p.pronamespace = 'replaysafe'::regnamespace AND a.grantee <> p.proowner
        UNION
        SELECT DISTINCT 'TABLE ' || c.oid::regclass::text, a.grantee
        FROM pg_class c, aclexplode(c.relacl) a
        WHERE c.relnamespace = 'replaysafe'::regnamespace AND c.relkind IN ('r', 'v', 'p', 'm', 'S')
          AND a.grantee <> c.relowner
        UNION
        SELECT DISTINCT 'SCHEMA replaysafe', a.grantee
        FROM pg_namespace n, aclexplode(n.nspacl) a
        WHERE n.nspname = 'replaysafe' AND a.grantee <> n.nspowner
    LOOP
        EXECUTE format('REVOKE ALL ON %s FROM %s', r.object,
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE r.grantee::regrole::text END);
    END LOOP;
END
$revoke$;

-- What each group role may call and read, by function name (the function set defines one
-- signature per name). A role that does not exist (the migrating role may not create roles)
-- is skipped; a name that matches no function, or a view that is not there, stops the step.
DO $grants$
DECLARE
    r record;
    f pg_catalog.regprocedure;
    v_name text;
BEGIN
    FOR r IN
        SELECT d.role, d.functions, d.views FROM (VALUES
            (1, 'replaysafe_worker',
             ARRAY['claim_action', 'claim_actions', 'heartbeat_action', 'complete_action',
                   'fail_action', 'mark_action_unknown', 'sweep_expired_actions',
                   'read_thread', 'write_thread', 'thread_history', 'delete_thread',
                   'installed_revision',
                   'langgraph_put', 'langgraph_put_writes', 'langgraph_get_tuple', 'langgraph_list',
                   'langgraph_delete_thread', 'langgraph_delete_for_runs', 'langgraph_copy_thread',
                   'langgraph_prune', 'use_grant', 'grant_in_force', 'acting_for', 'metrics'],
             ARRAY['actions_v', 'action_attempts_v', 'unresolved_actions', 'multi_effect_actions',
                   'threads_v']),
            (2, 'replaysafe_auditor',
             ARRAY['installed_revision', 'use_grant', 'grant_in_force', 'acting_for', 'metrics'],
             ARRAY['actions_v', 'action_attempts_v', 'unresolved_actions', 'multi_effect_actions',
                   'threads_v']),
            (3, 'replaysafe_operator',
             ARRAY['resolve_action', 'reopen_action', 'purge_actions', 'sweep_expired_actions',
                   'installed_revision', 'use_grant', 'grant_in_force', 'revoke_tenant_grants',
                   'acting_for', 'metrics', 'purge_threads'],
             ARRAY['actions_v', 'action_attempts_v', 'unresolved_actions', 'multi_effect_actions',
                   'threads_v']),
            -- The issuer signs grants and does nothing else: no view, no ledger function.
            (4, 'replaysafe_issuer',
             ARRAY['issue_tenant_grant', 'installed_revision'],
             ARRAY[]::text[])) d(ord, role, functions, views)
        WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_roles a WHERE a.rolname = d.role)
        ORDER BY d.ord  -- the order the privileges are listed in (pg_dump shows it)
    LOOP
        EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA replaysafe TO %I', r.role);
        FOREACH v_name IN ARRAY r.functions LOOP
            f := NULL;
            FOR f IN SELECT p.oid::pg_catalog.regprocedure FROM pg_catalog.pg_proc p
                     WHERE p.pronamespace = 'replaysafe'::pg_catalog.regnamespace AND p.proname = v_name
            LOOP
                EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %I', f, r.role);
            END LOOP;
            IF f IS NULL THEN
                RAISE EXCEPTION 'replaysafe: grants.sql names a function that does not exist: %', v_name;
            END IF;
        END LOOP;
        FOREACH v_name IN ARRAY r.views LOOP
            EXECUTE pg_catalog.format('GRANT SELECT ON %s TO %I',
                                      pg_catalog.format('replaysafe.%I', v_name)::pg_catalog.regclass, r.role);
        END LOOP;
    END LOOP;
END
$grants$;
