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

-- The digits of the longest number in a JSON value when one has more than p_digits (NULL
-- when none has): jsonb prints every number in full, with every digit of its scale (the
-- scale is kept, not the zeros: 1e131071 is 15 bytes in and 131,072 digits out, and
-- round(1::numeric, 16383) stores in a few bytes and prints 16,385 characters), so a few
-- bytes stored could print a gigabyte. The digits of a number are those before its point (at
-- least one) and its scale. Every number is read once, measured through its scale and its
-- magnitude; only a number that may be too long is measured exactly, and a huge one is never
-- printed.
CREATE OR REPLACE FUNCTION replaysafe._long_number(p_value jsonb, p_digits bigint)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_numbers jsonb;
    v_scale   integer;
    v_largest numeric;
    v_big     numeric;
    v_long    numeric;
BEGIN
    IF p_value IS NULL OR p_digits IS NULL THEN
        RETURN NULL;
    END IF;
    v_numbers := jsonb_path_query_array(p_value, 'strict $.** ? (@.type() == "number")');
    IF v_numbers = '[]'::jsonb THEN
        RETURN NULL;
    END IF;
    SELECT max(scale(e.x::numeric)), max(abs(e.x::numeric)) INTO v_scale, v_largest
    FROM jsonb_array_elements(v_numbers) e(x);
    v_big := power(10::numeric, least(p_digits, 131071)::integer);
    -- The longest fraction and the largest magnitude together keep the limit: every number does.
    IF v_scale < p_digits AND v_largest < v_big THEN
        IF v_scale + length(trunc(v_largest)::text) <= p_digits THEN
            RETURN NULL;
        END IF;
    END IF;
    SELECT m.n INTO v_long
    FROM jsonb_array_elements(v_numbers) e(x), LATERAL (SELECT e.x::numeric AS n) m
    WHERE CASE WHEN scale(m.n) >= p_digits OR abs(m.n) >= v_big THEN true
               ELSE scale(m.n) + length(trunc(abs(m.n))::text) > p_digits END
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN scale(v_long) + length(trunc(abs(v_long))::text);
END
$$;

-- How a JSON value breaks its limits: NULL when it keeps them, else {"bytes": stored size}
-- when it is larger than p_max bytes (pg_column_size), or {"digits": n} for a number of more
-- than p_digits digits (_long_number). A NULL limit is not enforced.
CREATE OR REPLACE FUNCTION replaysafe._oversize(p_value jsonb, p_max bigint, p_digits bigint)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_digits bigint;
BEGIN
    IF pg_column_size(p_value) > p_max THEN
        RETURN jsonb_build_object('bytes', pg_column_size(p_value));
    END IF;
    v_digits := replaysafe._long_number(p_value, p_digits);
    IF v_digits IS NOT NULL THEN
        RETURN jsonb_build_object('digits', v_digits);
    END IF;
    RETURN NULL;
END
$$;

-- RS005 unless a JSON argument keeps its limits (_oversize); p_limit names the column of
-- replaysafe.limits p_max comes from, for the message.
CREATE OR REPLACE FUNCTION replaysafe._check_size(p_name text, p_value jsonb, p_limit text,
                                                  p_max bigint, p_digits bigint)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_over jsonb := replaysafe._oversize(p_value, p_max, p_digits);
BEGIN
    IF v_over ? 'bytes' THEN
        PERFORM replaysafe._check_bytes(p_name, (v_over ->> 'bytes')::bigint, p_limit, p_max);
    ELSIF v_over ? 'digits' THEN
        PERFORM replaysafe._invalid(p_name, format(
            'holds a number of %s digits, over the limit of %s digits (replaysafe.limits '
            'number_digits)', v_over ->> 'digits', p_digits));
    END IF;
END
$$;

-- RS005 unless a stored size (pg_column_size of the argument) is at most p_max.
CREATE OR REPLACE FUNCTION replaysafe._check_bytes(p_name text, p_size bigint, p_limit text,
                                                   p_max bigint)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_size > p_max THEN
        PERFORM replaysafe._invalid(p_name, format(
            'is %s bytes stored, over its limit of %s bytes (replaysafe.limits %s)',
            p_size, p_max, p_limit));
    END IF;
END
$$;
