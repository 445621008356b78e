-- replaysafe on Citus: distribute an installed schema by tenant (docs/scale-out.md).
--
-- Run on the Citus coordinator, as the schema owner, after the ordinary migration to the
-- revision named in the guard below (`replaysafe-pg migrate --citus` does both; `--citus
-- --sql` prints this script). One transaction; safe to run again (what is already
-- distributed is left as it is). A distributed installation takes no revision script, up
-- or down: every one refuses it (replaysafe_pg.schema.citus_migration_guard).
--
-- What it does:
--   * every table with rows of a tenant is distributed by tenant_id, all co-located with
--     replaysafe.actions (one colocation group of their own), so a tenant's actions,
--     attempts, threads and checkpoints live on one worker;
--   * role_bindings, installation (the secret that salts idempotency keys: a delegated
--     claim derives the key on the worker), role_binding_nodes, grant_keys and
--     grant_generations (a delegated call verifies its tenant grant on the worker),
--     all_tenant_roles and limits (read by a delegated call's checks) are reference tables
--     (one copy on every node); alembic_version stays on the coordinator;
--   * every public function that takes p_tenant_id and acts on that tenant is registered
--     with distribution_arg_name => 'p_tenant_id', colocated with replaysafe.actions;
--     every other function (helpers, sweep, purge, bindings, installed_revision) is only
--     created on every node (no delegation); their grants are issued again so that Citus
--     sends them to the workers, where a delegated call checks EXECUTE;
--   * role bindings by role OID (docs/isolation.md) are looked up through
--     role_binding_nodes: a role has another OID on every node, and a delegated call reads
--     the worker's catalog. replaysafe._caller and replaysafe._reader are replaced by
--     versions that resolve (node group, the node's role OID, role name) to the binding.
--     replaysafe.citus_sync_role_bindings() fills it: run it after binding a new role,
--     after adding a node, and after renaming or re-creating a bound role. A role it does
--     not know on a node acts for no tenant there (RS004): the gap fails closed.
--
-- Reviewed against Citus's own definitions (citusdata/citus, src/backend/distributed/sql/):
--   create_distributed_table(table_name regclass, distribution_column text,
--       distribution_type citus.distribution_type DEFAULT 'hash',
--       colocate_with text DEFAULT 'default', shard_count int DEFAULT NULL)   -- 10.1-1 .. 13.x
--   create_reference_table(table_name regclass)                               -- 6.0-12 .. 13.x
--   create_distributed_function(function_name regprocedure,
--       distribution_arg_name text DEFAULT NULL, colocate_with text DEFAULT 'default',
--       force_delegation bool DEFAULT NULL)                                   -- 11.0-1 .. 13.x
--   run_command_on_workers(command text, parallel bool DEFAULT true, OUT nodename text,
--       OUT nodeport int, OUT success bool, OUT result text)                  -- 7.x .. 13.x
--   column_to_column_name(table_name regclass, column_var_text text) RETURNS text
--   pg_dist_partition(logicalrelid, partmethod, partkey, colocationid, repmodel, ...),
--   pg_dist_object(classid, objid, objsubid, ..., distribution_argument_index, colocationid,
--   force_delegation) (pg_catalog since 11.0), pg_dist_node, pg_dist_local_group (PUBLIC may
--   read them).
-- Citus 11.0 or later is required: calls of the form SELECT ... FROM fn(...) are delegated
-- since 11.0 (citusdata/citus#5693), views that depend on a distributed table are
-- propagated with it (#5950), pg_dist_object is in pg_catalog.

SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

-- guard: begin --
-- Refuse, before anything is written, where this script cannot run as reviewed.
DO $guard$
DECLARE
    v_version text := (SELECT e.extversion FROM pg_catalog.pg_extension e WHERE e.extname = 'citus');
    v_revision text;
    -- The revision this script was written and reviewed for.
    v_written_for constant text := '0014';
BEGIN
    IF v_version IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE =
            'the citus extension is not installed in this database: replaysafe''s Citus '
            'distribution needs a Citus coordinator (CREATE EXTENSION citus, as a superuser)';
    END IF;
    IF split_part(v_version, '.', 1)::integer < 11 THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = format(
            'citus %s is installed; replaysafe''s Citus distribution needs Citus 11.0 or later', v_version);
    END IF;
    IF (SELECT g.groupid FROM pg_catalog.pg_dist_local_group g) <> 0 THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE =
            'this is a Citus worker: run replaysafe''s Citus distribution on the coordinator';
    END IF;
    IF to_regclass('replaysafe.alembic_version') IS NOT NULL THEN
        SELECT string_agg(v.version_num::text, ' ') INTO v_revision FROM replaysafe.alembic_version v;
    END IF;
    IF v_revision IS DISTINCT FROM v_written_for THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = format(
            'replaysafe''s Citus distribution was written for schema revision %s and this '
            'database is at %s: migrate to %s first (or use the replaysafe_pg release whose '
            'Citus script matches the installed revision)', v_written_for,
            coalesce(v_revision, 'no revision'), v_written_for);
    END IF;
END
$guard$;
-- guard: end --

-- Delegation needs one placement per shard; FOR UPDATE needs it too.
SELECT pg_catalog.set_config('citus.shard_replication_factor', '1', true);

-- Every table is classified, and every key of a table to distribute holds tenant_id (what
-- create_distributed_table requires of primary keys, unique and exclusion constraints,
-- unique indexes and foreign keys): a table that a later revision adds stops this script
-- until someone decides where its rows live.
DO $classify$
DECLARE
    v_unknown text;
    v_key     text;
BEGIN
    SELECT string_agg(c.relname::text, ', ' ORDER BY c.relname) INTO v_unknown
    FROM pg_class c
    WHERE c.relnamespace = 'replaysafe'::regnamespace AND c.relkind IN ('r', 'p')
      AND c.relname NOT IN ('actions', 'action_attempts', 'threads', 'thread_versions',
                            'langgraph_checkpoints', 'langgraph_blobs', 'langgraph_writes',
                            'langgraph_namespaces', 'langgraph_thread_users', 'langgraph_threads',
                            'role_bindings',
                            'installation', 'role_binding_nodes', 'grant_keys',
                            'grant_generations', 'all_tenant_roles', 'limits', 'alembic_version');
    IF v_unknown IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = format(
            'replaysafe''s Citus distribution does not know the table(s) %s: refusing to '
            'distribute a schema it was not written for', v_unknown);
    END IF;
    SELECT string_agg(x.what, ', ' ORDER BY x.what) INTO v_key FROM (
        SELECT format('%s on %s', k.conname, k.conrelid::regclass) AS what
        FROM pg_constraint k
        WHERE k.conrelid IN (SELECT c.oid FROM pg_class c
                             WHERE c.relnamespace = 'replaysafe'::regnamespace
                               AND c.relname IN ('actions', 'action_attempts', 'threads', 'thread_versions',
                                                 'langgraph_checkpoints', 'langgraph_blobs',
                                                 'langgraph_writes', 'langgraph_namespaces'))
          AND k.contype IN ('p', 'u', 'x', 'f')
          AND NOT ((SELECT a.attnum FROM pg_attribute a
                    WHERE a.attrelid = k.conrelid AND a.attname = 'tenant_id') = ANY (k.conkey))
        UNION ALL  -- unique indexes without a constraint
        SELECT format('%s on %s', i.indexrelid::regclass, i.indrelid::regclass)
        FROM pg_index i
        WHERE i.indisunique
          AND i.indrelid IN (SELECT c.oid FROM pg_class c
                             WHERE c.relnamespace = 'replaysafe'::regnamespace
                               AND c.relname IN ('actions', 'action_attempts', 'threads', 'thread_versions',
                                                 'langgraph_checkpoints', 'langgraph_blobs',
                                                 'langgraph_writes', 'langgraph_namespaces'))
          AND NOT ((SELECT a.attnum FROM pg_attribute a
                    WHERE a.attrelid = i.indrelid AND a.attname = 'tenant_id') = ANY (i.indkey::smallint[]))) x;
    IF v_key IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = format(
            'the key(s) %s do not include tenant_id: Citus cannot enforce them across shards', v_key);
    END IF;
END
$classify$;

-- ---------------------------------------------------------------------------------------
-- Role bindings on every node
-- ---------------------------------------------------------------------------------------

-- (node group, that node's OID of the role) -> the role's binding (role_bindings.role_oid,
-- the coordinator's OID). The name is checked too: a row only ever matches the role it was
-- written for, whichever node evaluates the lookup.
DO $nodes$
BEGIN
    IF to_regclass('replaysafe.role_binding_nodes') IS NULL THEN
        CREATE TABLE replaysafe.role_binding_nodes (
            groupid   integer NOT NULL,
            role_oid  oid NOT NULL,
            role_name text NOT NULL,
            bound_oid oid NOT NULL,
            CONSTRAINT role_binding_nodes_pkey PRIMARY KEY (groupid, role_oid)
        );
        ALTER TABLE replaysafe.role_binding_nodes ENABLE ROW LEVEL SECURITY;
    END IF;
END
$nodes$;

-- As in sql/views/caller.sql, but the binding is looked up through role_binding_nodes on the node that
-- evaluates it (a delegated call runs on a worker, whose role OIDs are not the coordinator's).
CREATE OR REPLACE VIEW replaysafe._caller AS
SELECT r.role_name,
       CASE WHEN p.restricted THEN NULL  -- see the function
            ELSE coalesce(
                (SELECT b.tenant_id FROM replaysafe.role_binding_nodes m
                 JOIN replaysafe.role_bindings b ON b.role_oid = m.bound_oid
                 WHERE m.groupid = (SELECT g.groupid FROM pg_catalog.pg_dist_local_group g)
                   AND m.role_oid = to_regrole(quote_ident(r.role_name))::oid
                   AND m.role_name = r.role_name),
                (SELECT b.tenant_id FROM replaysafe.role_binding_nodes m
                 JOIN replaysafe.role_bindings b ON b.role_oid = m.bound_oid
                 WHERE m.groupid = (SELECT g.groupid FROM pg_catalog.pg_dist_local_group g)
                   AND m.role_oid = to_regrole(quote_ident(r.login_name))::oid
                   AND m.role_name = r.login_name)) END
           AS tenant_id,
       p.restricted
FROM (SELECT CASE WHEN current_setting('role') = 'none' THEN session_user::text
                  ELSE current_setting('role') END AS role_name,
             session_user::text AS login_name) r,
     LATERAL (SELECT replaysafe._in_restricted_operation() AS restricted) p;

CREATE OR REPLACE VIEW replaysafe._reader AS
SELECT coalesce(r.tenant_id, g.tenant_id) AS tenant_id,
       CASE WHEN r.tenant_id IS NOT NULL OR g.tenant_id IS NOT NULL THEN false
            WHEN current_user IN ('replaysafe_worker', 'replaysafe_operator', 'replaysafe_auditor',
                                  'replaysafe_issuer')
                THEN false
            ELSE pg_has_role(current_user, n.nspowner, 'USAGE')
                 -- Only for the session's own current role (or its login), never for code
                 -- an all-tenant role owns running in someone else's session.
                 OR (current_user::text = CASE WHEN current_setting('role') = 'none'
                                               THEN session_user::text
                                               ELSE current_setting('role') END
                     AND EXISTS (SELECT 1 FROM replaysafe.all_tenant_roles a
                                 WHERE (a.role_oid = to_regrole(quote_ident(current_user))::oid
                                        AND a.role_name = current_user::text)
                                    OR (a.role_oid = to_regrole(quote_ident(session_user))::oid
                                        AND a.role_name = session_user::text)))
            END AS reads_all,
       g.user_id
FROM (SELECT coalesce(
          (SELECT b.tenant_id FROM replaysafe.role_binding_nodes m
           JOIN replaysafe.role_bindings b ON b.role_oid = m.bound_oid
           WHERE m.groupid = (SELECT g.groupid FROM pg_catalog.pg_dist_local_group g)
             AND m.role_oid = to_regrole(quote_ident(current_user))::oid
             AND m.role_name = current_user::text),
          (SELECT b.tenant_id FROM replaysafe.role_binding_nodes m
           JOIN replaysafe.role_bindings b ON b.role_oid = m.bound_oid
           WHERE m.groupid = (SELECT g.groupid FROM pg_catalog.pg_dist_local_group g)
             AND m.role_oid = to_regrole(quote_ident(session_user))::oid
             AND m.role_name = session_user::text
             AND current_user::text = CASE WHEN current_setting('role') = 'none'
                                           THEN session_user::text
                                           ELSE current_setting('role') END))
          AS tenant_id) r
     LEFT JOIN LATERAL (SELECT f.tenant_id, f.user_id FROM replaysafe.grant_in_force() f
                        WHERE current_user::text = CASE WHEN current_setting('role') = 'none'
                                                        THEN session_user::text
                                                        ELSE current_setting('role') END) g
            ON true,
     pg_namespace n
WHERE n.nspname = 'replaysafe'
  AND pg_current_xact_id_if_assigned() IS DISTINCT FROM '0'::xid8;

-- As in sql/functions/tenancy.sql, but through role_binding_nodes on the node that evaluates
-- it (the hot functions' common case reads the binding here).
CREATE OR REPLACE FUNCTION replaysafe._binding()
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_role   text := CASE WHEN current_setting('role') = 'none' THEN session_user::text
                          ELSE current_setting('role') END;
    v_group  integer := (SELECT g.groupid FROM pg_catalog.pg_dist_local_group g);
    v_tenant text;
BEGIN
    SELECT b.tenant_id INTO v_tenant FROM replaysafe.role_binding_nodes m
    JOIN replaysafe.role_bindings b ON b.role_oid = m.bound_oid
    WHERE m.groupid = v_group AND m.role_oid = to_regrole(quote_ident(v_role))::oid
      AND m.role_name = v_role;
    IF NOT FOUND THEN
        SELECT b.tenant_id INTO v_tenant FROM replaysafe.role_binding_nodes m
        JOIN replaysafe.role_bindings b ON b.role_oid = m.bound_oid
        WHERE m.groupid = v_group AND m.role_oid = to_regrole(quote_ident(session_user::text))::oid
          AND m.role_name = session_user::text;
    END IF;
    RETURN v_tenant;
END
$$;

-- Rebuild role_binding_nodes from role_bindings and every node's catalog (schema owner only).
-- Returns the number of (node, role) rows. Reads each worker's pg_roles first (its own
-- connections, read-only), then rewrites the reference table in this transaction.
CREATE OR REPLACE FUNCTION replaysafe.citus_sync_role_bindings()
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_names   text[];
    v_groups  integer[] := '{}';
    v_results text[] := '{}';
    v_node    record;
    v_count   integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM replaysafe._caller_scope c WHERE c.is_owner) THEN
        PERFORM replaysafe._raise('RS004', 'access denied: only the schema owner syncs role bindings');
    END IF;
    IF (SELECT g.groupid FROM pg_dist_local_group g) IS DISTINCT FROM 0 THEN
        PERFORM replaysafe._raise('55000', 'run replaysafe.citus_sync_role_bindings() on the coordinator');
    END IF;
    -- Bound roles under their current names (a renamed role keeps its binding).
    SELECT array_agg(r.rolname::text ORDER BY r.rolname) INTO v_names
    FROM replaysafe.role_bindings b JOIN pg_roles r ON r.oid = b.role_oid;
    v_names := coalesce(v_names, '{}');

    FOR v_node IN
        SELECT w.nodename, w.nodeport, w.success, w.result, n.groupid
        FROM run_command_on_workers(format(
                 'SELECT coalesce(pg_catalog.json_object_agg(r.rolname, r.oid), ''{}'')::text '
                 'FROM pg_catalog.pg_roles r WHERE r.rolname = ANY (%L::text[])', v_names)) w
        LEFT JOIN pg_dist_node n
               ON n.nodename = w.nodename AND n.nodeport = w.nodeport AND n.noderole = 'primary'
    LOOP
        IF NOT v_node.success OR v_node.groupid IS NULL THEN
            PERFORM replaysafe._raise('55000', format(
                'could not read the roles of node %s:%s (%s): nothing was changed',
                v_node.nodename, v_node.nodeport, coalesce(v_node.result, 'not in pg_dist_node')));
        END IF;
        IF v_node.groupid <> 0 THEN  -- the coordinator answers below, from this catalog
            v_groups := v_groups || v_node.groupid;
            v_results := v_results || v_node.result;
        END IF;
    END LOOP;

    DELETE FROM replaysafe.role_binding_nodes;
    INSERT INTO replaysafe.role_binding_nodes (groupid, role_oid, role_name, bound_oid)
    SELECT 0, b.role_oid, r.rolname::text, b.role_oid
    FROM replaysafe.role_bindings b JOIN pg_roles r ON r.oid = b.role_oid;
    INSERT INTO replaysafe.role_binding_nodes (groupid, role_oid, role_name, bound_oid)
    SELECT DISTINCT ON (w.groupid, j.value::oid) w.groupid, j.value::oid, j.key, r.oid
    FROM unnest(v_groups, v_results) AS w(groupid, result)
    CROSS JOIN LATERAL json_each_text(w.result::json) j
    JOIN pg_roles r ON r.rolname = j.key
    JOIN replaysafe.role_bindings b ON b.role_oid = r.oid;
    SELECT count(*) INTO v_count FROM replaysafe.role_binding_nodes;
    RETURN v_count;
END
$$;
REVOKE ALL ON FUNCTION replaysafe.citus_sync_role_bindings() FROM PUBLIC;

-- ---------------------------------------------------------------------------------------
-- Distribution (each step skipped where Citus already has it as intended)
-- ---------------------------------------------------------------------------------------

DO $distribute$
DECLARE
    t          text;
    v_method   "char";
    v_repmodel "char";
    v_column   text;
    v_coloc    integer;
    v_anchor   integer;
BEGIN
    FOREACH t IN ARRAY ARRAY['role_bindings', 'installation', 'role_binding_nodes', 'grant_keys',
                             'grant_generations', 'all_tenant_roles', 'limits'] LOOP
        SELECT p.partmethod, p.repmodel INTO v_method, v_repmodel
        FROM pg_dist_partition p WHERE p.logicalrelid = format('replaysafe.%I', t)::regclass;
        IF NOT FOUND OR (v_method = 'n' AND v_repmodel <> 't') THEN  -- new, or a Citus local table
            PERFORM create_reference_table(format('replaysafe.%I', t)::regclass);
        ELSIF v_method <> 'n' THEN
            RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = format(
                'replaysafe.%s is distributed; it must be a reference table: undistribute it first', t);
        END IF;
    END LOOP;

    FOREACH t IN ARRAY ARRAY['actions', 'action_attempts', 'threads', 'thread_versions',
                             'langgraph_checkpoints', 'langgraph_blobs', 'langgraph_writes',
                             'langgraph_namespaces', 'langgraph_thread_users',
                             'langgraph_threads'] LOOP
        SELECT p.partmethod, p.repmodel, column_to_column_name(p.logicalrelid, p.partkey),
               p.colocationid
        INTO v_method, v_repmodel, v_column, v_coloc
        FROM pg_dist_partition p WHERE p.logicalrelid = format('replaysafe.%I', t)::regclass;
        IF NOT FOUND OR (v_method = 'n' AND v_repmodel <> 't') THEN  -- new, or a Citus local table
            IF t = 'actions' THEN
                -- A colocation group of its own: never co-located by accident with an
                -- application's tables distributed by a text column.
                PERFORM create_distributed_table('replaysafe.actions'::regclass, 'tenant_id',
                                                 colocate_with => 'none');
            ELSE
                PERFORM create_distributed_table(format('replaysafe.%I', t)::regclass, 'tenant_id',
                                                 colocate_with => 'replaysafe.actions');
            END IF;
            CONTINUE;
        END IF;
        v_anchor := (SELECT p.colocationid FROM pg_dist_partition p
                     WHERE p.logicalrelid = 'replaysafe.actions'::regclass);
        IF v_method <> 'h' OR v_column IS DISTINCT FROM 'tenant_id' OR v_coloc IS DISTINCT FROM v_anchor THEN
            RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = format(
                'replaysafe.%s is already a Citus table, but not hash-distributed by tenant_id '
                'and co-located with replaysafe.actions: undistribute it first', t);
        END IF;
    END LOOP;
END
$distribute$;

-- Functions. A public function that takes p_tenant_id acts on that tenant alone (every
-- statement in it is filtered by it): a call is delegated to the worker holding the tenant.
-- Not bind_role_to_tenant (it reads the coordinator's role OIDs and writes a reference
-- table), idempotency_key (the owner's, reads only the installation's secret), sweep and
-- purge (p_tenant_id is optional there: without it they work across tenants), nor the
-- tenant grants' issue and revoke (they read and write reference tables only).
DO $functions$
DECLARE
    f        record;
    v_anchor integer := (SELECT p.colocationid FROM pg_dist_partition p
                         WHERE p.logicalrelid = 'replaysafe.actions'::regclass);
    a        record;
BEGIN
    FOR f IN
        SELECT p.oid, p.oid::regprocedure AS sig,
               CASE WHEN p.proname !~ '^_'
                         AND p.proname NOT IN ('bind_role_to_tenant', 'idempotency_key',
                                               'sweep_expired_actions', 'purge_actions',
                                               'purge_threads',
                                               'issue_tenant_grant', 'revoke_tenant_grants')
                         AND 'p_tenant_id' = ANY (p.proargnames)
                    THEN array_position(p.proargnames, 'p_tenant_id') - 1 END AS arg_index
        FROM pg_proc p
        WHERE p.pronamespace = 'replaysafe'::regnamespace
          -- The bindings' writers stay on the coordinator: on a worker they would store
          -- that node's role OIDs in the reference table, which the sync reads as the
          -- coordinator's (a binding lent to whichever role holds that OID there).
          AND p.proname NOT IN ('bind_role_to_tenant', 'unbind_role', 'bind_role_to_all_tenants')
        ORDER BY p.oid
    LOOP
        CONTINUE WHEN EXISTS (
            SELECT 1 FROM pg_dist_object o
            WHERE o.classid = 'pg_proc'::regclass AND o.objid = f.oid AND o.objsubid = 0
              AND o.distribution_argument_index IS NOT DISTINCT FROM f.arg_index
              AND (f.arg_index IS NULL OR o.colocationid = v_anchor));
        IF f.arg_index IS NULL THEN
            PERFORM create_distributed_function(f.sig);
        ELSE
            PERFORM create_distributed_function(f.sig, 'p_tenant_id',
                                                colocate_with => 'replaysafe.actions');
        END IF;
    END LOOP;

    -- The grants again, now that the functions are distributed: Citus sends GRANT and REVOKE
    -- on a distributed function to every node, where a delegated call checks EXECUTE (and
    -- where a function is created with PUBLIC's default EXECUTE).
    FOR f IN SELECT p.oid::regprocedure AS sig, p.proowner, p.proacl
             FROM pg_proc p WHERE p.pronamespace = 'replaysafe'::regnamespace LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f.sig);
        FOR a IN SELECT DISTINCT x.grantee FROM aclexplode(f.proacl) x
                 WHERE x.grantee <> f.proowner AND x.grantee <> 0 LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', f.sig, a.grantee::regrole::text);
        END LOOP;
    END LOOP;
    FOR a IN SELECT DISTINCT x.grantee FROM pg_namespace n, aclexplode(n.nspacl) x
             WHERE n.nspname = 'replaysafe' AND x.grantee <> n.nspowner AND x.grantee <> 0 LOOP
        EXECUTE format('GRANT USAGE ON SCHEMA replaysafe TO %s', a.grantee::regrole::text);
    END LOOP;
END
$functions$;

-- The bindings that exist now, on every node.
SELECT replaysafe.citus_sync_role_bindings();
