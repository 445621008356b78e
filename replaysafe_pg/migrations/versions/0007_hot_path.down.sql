-- Downgrade of 0007: the DEALLOCATE probe of 0003.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

CREATE OR REPLACE FUNCTION replaysafe._in_restricted_operation()
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    EXECUTE 'DEALLOCATE replaysafe_probe_no_such_statement';
    RETURN false;  -- only if someone prepared a statement of that name
EXCEPTION
    WHEN insufficient_privilege THEN RETURN true;
    WHEN invalid_sql_statement_name THEN RETURN false;
END
$$;
