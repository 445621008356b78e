-- Argument checks and errors shared by every function: private helpers (SECURITY INVOKER:
-- only the definer functions, running as the owner, may call them). Deliberate errors use
-- SQLSTATE class RS (RS001..RS006, see docs/errors.md).

CREATE OR REPLACE FUNCTION replaysafe._raise(p_sqlstate text, p_message text, p_detail text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_detail IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = p_sqlstate, MESSAGE = p_message;
    END IF;
    RAISE EXCEPTION USING ERRCODE = p_sqlstate, MESSAGE = p_message, DETAIL = p_detail;
END
$$;

CREATE OR REPLACE FUNCTION replaysafe._invalid(p_name text, p_rule text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM replaysafe._raise('RS005', format('invalid argument %s: %s', p_name, p_rule));
END
$$;

-- Every id (tenant, action key, thread, user, worker, operation, claim token): non-empty
-- text of at most 512 characters and 1,024 bytes. The public functions test the valid case
-- inline (no call) and call this only to name the offending argument.
CREATE OR REPLACE FUNCTION replaysafe._check_id(p_name text, p_value text, p_nullable boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_value IS NULL AND p_nullable THEN
        RETURN;
    END IF;
    IF p_value IS NULL OR length(p_value) NOT BETWEEN 1 AND 512 OR octet_length(p_value) > 1024 THEN
        PERFORM replaysafe._invalid(p_name, format(
            'must be non-empty text of at most 512 characters and 1024 bytes (got %s)',
            CASE WHEN p_value IS NULL THEN 'NULL'
                 ELSE length(p_value) || ' characters, ' || octet_length(p_value) || ' bytes' END));
    END IF;
END
$$;

-- Slow path of the time checks: p_now is NULL, not finite, outside the years a client can
-- represent, in the future, or more than 5 minutes before the database clock. Returns the
-- time the call uses. Only the schema owner and replaysafe_operator members may move time:
-- from anyone else a time more than 5 minutes away is refused, and a time in the future
-- (within those 5 minutes: client clocks drift) is taken as the clock, so a worker can never
-- expire or re-claim another caller's lease early. A caller with a tenant grant may move time
-- only when the grant too gives it the operator duty (the tenant check follows and verifies
-- the grant; here it is only read; p_report: see _acts_with_grant).
CREATE OR REPLACE FUNCTION replaysafe._check_now(p_now timestamptz, p_grant text DEFAULT NULL,
                                                 p_report boolean DEFAULT false)
RETURNS timestamptz
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_clock timestamptz := clock_timestamp();
BEGIN
    IF p_now IS NULL THEN
        PERFORM replaysafe._invalid('p_now', 'must not be NULL (omit it for the database clock)');
    END IF;
    IF NOT (p_now >= timestamptz '1900-01-01 00:00+00' AND p_now < timestamptz '9999-01-01 00:00+00') THEN
        PERFORM replaysafe._invalid('p_now', format(
            'must be a finite time between the years 1900 and 9999 (got %s)', p_now));
    END IF;
    IF p_now <= v_clock AND p_now >= v_clock - interval '5 minutes' THEN
        RETURN p_now;
    END IF;
    IF p_grant IS NULL THEN
        IF EXISTS (SELECT 1 FROM replaysafe._caller_scope c WHERE c.owner_or_operator) THEN
            RETURN p_now;
        END IF;
    -- Under a grant, the operator duty must be both the grant's and the caller's (USAGE).
    ELSIF (replaysafe._acts_with_grant(NULL, p_grant, '{worker,operator,auditor}', p_report)
           -> 'dut') ? 'operator'
          AND EXISTS (SELECT 1 FROM replaysafe._caller c
                      WHERE NOT c.restricted AND pg_has_role(
                          c.role_name, coalesce(to_regrole('replaysafe_operator')::oid, 0::oid),
                          'USAGE')) THEN
        RETURN p_now;
    END IF;
    IF p_now BETWEEN v_clock - interval '5 minutes' AND v_clock + interval '5 minutes' THEN
        RETURN v_clock;
    END IF;
    PERFORM replaysafe._invalid('p_now',
        'must lie within 5 minutes of the database clock (only the schema owner and '
        'replaysafe_operator members may pass another time)');
    RETURN NULL;
END
$$;

-- Every write is durable when it commits, whatever the session says: a caller's own
-- "synchronous_commit = off" (or one a pooled server connection kept from another client)
-- would let a committed claim vanish in a crash, and its tool run again. Raised to "on" for
-- the rest of the transaction (never lowered: "remote_write" and "remote_apply" stay).
CREATE OR REPLACE FUNCTION replaysafe._durable()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
END
$$;
