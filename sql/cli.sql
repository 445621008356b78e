-- The queries of the `replaysafe-pg` command, one per "-- name: ... --" marker. The CLI's
-- connections pin search_path to pg_catalog, pg_temp; polymorphic built-ins are qualified
-- as well (a public overload must never run with an operator's rights).
-- They read the audit views (row-level security of the caller applies) and call the
-- public functions with named arguments, like any other client.

-- name: server_info --
SELECT current_setting('server_version') AS server_version, current_user::text AS role, current_database()::text AS database

-- name: caller_scope --
-- doctor: is the caller the schema's owner (a member of it, or a superuser), and may it read
-- the actions view at all? No row: no schema. Catalogs only: any role may ask.
SELECT pg_catalog.pg_has_role(n.nspowner, 'MEMBER') AS owner, pg_catalog.has_schema_privilege(n.oid, 'USAGE') AND coalesce(pg_catalog.has_table_privilege(c.oid, 'SELECT'), false) AS reads_actions FROM pg_catalog.pg_namespace n LEFT JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = 'actions_v' WHERE n.nspname = 'replaysafe'

-- name: group_roles --
SELECT r.name, EXISTS (SELECT 1 FROM pg_catalog.pg_roles p WHERE p.rolname = r.name) AS present FROM pg_catalog.unnest(ARRAY['replaysafe_worker', 'replaysafe_operator', 'replaysafe_auditor']) AS r(name) ORDER BY r.name

-- name: table_rls --
SELECT c.relname::text AS table_name, c.relrowsecurity AS rls_enabled FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'replaysafe' AND c.relkind IN ('r', 'p') AND c.relname <> 'alembic_version' ORDER BY c.relname

-- name: schema_objects --
-- Every object in the schema (row types of tables and array types aside): doctor compares
-- them with what the migration creates, and with the schema's owner.
SELECT o.kind, o.name, o.signature, o.owner::text AS owner, o.owner = n.nspowner AS owned_by_schema_owner, o.search_path_pinned FROM pg_catalog.pg_namespace n CROSS JOIN LATERAL (SELECT CASE c.relkind WHEN 'r' THEN 'table' WHEN 'v' THEN 'view' WHEN 'i' THEN 'index' WHEN 'c' THEN 'type' ELSE 'relation' END AS kind, c.relname::text AS name, c.relname::text AS signature, c.relowner::regrole AS owner, NULL::boolean AS search_path_pinned FROM pg_catalog.pg_class c WHERE c.relnamespace = n.oid UNION ALL SELECT 'function', p.proname::text, p.oid::regprocedure::text, p.proowner::regrole, coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false) FROM pg_catalog.pg_proc p WHERE p.pronamespace = n.oid UNION ALL SELECT 'type', t.typname::text, t.typname::text, t.typowner::regrole, NULL FROM pg_catalog.pg_type t WHERE t.typnamespace = n.oid AND t.typrelid = 0 AND t.typcategory <> 'A' UNION ALL SELECT 'operator', o.oprname::text, o.oid::regoperator::text, o.oprowner::regrole, NULL FROM pg_catalog.pg_operator o WHERE o.oprnamespace = n.oid) o WHERE n.nspname = 'replaysafe' ORDER BY o.kind, o.signature

-- name: schema_privileges --
-- Every privilege on a function or relation of the schema that someone other than its owner
-- holds (grantee PUBLIC as 'public'): doctor compares them with what the migration grants.
SELECT o.kind, o.name, o.signature, a.privilege_type AS privilege, CASE WHEN a.grantee = 0 THEN 'public' ELSE a.grantee::regrole::text END AS grantee FROM (SELECT 'function' AS kind, p.proname::text AS name, p.oid::regprocedure::text AS signature, p.proowner AS owner, coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner)) AS acl FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'replaysafe'::regnamespace UNION ALL SELECT CASE c.relkind WHEN 'v' THEN 'view' ELSE 'table' END, c.relname::text, c.relname::text, c.relowner, c.relacl FROM pg_catalog.pg_class c WHERE c.relnamespace = 'replaysafe'::regnamespace AND c.relkind IN ('r', 'v', 'p', 'm') UNION ALL SELECT 'schema', n.nspname::text, n.nspname::text, n.nspowner, n.nspacl FROM pg_catalog.pg_namespace n WHERE n.nspname = 'replaysafe') o CROSS JOIN LATERAL pg_catalog.aclexplode(o.acl) a WHERE a.grantee <> o.owner ORDER BY 1, 3, 5, 4

-- name: default_privileges --
-- ALTER DEFAULT PRIVILEGES that reach objects of the schema (the owner's, or in the schema):
-- the migration revokes what they grant, but they are there to be removed.
SELECT d.defaclrole::regrole::text AS creator, CASE WHEN d.defaclnamespace = 0 THEN 'every schema' ELSE d.defaclnamespace::regnamespace::text END AS in_schema, CASE d.defaclobjtype WHEN 'r' THEN 'tables' WHEN 'f' THEN 'functions' WHEN 'n' THEN 'schemas' WHEN 'T' THEN 'types' WHEN 'S' THEN 'sequences' ELSE d.defaclobjtype::text END AS objects, CASE WHEN a.grantee = 0 THEN 'public' ELSE a.grantee::regrole::text END AS grantee, a.privilege_type AS privilege FROM pg_catalog.pg_default_acl d CROSS JOIN LATERAL pg_catalog.aclexplode(d.defaclacl) a JOIN pg_catalog.pg_namespace n ON n.nspname = 'replaysafe' WHERE ((d.defaclrole = n.nspowner AND d.defaclnamespace IN (0, n.oid)) OR d.defaclnamespace = n.oid) AND a.grantee <> d.defaclrole AND (a.grantee, a.privilege_type) NOT IN (SELECT x.grantee, x.privilege_type FROM pg_catalog.aclexplode(pg_catalog.acldefault(CASE d.defaclobjtype WHEN 'S' THEN 's' ELSE d.defaclobjtype END, d.defaclrole)) x) ORDER BY 1, 2, 3, 4

-- name: counts_by_state --
SELECT state::text AS state, count(*) AS actions FROM replaysafe.actions_v GROUP BY state ORDER BY state

-- name: list_actions --
SELECT tenant_id, action_key, operation, state::text AS state, attempt, thread_id, created_at, updated_at, lease_expires_at FROM replaysafe.actions_v WHERE (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s::text) AND (pg_catalog.cardinality(%(states)s::text[]) = 0 OR state::text = ANY (%(states)s::text[])) AND (%(operation)s::text IS NULL OR operation = %(operation)s::text) AND (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s::text) AND (%(older_than)s::interval IS NULL OR created_at < now() - %(older_than)s::interval) ORDER BY created_at DESC, tenant_id, action_key LIMIT %(limit)s::integer

-- name: unresolved_actions --
SELECT tenant_id, action_key, operation, state::text AS state, lease_expires_at, age, thread_id FROM replaysafe.unresolved_actions WHERE (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s::text) ORDER BY age DESC, tenant_id, action_key

-- name: multi_effect_actions --
SELECT tenant_id, action_key, operation, successful_attempts FROM replaysafe.multi_effect_actions WHERE (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s::text) ORDER BY tenant_id, action_key

-- name: purge_candidates --
SELECT count(*) FROM replaysafe.actions_v WHERE state::text IN ('succeeded', 'failed') AND completed_at < %(now)s::timestamptz - %(older_than)s::interval

-- name: database_now --
SELECT now()

-- name: unknown_due --
-- `reconcile`: the tenants (all the caller may see, or one) with unknown actions due for
-- reconciliation, and how many. The enum comparison is qualified: it must not resolve through
-- a caller's search_path (the same filter as queries.sql's unknown_actions).
SELECT tenant_id, count(*) AS due FROM replaysafe.actions_v WHERE state OPERATOR(pg_catalog.=) 'unknown' AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s::text) AND updated_at <= pg_catalog.clock_timestamp() - %(older_than)s::interval GROUP BY tenant_id ORDER BY tenant_id

-- name: citus_present --
-- doctor: is this a Citus database (its catalog is there: pg_catalog is the superuser's)?
SELECT pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL AS present

-- name: citus_tables --
-- doctor, on Citus only (the query names Citus's catalog): how each table of the schema is
-- distributed, and whether the bindings are looked up per node (docs/scale-out.md).
SELECT c.relname::text AS table_name, p.partmethod::text AS method, p.repmodel::text AS repmodel, pg_catalog.column_to_column_name(p.logicalrelid, p.partkey) AS distribution_column, p.colocationid IS NOT DISTINCT FROM (SELECT a.colocationid FROM pg_catalog.pg_dist_partition a WHERE a.logicalrelid = 'replaysafe.actions'::pg_catalog.regclass) AS with_actions FROM pg_catalog.pg_class c LEFT JOIN pg_catalog.pg_dist_partition p ON p.logicalrelid = c.oid WHERE c.relnamespace = 'replaysafe'::pg_catalog.regnamespace AND c.relkind IN ('r', 'p') AND c.relname <> 'alembic_version' ORDER BY 1

-- name: citus_lookups --
-- doctor, on Citus: the views that find a caller's binding look it up per node (a later
-- migration that replaced them needs `migrate --citus` again).
SELECT v.name, pg_catalog.strpos(pg_catalog.pg_get_viewdef(('replaysafe.' || v.name)::pg_catalog.regclass), 'role_binding_nodes') > 0 AS per_node FROM pg_catalog.unnest(ARRAY['_caller', '_reader']) AS v(name) ORDER BY 1
