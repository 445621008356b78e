-- The queries of the `replaysafe-pg` command, one per "-- name: ... --" marker. Every name
-- in them (type, function, operator) is qualified, so that none resolves through the
-- caller's search_path: a public overload must never run with an operator's rights
-- (tests/unit/test_qualified_statements.py).
-- They read the audit views (row-level security of the caller applies) and call the
-- public functions with named arguments, like any other client.

-- name: server_info --
SELECT pg_catalog.current_setting('server_version') AS server_version, current_user::pg_catalog.text AS role, pg_catalog.current_database()::pg_catalog.text AS database

-- name: caller_scope --
-- doctor: is the caller the schema's owner (a member of it, or a superuser), and may it read
-- the actions view at all? No row: no schema. Catalogs only: any role may ask.
SELECT pg_catalog.pg_has_role(n.nspowner, 'MEMBER') AS owner, pg_catalog.has_schema_privilege(n.oid, 'USAGE') AND coalesce(pg_catalog.has_table_privilege(c.oid, 'SELECT'), false) AS reads_actions FROM pg_catalog.pg_namespace n LEFT JOIN pg_catalog.pg_class c ON c.relnamespace OPERATOR(pg_catalog.=) n.oid AND c.relname OPERATOR(pg_catalog.=) 'actions_v' WHERE n.nspname OPERATOR(pg_catalog.=) 'replaysafe'

-- name: group_roles --
SELECT r.name, EXISTS (SELECT 1 FROM pg_catalog.pg_roles p WHERE p.rolname OPERATOR(pg_catalog.=) r.name) AS present FROM pg_catalog.unnest(ARRAY['replaysafe_worker', 'replaysafe_operator', 'replaysafe_auditor', 'replaysafe_issuer']) AS r(name) ORDER BY r.name

-- name: table_rls --
SELECT c.relname::pg_catalog.text AS table_name, c.relrowsecurity AS rls_enabled FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace WHERE n.nspname OPERATOR(pg_catalog.=) 'replaysafe' AND c.relkind OPERATOR(pg_catalog.=) ANY (ARRAY['r', 'p']::pg_catalog."char"[]) AND c.relname OPERATOR(pg_catalog.<>) 'alembic_version' ORDER BY c.relname

-- name: schema_objects --
-- Every object in the schema (row types of tables and array types aside): doctor compares
-- them with what the migration creates, and with the schema's owner.
SELECT o.kind, o.name, o.signature, o.owner::pg_catalog.text AS owner, o.owner OPERATOR(pg_catalog.=) n.nspowner AS owned_by_schema_owner, o.search_path_pinned FROM pg_catalog.pg_namespace n CROSS JOIN LATERAL (SELECT CASE WHEN c.relkind OPERATOR(pg_catalog.=) 'r' THEN 'table' WHEN c.relkind OPERATOR(pg_catalog.=) 'v' THEN 'view' WHEN c.relkind OPERATOR(pg_catalog.=) 'i' THEN 'index' WHEN c.relkind OPERATOR(pg_catalog.=) 'c' THEN 'type' ELSE 'relation' END AS kind, c.relname::pg_catalog.text AS name, c.relname::pg_catalog.text AS signature, c.relowner::pg_catalog.regrole AS owner, NULL::pg_catalog.bool AS search_path_pinned FROM pg_catalog.pg_class c WHERE c.relnamespace OPERATOR(pg_catalog.=) n.oid UNION ALL SELECT 'function', p.proname::pg_catalog.text, p.oid::pg_catalog.regprocedure::pg_catalog.text, p.proowner::pg_catalog.regrole, coalesce('search_path=pg_catalog, pg_temp' OPERATOR(pg_catalog.=) ANY (p.proconfig), false) FROM pg_catalog.pg_proc p WHERE p.pronamespace OPERATOR(pg_catalog.=) n.oid UNION ALL SELECT 'type', t.typname::pg_catalog.text, t.typname::pg_catalog.text, t.typowner::pg_catalog.regrole, NULL FROM pg_catalog.pg_type t WHERE t.typnamespace OPERATOR(pg_catalog.=) n.oid AND t.typrelid OPERATOR(pg_catalog.=) 0 AND t.typcategory OPERATOR(pg_catalog.<>) 'A' UNION ALL SELECT 'operator', o.oprname::pg_catalog.text, o.oid::pg_catalog.regoperator::pg_catalog.text, o.oprowner::pg_catalog.regrole, NULL FROM pg_catalog.pg_operator o WHERE o.oprnamespace OPERATOR(pg_catalog.=) n.oid) o WHERE n.nspname OPERATOR(pg_catalog.=) 'replaysafe' ORDER BY o.kind, o.signature

-- name: schema_privileges --
-- Every privilege on a function or relation of the schema that someone other than its owner
-- holds (grantee PUBLIC as 'public'): doctor compares them with what the migration grants.
SELECT o.kind, o.name, o.signature, a.privilege_type AS privilege, CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'public' ELSE a.grantee::pg_catalog.regrole::pg_catalog.text END AS grantee FROM (SELECT 'function' AS kind, p.proname::pg_catalog.text AS name, p.oid::pg_catalog.regprocedure::pg_catalog.text AS signature, p.proowner AS owner, coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner)) AS acl FROM pg_catalog.pg_proc p WHERE p.pronamespace OPERATOR(pg_catalog.=) 'replaysafe'::pg_catalog.regnamespace UNION ALL SELECT CASE WHEN c.relkind OPERATOR(pg_catalog.=) 'v' THEN 'view' ELSE 'table' END, c.relname::pg_catalog.text, c.relname::pg_catalog.text, c.relowner, c.relacl FROM pg_catalog.pg_class c WHERE c.relnamespace OPERATOR(pg_catalog.=) 'replaysafe'::pg_catalog.regnamespace AND c.relkind OPERATOR(pg_catalog.=) ANY (ARRAY['r', 'v', 'p', 'm']::pg_catalog."char"[]) UNION ALL SELECT 'schema', n.nspname::pg_catalog.text, n.nspname::pg_catalog.text, n.nspowner, n.nspacl FROM pg_catalog.pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) 'replaysafe') o CROSS JOIN LATERAL pg_catalog.aclexplode(o.acl) a WHERE a.grantee OPERATOR(pg_catalog.<>) o.owner ORDER BY 1, 3, 5, 4

-- name: default_privileges --
-- ALTER DEFAULT PRIVILEGES that reach objects of the schema (the owner's, or in the schema):
-- the migration revokes what they grant, but they are there to be removed.
SELECT d.defaclrole::pg_catalog.regrole::pg_catalog.text AS creator, CASE WHEN d.defaclnamespace OPERATOR(pg_catalog.=) 0 THEN 'every schema' ELSE d.defaclnamespace::pg_catalog.regnamespace::pg_catalog.text END AS in_schema, CASE WHEN d.defaclobjtype OPERATOR(pg_catalog.=) 'r' THEN 'tables' WHEN d.defaclobjtype OPERATOR(pg_catalog.=) 'f' THEN 'functions' WHEN d.defaclobjtype OPERATOR(pg_catalog.=) 'n' THEN 'schemas' WHEN d.defaclobjtype OPERATOR(pg_catalog.=) 'T' THEN 'types' WHEN d.defaclobjtype OPERATOR(pg_catalog.=) 'S' THEN 'sequences' ELSE d.defaclobjtype::pg_catalog.text END AS objects, CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'public' ELSE a.grantee::pg_catalog.regrole::pg_catalog.text END AS grantee, a.privilege_type AS privilege FROM pg_catalog.pg_default_acl d CROSS JOIN LATERAL pg_catalog.aclexplode(d.defaclacl) a JOIN pg_catalog.pg_namespace n ON n.nspname OPERATOR(pg_catalog.=) 'replaysafe' WHERE ((d.defaclrole OPERATOR(pg_catalog.=) n.nspowner AND d.defaclnamespace OPERATOR(pg_catalog.=) ANY (ARRAY[0, n.oid])) OR d.defaclnamespace OPERATOR(pg_catalog.=) n.oid) AND a.grantee OPERATOR(pg_catalog.<>) d.defaclrole AND NOT EXISTS (SELECT 1 FROM pg_catalog.aclexplode(pg_catalog.acldefault(CASE WHEN d.defaclobjtype OPERATOR(pg_catalog.=) 'S' THEN 's' ELSE d.defaclobjtype END, d.defaclrole)) x WHERE x.grantee OPERATOR(pg_catalog.=) a.grantee AND x.privilege_type OPERATOR(pg_catalog.=) a.privilege_type) ORDER BY 1, 2, 3, 4

-- name: counts_by_state --
SELECT state::pg_catalog.text AS state, pg_catalog.count(*) AS actions FROM replaysafe.actions_v GROUP BY state ORDER BY state

-- name: list_actions --
SELECT tenant_id, action_key, operation, state::pg_catalog.text AS state, attempt, thread_id, created_at, updated_at, lease_expires_at FROM replaysafe.actions_v WHERE (%(tenant_id)s::pg_catalog.text IS NULL OR tenant_id OPERATOR(pg_catalog.=) %(tenant_id)s::pg_catalog.text) AND (pg_catalog.cardinality(%(states)s::pg_catalog.text[]) OPERATOR(pg_catalog.=) 0 OR state::pg_catalog.text OPERATOR(pg_catalog.=) ANY (%(states)s::pg_catalog.text[])) AND (%(operation)s::pg_catalog.text IS NULL OR operation OPERATOR(pg_catalog.=) %(operation)s::pg_catalog.text) AND (%(thread_id)s::pg_catalog.text IS NULL OR thread_id OPERATOR(pg_catalog.=) %(thread_id)s::pg_catalog.text) AND (%(older_than)s::pg_catalog.interval IS NULL OR created_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) %(older_than)s::pg_catalog.interval)) ORDER BY created_at DESC, tenant_id, action_key LIMIT %(limit)s::pg_catalog.int4

-- name: unresolved_actions --
SELECT tenant_id, action_key, operation, state::pg_catalog.text AS state, lease_expires_at, age, thread_id FROM replaysafe.unresolved_actions WHERE (%(tenant_id)s::pg_catalog.text IS NULL OR tenant_id OPERATOR(pg_catalog.=) %(tenant_id)s::pg_catalog.text) ORDER BY age DESC, tenant_id, action_key

-- name: multi_effect_actions --
SELECT tenant_id, action_key, operation, successful_attempts FROM replaysafe.multi_effect_actions WHERE (%(tenant_id)s::pg_catalog.text IS NULL OR tenant_id OPERATOR(pg_catalog.=) %(tenant_id)s::pg_catalog.text) ORDER BY tenant_id, action_key

-- name: purge_candidates --
SELECT pg_catalog.count(*) FROM replaysafe.actions_v WHERE state::pg_catalog.text OPERATOR(pg_catalog.=) ANY (ARRAY['succeeded', 'failed']) AND completed_at OPERATOR(pg_catalog.<) (%(now)s::pg_catalog.timestamptz OPERATOR(pg_catalog.-) %(older_than)s::pg_catalog.interval)

-- name: purge_thread_candidates --
-- `purge --threads --dry-run`: the versioned threads purge_threads would take (LangGraph
-- threads are in no view: not counted).
SELECT pg_catalog.count(*) FROM replaysafe.threads_v WHERE NOT deleted AND updated_at OPERATOR(pg_catalog.<) (%(now)s::pg_catalog.timestamptz OPERATOR(pg_catalog.-) %(older_than)s::pg_catalog.interval)

-- name: metrics --
-- `metrics`: the caller's rows of replaysafe.metrics(), per tenant or totals, of one tenant when
-- tenant_id is given.
SELECT m.name, m.tenant_id, m.state, m.value FROM replaysafe.metrics(p_by_tenant => %(by_tenant)s::pg_catalog.bool) AS m WHERE (%(tenant_id)s::pg_catalog.text IS NULL OR m.tenant_id OPERATOR(pg_catalog.=) %(tenant_id)s::pg_catalog.text) ORDER BY m.name, m.tenant_id NULLS FIRST, m.state NULLS FIRST

-- name: database_now --
SELECT pg_catalog.now()

-- name: unknown_due --
-- `reconcile`: the tenants (all the caller may see, or one) with unknown actions due for
-- reconciliation, how many, and since when (the same filter as queries.sql's reconcile_due),
-- the tenant whose oldest has waited longest first.
SELECT tenant_id, pg_catalog.count(*) AS due, pg_catalog.min(updated_at) AS oldest FROM replaysafe.actions_v WHERE state OPERATOR(pg_catalog.=) 'unknown' AND (%(tenant_id)s::pg_catalog.text IS NULL OR tenant_id OPERATOR(pg_catalog.=) %(tenant_id)s::pg_catalog.text) AND updated_at OPERATOR(pg_catalog.<=) (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) %(older_than)s::pg_catalog.interval) GROUP BY tenant_id ORDER BY oldest, tenant_id

-- name: citus_present --
-- doctor: is this a Citus database (its catalog is there: pg_catalog is the superuser's)?
SELECT pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL AS present

-- name: citus_tables --
-- doctor, on Citus only (the query names Citus's catalog): how each table of the schema is
-- distributed, and whether the bindings are looked up per node (docs/scale-out.md).
SELECT c.relname::pg_catalog.text AS table_name, p.partmethod::pg_catalog.text AS method, p.repmodel::pg_catalog.text AS repmodel, pg_catalog.column_to_column_name(p.logicalrelid, p.partkey) AS distribution_column, coalesce(p.colocationid OPERATOR(pg_catalog.=) (SELECT a.colocationid FROM pg_catalog.pg_dist_partition a WHERE a.logicalrelid OPERATOR(pg_catalog.=) 'replaysafe.actions'::pg_catalog.regclass), p.colocationid IS NULL AND (SELECT a.colocationid FROM pg_catalog.pg_dist_partition a WHERE a.logicalrelid OPERATOR(pg_catalog.=) 'replaysafe.actions'::pg_catalog.regclass) IS NULL) AS with_actions FROM pg_catalog.pg_class c LEFT JOIN pg_catalog.pg_dist_partition p ON p.logicalrelid OPERATOR(pg_catalog.=) c.oid WHERE c.relnamespace OPERATOR(pg_catalog.=) 'replaysafe'::pg_catalog.regnamespace AND c.relkind OPERATOR(pg_catalog.=) ANY (ARRAY['r', 'p']::pg_catalog."char"[]) AND c.relname OPERATOR(pg_catalog.<>) 'alembic_version' ORDER BY 1

-- name: citus_lookups --
-- doctor, on Citus: the views that find a caller's binding look it up per node (a later
-- migration that replaced them needs `migrate --citus` again).
SELECT v.name, pg_catalog.strpos(pg_catalog.pg_get_viewdef(('replaysafe.' OPERATOR(pg_catalog.||) v.name)::pg_catalog.regclass), 'role_binding_nodes') OPERATOR(pg_catalog.>) 0 AS per_node FROM pg_catalog.unnest(ARRAY['_caller', '_reader']) AS v(name) ORDER BY 1

-- name: worker_settings --
-- doctor's advice: each LOGIN role (not a superuser) that is a member of replaysafe_worker,
-- with the settings that apply to its sessions in this database, one row per level: its own
-- here (level 1), its own everywhere (2), everyone's here (3), every role's everywhere (4); a
-- lower level wins. Level 5 (no settings) lists each such role once.
SELECT r.rolname::pg_catalog.text AS role, CASE WHEN s.setrole OPERATOR(pg_catalog.<>) 0::pg_catalog.oid AND s.setdatabase OPERATOR(pg_catalog.<>) 0::pg_catalog.oid THEN 1 WHEN s.setrole OPERATOR(pg_catalog.<>) 0::pg_catalog.oid THEN 2 WHEN s.setdatabase OPERATOR(pg_catalog.<>) 0::pg_catalog.oid THEN 3 ELSE 4 END AS level, s.setconfig AS settings FROM pg_catalog.pg_roles r CROSS JOIN pg_catalog.pg_roles g JOIN pg_catalog.pg_db_role_setting s ON (s.setrole OPERATOR(pg_catalog.=) r.oid OR s.setrole OPERATOR(pg_catalog.=) 0::pg_catalog.oid) AND (s.setdatabase OPERATOR(pg_catalog.=) 0::pg_catalog.oid OR s.setdatabase OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())) WHERE g.rolname OPERATOR(pg_catalog.=) 'replaysafe_worker' AND r.rolcanlogin AND NOT r.rolsuper AND r.oid OPERATOR(pg_catalog.<>) g.oid AND pg_catalog.pg_has_role(r.oid, g.oid, 'MEMBER') UNION ALL SELECT r.rolname::pg_catalog.text, 5, NULL FROM pg_catalog.pg_roles r CROSS JOIN pg_catalog.pg_roles g WHERE g.rolname OPERATOR(pg_catalog.=) 'replaysafe_worker' AND r.rolcanlogin AND NOT r.rolsuper AND r.oid OPERATOR(pg_catalog.<>) g.oid AND pg_catalog.pg_has_role(r.oid, g.oid, 'MEMBER') ORDER BY 1, 2

-- name: issuers_with_duties --
-- doctor: LOGIN roles that may both issue tenant grants and act (a worker, operator or
-- auditor): whoever holds such a login grants itself any tenant. Catalogs only.
SELECT r.rolname::pg_catalog.text AS role, pg_catalog.array_agg(g.rolname::pg_catalog.text ORDER BY g.rolname) AS duties FROM pg_catalog.pg_roles r JOIN pg_catalog.pg_roles i ON i.rolname OPERATOR(pg_catalog.=) 'replaysafe_issuer' JOIN pg_catalog.pg_roles g ON g.rolname OPERATOR(pg_catalog.=) ANY (ARRAY['replaysafe_worker', 'replaysafe_operator', 'replaysafe_auditor']::pg_catalog.name[]) WHERE r.rolcanlogin AND NOT r.rolsuper AND pg_catalog.pg_has_role(r.oid, i.oid, 'MEMBER') AND pg_catalog.pg_has_role(r.oid, g.oid, 'MEMBER') GROUP BY r.rolname ORDER BY 1

-- name: pooled_logins_in_bound_roles --
-- doctor (as the schema owner: the bindings are its table): unbound LOGIN roles of a group
-- role that are members of a bound role (or of one bound to all tenants). With SET ROLE such
-- a login acts as that tenant (or every tenant) without any grant: a pooled login serving
-- many tenants should be a member of no bound role.
SELECT r.rolname::pg_catalog.text AS role, pg_catalog.array_agg(DISTINCT b.role_name ORDER BY b.role_name) AS bound_roles FROM pg_catalog.pg_roles r JOIN (SELECT x.role_oid, x.role_name FROM replaysafe.role_bindings x UNION ALL SELECT y.role_oid, y.role_name FROM replaysafe.all_tenant_roles y) b ON b.role_oid OPERATOR(pg_catalog.<>) r.oid AND pg_catalog.pg_has_role(r.oid, b.role_oid, 'MEMBER') WHERE r.rolcanlogin AND NOT r.rolsuper AND NOT EXISTS (SELECT 1 FROM replaysafe.role_bindings o WHERE o.role_oid OPERATOR(pg_catalog.=) r.oid) AND EXISTS (SELECT 1 FROM pg_catalog.pg_roles g WHERE g.rolname OPERATOR(pg_catalog.=) ANY (ARRAY['replaysafe_worker', 'replaysafe_operator', 'replaysafe_auditor']::pg_catalog.name[]) AND pg_catalog.pg_has_role(r.oid, g.oid, 'MEMBER')) GROUP BY r.rolname ORDER BY 1

-- name: installation_copy --
-- doctor (as the schema owner): is this database a copy (a template clone, a restore) of the
-- one the installation was created in? It then shares the installation's id and grant keys.
SELECT i.installation_id::pg_catalog.text AS installation_id, i.database_oid OPERATOR(pg_catalog.<>) d.oid AS copied FROM replaysafe.installation i, pg_catalog.pg_database d WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()

-- name: auditors_without_tenant --
-- doctor (as the schema owner: the bindings are its tables): LOGIN members of
-- replaysafe_auditor bound to no tenant and not to all tenants. They read nothing (unless
-- they present tenant grants).
SELECT r.rolname::pg_catalog.text AS role FROM pg_catalog.pg_roles r JOIN pg_catalog.pg_roles g ON g.rolname OPERATOR(pg_catalog.=) 'replaysafe_auditor' WHERE r.rolcanlogin AND NOT r.rolsuper AND pg_catalog.pg_has_role(r.oid, g.oid, 'MEMBER') AND NOT pg_catalog.pg_has_role(r.oid, (SELECT n.nspowner FROM pg_catalog.pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) 'replaysafe'), 'MEMBER') AND NOT EXISTS (SELECT 1 FROM replaysafe.role_bindings b WHERE b.role_oid OPERATOR(pg_catalog.=) r.oid) AND NOT EXISTS (SELECT 1 FROM replaysafe.all_tenant_roles a WHERE a.role_oid OPERATOR(pg_catalog.=) r.oid) ORDER BY 1

-- name: console_caller --
-- `console`: who the connected role is and what it may do there, to show (or not) the
-- operator's forms (the functions rule on every call all the same): what it acts for (under
-- its grant if any), and whether it owns the schema or is an operator or auditor.
SELECT a.role_name, a.tenant_id, a.all_tenants, pg_catalog.pg_has_role(n.nspowner, 'MEMBER') AS owner, pg_catalog.pg_has_role('replaysafe_operator', 'USAGE') AS operator, pg_catalog.pg_has_role('replaysafe_auditor', 'USAGE') AS auditor FROM replaysafe.acting_for(p_grant => %(grant)s::pg_catalog.text) AS a CROSS JOIN pg_catalog.pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) 'replaysafe'

-- name: console_threads --
-- `console`: the caller's threads, last written first.
SELECT tenant_id, thread_id, user_id, version, deleted, created_at, updated_at FROM replaysafe.threads_v WHERE (%(tenant_id)s::pg_catalog.text IS NULL OR tenant_id OPERATOR(pg_catalog.=) %(tenant_id)s::pg_catalog.text) ORDER BY updated_at DESC, tenant_id, thread_id LIMIT %(limit)s::pg_catalog.int4

-- name: console_thread --
-- `console`: one thread with its current state.
SELECT tenant_id, thread_id, user_id, version, deleted, state, history_limit, created_at, updated_at FROM replaysafe.threads_v WHERE tenant_id OPERATOR(pg_catalog.=) %(tenant_id)s::pg_catalog.text AND thread_id OPERATOR(pg_catalog.=) %(thread_id)s::pg_catalog.text

-- name: console_langgraph_checkpoints --
-- `console`: a LangGraph thread's checkpoints, newest first (what the saver's list returns).
SELECT c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id, c.metadata, pg_catalog.cardinality(c.channels) AS channels, pg_catalog.cardinality(c.write_task_ids) AS pending_writes FROM replaysafe.langgraph_list(p_tenant_id => %(tenant_id)s::pg_catalog.text, p_thread_id => %(thread_id)s::pg_catalog.text, p_limit => %(limit)s::pg_catalog.int4, p_grant => %(grant)s::pg_catalog.text) AS c
