-- Revision 0007: a cheaper probe for security-restricted operations. Every public function
-- asks (through replaysafe._caller) whether it runs inside one (an index expression, ANALYZE,
-- REINDEX, ...: there it acts for nobody). The probe was an exception block around a
-- DEALLOCATE of a statement that does not exist, which raised and caught an error on every
-- call; it is now an UNLISTEN of a channel nobody listens on, which Postgres refuses in a
-- security-restricted operation (42501) and performs silently elsewhere: the same answer,
-- ~7 us less per probe (docs/performance.md). Data and interfaces unchanged.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

CREATE OR REPLACE FUNCTION replaysafe._in_restricted_operation()
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UNLISTEN replaysafe_restricted_operation_probe;
    RETURN false;
EXCEPTION
    WHEN insufficient_privilege THEN RETURN true;
END
$$;
