-- Downgrade of 0001: remove every object of the ledger. The schema itself stays because
-- it holds this migration chain's own version table (replaysafe.alembic_version).
DO $drop$
DECLARE
    f regprocedure;
BEGIN
    -- CASCADE: the views, the policies and the functions taking a table's row type.
    DROP TABLE IF EXISTS replaysafe.action_attempts, replaysafe.actions, replaysafe.role_bindings
        CASCADE;
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
             JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'replaysafe' LOOP
        EXECUTE 'DROP FUNCTION ' || f::text;
    END LOOP;
    DROP TYPE IF EXISTS replaysafe.claim_record, replaysafe.action_state;
END
$drop$;

-- Group roles are cluster-wide: drop them only where no other database still uses them.
DO $roles$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['replaysafe_worker', 'replaysafe_auditor'] LOOP
        IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            EXECUTE format('REVOKE ALL ON SCHEMA replaysafe FROM %I', r);
            BEGIN
                EXECUTE format('DROP ROLE %I', r);
            EXCEPTION WHEN dependent_objects_still_exist OR insufficient_privilege THEN
                RAISE NOTICE 'role % kept: still used elsewhere', r;
            END;
        END IF;
    END LOOP;
END
$roles$;
