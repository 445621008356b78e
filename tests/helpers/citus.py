"""Stand-ins for Citus (it cannot be installed here: no package for it): the functions and
catalogs ``sql/citus.sql`` calls and reads, created in ``pg_catalog`` of a
test database with Citus's exact signatures, recording every call in
``citus_standin.calls``.

The signatures are Citus's own (citusdata/citus, src/backend/distributed/sql/):
``create_distributed_table`` (udfs/create_distributed_table/10.1-1.sql, unchanged to 13.x),
``create_reference_table`` (citus--6.0-11--6.0-12.sql), ``create_distributed_function``
(udfs/create_distributed_function/11.0-1.sql), ``run_command_on_workers``
(citus--7.0-*.sql), ``column_to_column_name``; Citus's own regression suite overrides the
first three the same way (a plpgsql body, the same arguments) to test Postgres configurations.

What they do is a model, not Citus: a "worker" (group 1, ``w1:5433``) whose roles have the
OIDs listed in ``citus_standin.worker_roles``; ``pg_dist_local_group`` says which node the
session pretends to be. Needs a superuser (tables in ``pg_catalog``).
"""

from __future__ import annotations

from typing import Any

import psycopg

# SPEC §2-§3, §9: every public function that acts on the one tenant it is given, which
# citus.sql registers with distribution_arg_name => 'p_tenant_id'.
DELEGATED = frozenset({
    "claim_action", "claim_actions", "heartbeat_action", "complete_action", "fail_action",
    "mark_action_unknown", "resolve_action", "reopen_action",
    "read_thread", "write_thread", "thread_history", "delete_thread",
    "langgraph_put", "langgraph_put_writes", "langgraph_get_tuple", "langgraph_list",
    "langgraph_delete_thread", "langgraph_delete_for_runs", "langgraph_copy_thread",
    "langgraph_prune",
})

STANDINS = r"""
SET allow_system_table_mods = on;
CREATE SCHEMA citus;
CREATE TYPE citus.distribution_type AS ENUM ('hash', 'range', 'append');
CREATE SCHEMA citus_standin;
CREATE TABLE citus_standin.calls (n serial PRIMARY KEY, fn text NOT NULL, args jsonb NOT NULL);
CREATE TABLE citus_standin.worker_roles (rolname text PRIMARY KEY, oid oid NOT NULL);
CREATE TABLE pg_catalog.pg_dist_local_group (groupid integer PRIMARY KEY);
INSERT INTO pg_catalog.pg_dist_local_group VALUES (0);
CREATE TABLE pg_catalog.pg_dist_node (nodeid integer, groupid integer, nodename text,
                                      nodeport integer, noderole text);
INSERT INTO pg_catalog.pg_dist_node VALUES (1, 0, 'coordinator', 5432, 'primary'),
                                           (2, 1, 'w1', 5433, 'primary');
CREATE TABLE pg_catalog.pg_dist_partition (logicalrelid regclass PRIMARY KEY, partmethod "char",
                                           partkey text, colocationid integer, repmodel "char");
CREATE TABLE pg_catalog.pg_dist_object (classid oid, objid oid, objsubid integer,
                                        distribution_argument_index integer,
                                        colocationid integer, force_delegation boolean,
                                        PRIMARY KEY (classid, objid, objsubid));
RESET allow_system_table_mods;
GRANT SELECT ON pg_catalog.pg_dist_local_group, pg_catalog.pg_dist_node,
                pg_catalog.pg_dist_partition, pg_catalog.pg_dist_object TO PUBLIC;

CREATE FUNCTION pg_catalog.create_distributed_table(table_name regclass,
                                                    distribution_column text,
                                                    distribution_type citus.distribution_type DEFAULT 'hash',
                                                    colocate_with text DEFAULT 'default',
                                                    shard_count int DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO citus_standin.calls (fn, args) VALUES ('create_distributed_table', jsonb_build_object(
        'table_name', table_name::text, 'distribution_column', distribution_column,
        'distribution_type', distribution_type, 'colocate_with', colocate_with, 'shard_count', shard_count));
    IF EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = table_name AND p.repmodel = 't') THEN
        RAISE EXCEPTION 'table "%" is already distributed', table_name;
    END IF;
    INSERT INTO pg_dist_partition VALUES (table_name, 'h', distribution_column,
        CASE WHEN colocate_with = 'none' THEN 100 + (SELECT count(*) FROM pg_dist_partition)::integer
             ELSE (SELECT p.colocationid FROM pg_dist_partition p
                   WHERE p.logicalrelid = colocate_with::regclass) END, 's');
END
$f$;

CREATE FUNCTION pg_catalog.create_reference_table(table_name regclass)
RETURNS void LANGUAGE plpgsql STRICT AS $f$
BEGIN
    INSERT INTO citus_standin.calls (fn, args)
    VALUES ('create_reference_table', jsonb_build_object('table_name', table_name::text));
    INSERT INTO pg_dist_partition VALUES (table_name, 'n', NULL, 1, 't');
END
$f$;

CREATE FUNCTION pg_catalog.create_distributed_function(function_name regprocedure,
                                                       distribution_arg_name text DEFAULT NULL,
                                                       colocate_with text DEFAULT 'default',
                                                       force_delegation bool DEFAULT NULL)
RETURNS void LANGUAGE plpgsql CALLED ON NULL INPUT AS $f$
DECLARE
    v_index integer;
BEGIN
    INSERT INTO citus_standin.calls (fn, args) VALUES ('create_distributed_function', jsonb_build_object(
        'function_name', function_name::text, 'distribution_arg_name', distribution_arg_name,
        'colocate_with', colocate_with, 'force_delegation', force_delegation));
    IF distribution_arg_name IS NOT NULL THEN
        v_index := array_position((SELECT p.proargnames FROM pg_proc p WHERE p.oid = function_name),
                                  distribution_arg_name) - 1;
        IF v_index IS NULL THEN
            RAISE EXCEPTION 'cannot distribute the function "%" since the distribution argument is not valid',
                function_name;
        END IF;
    END IF;
    INSERT INTO pg_dist_object VALUES ('pg_proc'::regclass, function_name, 0, v_index,
        CASE WHEN distribution_arg_name IS NOT NULL THEN
            (SELECT p.colocationid FROM pg_dist_partition p
             WHERE p.logicalrelid = colocate_with::regclass) END,
        force_delegation)
    ON CONFLICT (classid, objid, objsubid) DO UPDATE
    SET distribution_argument_index = excluded.distribution_argument_index,
        colocationid = excluded.colocationid;
END
$f$;

CREATE FUNCTION pg_catalog.column_to_column_name(table_name regclass, column_var_text text)
RETURNS text LANGUAGE sql STRICT AS $f$ SELECT column_var_text $f$;

CREATE FUNCTION pg_catalog.run_command_on_workers(command text, parallel bool DEFAULT true,
                                                  OUT nodename text, OUT nodeport int,
                                                  OUT success bool, OUT result text)
RETURNS SETOF record LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO citus_standin.calls (fn, args)
    VALUES ('run_command_on_workers', jsonb_build_object('command', command));
    RETURN QUERY SELECT 'w1'::text, 5433, true,
        (SELECT coalesce(json_object_agg(w.rolname, w.oid), '{}')::text FROM citus_standin.worker_roles w);
END
$f$;
"""


def install_standins(conn: psycopg.Connection[Any]) -> None:
    """The stand-ins, in the database ``conn`` is connected to (as a superuser)."""
    conn.execute(STANDINS)


def citus_script_without_guard(script: str) -> str:
    """``citus.sql`` without its guard (the guard refuses a database without the citus
    extension, which is every database here: it is tested on its own)."""
    start, end = script.index("-- guard: begin --"), script.index("-- guard: end --")
    return script[:start] + script[end:]
