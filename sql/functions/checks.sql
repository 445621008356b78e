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

-- How a JSON value breaks its size limits (replaysafe.limits): NULL when it keeps them, else
-- {"bytes": stored size, "limit": ...} when it is larger than the limit p_limit names, or
-- {"digits": n, "limit": ...} for a number whose text form has more digits than
-- number_digits allows (jsonb prints numbers in full: 1e131071 is 15 bytes in and 131,072
-- digits out, and 0e-16383 prints 16,384). A limit whose row is deleted is not enforced.
-- Numbers: a number with at most half the digits before its point and half after it keeps
-- the limit, which a jsonpath filter tests for the common case (~5 us for a small request;
-- multiplying by 10^half makes a longer fraction show); those it lets through (and zero,
-- whose fraction of zeros no arithmetic shows) are measured one by one, the huge ones
-- without printing them. An integer's fraction is otherwise zeros the input spelled out,
-- as many as it has characters: it amplifies nothing, and is not counted.
CREATE OR REPLACE FUNCTION replaysafe._oversize(p_value jsonb, p_limit text)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_size   integer := pg_column_size(p_value);
    v_max    bigint;
    v_digits bigint;
    v_big    numeric;
    v_long   numeric;
BEGIN
    SELECT max(l.value) FILTER (WHERE l.name = p_limit),
           max(l.value) FILTER (WHERE l.name = 'number_digits')
    INTO v_max, v_digits
    FROM replaysafe.limits l WHERE l.name IN (p_limit, 'number_digits');
    IF v_size > v_max THEN
        RETURN jsonb_build_object('bytes', v_size, 'limit', v_max);
    END IF;
    IF v_digits IS NULL OR p_value IS NULL THEN
        RETURN NULL;
    END IF;
    IF v_digits = 1000 THEN  -- the default: a constant path, no variables to build
        IF NOT jsonb_path_exists(p_value, 'strict $.** ? (@.type() == "number" && (@ >= 1e500 || '
                                          '@ <= -1e500 || @ == 0 || (@ * 1e500).floor() != @ * 1e500))') THEN
            RETURN NULL;
        END IF;
    ELSIF NOT jsonb_path_exists(p_value, 'strict $.** ? (@.type() == "number" && (@ >= $half || '
                                         '@ <= -$half || @ == 0 || (@ * $half).floor() != @ * $half))',
                                jsonb_build_object('half', power(10::numeric, least(v_digits / 2, 65535)::integer))) THEN
        RETURN NULL;
    END IF;
    v_big := power(10::numeric, least(v_digits, 131071)::integer);
    SELECT m.n INTO v_long
    FROM jsonb_array_elements(jsonb_path_query_array(p_value,
             'strict $.** ? (@.type() == "number" && (@ >= $big || @ <= -$big || @ == 0 || @.floor() != @))',
             jsonb_build_object('big', v_big))) e(x),
         LATERAL (SELECT e.x::numeric AS n) m
    WHERE CASE WHEN scale(m.n) >= v_digits OR abs(m.n) >= v_big THEN true
               ELSE length(abs(m.n)::text) - sign(scale(m.n)) > v_digits END
    LIMIT 1;
    IF FOUND THEN
        RETURN jsonb_build_object('digits', length(replace(abs(v_long)::text, '.', '')),
                                  'limit', v_digits);
    END IF;
    RETURN NULL;
END
$$;

-- RS005 unless a JSON argument keeps its size limits (_oversize).
CREATE OR REPLACE FUNCTION replaysafe._check_size(p_name text, p_value jsonb, p_limit text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_over jsonb := replaysafe._oversize(p_value, p_limit);
BEGIN
    IF v_over IS NULL THEN
        RETURN;
    ELSIF v_over ? 'bytes' THEN
        PERFORM replaysafe._invalid(p_name, format(
            'is %s bytes stored, over its limit of %s bytes (replaysafe.limits %s)',
            v_over ->> 'bytes', v_over ->> 'limit', p_limit));
    END IF;
    PERFORM replaysafe._invalid(p_name, format(
        'holds a number of %s digits, over the limit of %s digits (replaysafe.limits number_digits)',
        v_over ->> 'digits', v_over ->> 'limit'));
END
$$;

-- RS005 unless a stored size (of a text or bytea argument) keeps the limit p_limit names.
CREATE OR REPLACE FUNCTION replaysafe._check_bytes(p_name text, p_size bigint, p_limit text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_max bigint;
BEGIN
    SELECT l.value INTO v_max FROM replaysafe.limits l WHERE l.name = p_limit;
    IF p_size > v_max THEN
        PERFORM replaysafe._invalid(p_name, format(
            'is %s bytes stored, over its limit of %s bytes (replaysafe.limits %s)',
            p_size, v_max, p_limit));
    END IF;
END
$$;
