-- ---------------------------------------------------------------------------------------
-- Tenant grants (docs/isolation.md#tenant-grants): the capability of a pooled login that
-- serves many tenants. An issuer (a member of replaysafe_issuer: the application server,
-- never the agent) signs a grant for one tenant, optionally one user, with duties and an
-- expiry; the tenant-scoped functions take it as p_grant and act for its tenant with the
-- duties both the grant and the login's group roles give.
--
-- The format is a compact JWS (RFC 7515) with HS256: base64url(header) "." base64url(claims)
-- "." base64url(HMAC-SHA256 of the first two parts). The header is fixed per key (it names
-- the key and pins the algorithm) and found by primary key; the claims are a jsonb object
-- built by jsonb_build_object (never by concatenation): iss (the installation and the
-- database's name), tid (tenant), sub (user, when the grant names one), dut (duties), iat and
-- exp (seconds since the epoch, by the database clock), gen (the tenant's revocation
-- generation). Nothing but these functions makes or reads a grant's claims.
-- ---------------------------------------------------------------------------------------

-- base64url without padding (RFC 4648 section 5): encode() wraps base64 lines at 76
-- characters; translate() maps the two letters that differ and drops the padding and
-- the line breaks.
CREATE OR REPLACE FUNCTION replaysafe._base64url(p_bytes bytea)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT translate(encode(p_bytes, 'base64'), E'+/=\n', '-_')
$$;

-- HMAC's two padded keys (RFC 2104): a key longer than SHA-256's 64-byte block is hashed
-- first, a shorter one padded with zeros; then XOR 0x36 (inner) and 0x5c (outer).
CREATE OR REPLACE FUNCTION replaysafe._hmac_pads(p_key bytea, OUT inner_pad bytea, OUT outer_pad bytea)
LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    WITH k AS (
        SELECT CASE WHEN length(p_key) > 64 THEN sha256(p_key) ELSE p_key END AS key)
    SELECT decode(string_agg(lpad(to_hex(b.byte # 54), 2, '0'), '' ORDER BY b.i), 'hex'),
           decode(string_agg(lpad(to_hex(b.byte # 92), 2, '0'), '' ORDER BY b.i), 'hex')
    FROM k, LATERAL (SELECT i, CASE WHEN i < length(k.key) THEN get_byte(k.key, i) ELSE 0 END
                     FROM generate_series(0, 63) i) b(i, byte)
$$;

-- HMAC-SHA256 (RFC 2104, RFC 4231) from sha256(): Postgres has no hmac() without pgcrypto.
CREATE OR REPLACE FUNCTION replaysafe._hmac_sha256(p_key bytea, p_message bytea)
RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT sha256(p.outer_pad || sha256(p.inner_pad || p_message))
    FROM replaysafe._hmac_pads(p_key) p
$$;

-- A new signing key: 244 random bits from the server's strong random source, kept as its
-- two pads, with the grant header that names it and the installation that made it. A grant
-- names that installation and the database (its name: a template clone has another; the
-- clone shares the key's row, never the name). Returns its key id.
CREATE OR REPLACE FUNCTION replaysafe._new_grant_key()
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key_id text := 'rsgk_' || left(replace(gen_random_uuid()::text, '-', ''), 16);
BEGIN
    INSERT INTO replaysafe.grant_keys (header, key_id, issuer, inner_pad, outer_pad)
    SELECT replaysafe._base64url(convert_to(
               jsonb_build_object('alg', 'HS256', 'kid', v_key_id, 'typ', 'JWT')::text, 'UTF8')),
           v_key_id, 'replaysafe:' || i.installation_id::text, p.inner_pad, p.outer_pad
    FROM replaysafe.installation i,
         replaysafe._hmac_pads(decode(replace(gen_random_uuid()::text || gen_random_uuid()::text,
                                              '-', ''), 'hex')) p;
    RETURN v_key_id;
END
$$;

-- The claims of p_grant when the caller may act with it for p_tenant_id (NULL: the grant's
-- own tenant) in one of p_duties; otherwise an error that writes nothing:
--   RS005 when p_grant is not a grant at all (NULL, over 2 KiB, not three base64url parts
--         with a canonical 32-byte signature);
--   RS004 when it is not valid here and now (unknown key, altered, another installation's or
--         database's, expired, revoked), is for another tenant, the session is bound to
--         another tenant (its current role's binding, else its login's: SET ROLE never
--         widens), none of p_duties is both the grant's and the caller's (its group roles;
--         the schema owner has every duty), or inside a security-restricted operation.
-- p_report: a heartbeat or report of an attempt, authorised by its attempt token: a grant that
-- expired while the tool ran does not stop its result from being recorded, for up to 7 days
-- after its expiry (the longest lease; revocation stops it at once).
-- Expiry and revocation are checked against the database clock and the tenant's current
-- generation (one primary-key probe); nothing is cached in the session. One query reads the
-- key (by the grant's header: it pins the algorithm and names the key) and the generation;
-- the signature is compared as the hash
-- of its canonical base64url text (a non-canonical spelling never matches, and the
-- comparison's time says nothing about the expected MAC).
CREATE OR REPLACE FUNCTION replaysafe._acts_with_grant(p_tenant_id text, p_grant text, p_duties text[],
                                                       p_report boolean DEFAULT false)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_header     text := split_part(p_grant, '.', 1);
    v_body       text := split_part(p_grant, '.', 2);
    v_inner      bytea;
    v_outer      bytea;
    v_issuer     text;
    v_role       text;
    v_bound      text;
    v_restricted boolean;
    v_generation bigint;
    v_claims     jsonb;
    v_duty       text;
BEGIN
    IF p_grant IS NULL OR octet_length(p_grant) > 2048 THEN
        PERFORM replaysafe._invalid('p_grant', 'must be a tenant grant of at most 2048 bytes '
                                    '(replaysafe.issue_tenant_grant makes them)');
    END IF;
    -- A snapshot older than a revocation or a key rotation would not see it: the keys and the
    -- generations are read with a snapshot of this statement's (READ COMMITTED, or the first
    -- statement of a REPEATABLE READ or SERIALIZABLE transaction, whose snapshot it takes).
    IF current_setting('transaction_isolation') <> 'read committed'
       AND statement_timestamp() <> transaction_timestamp() THEN
        PERFORM replaysafe._raise('RS004', format(
            'access denied: a tenant grant is honoured in READ COMMITTED transactions, and in the '
            'first statement of a %s one only (an older snapshot would not see a revocation)',
            upper(current_setting('transaction_isolation'))));
    END IF;
    -- As in _acts_for: a COLLATE clause on an argument would rule every comparison here.
    IF pg_collation_for(p_tenant_id) COLLATE "C" IS DISTINCT FROM '"default"' THEN
        PERFORM replaysafe._invalid('p_tenant_id', 'the arguments must not carry a COLLATE clause '
                                    '(comparisons use the database''s collation)');
    END IF;
    SELECT k.inner_pad, k.outer_pad, k.issuer || ':' || current_database(),
           (SELECT g.generation FROM replaysafe.grant_generations g
            WHERE g.tenant_id = p_tenant_id)
    INTO v_inner, v_outer, v_issuer, v_generation
    FROM replaysafe.grant_keys k
    WHERE k.header = v_header;
    IF NOT FOUND OR octet_length(p_grant) <> octet_length(v_header) + octet_length(v_body) + 45
       OR sha256(convert_to(translate(encode(sha256(v_outer || sha256(
               v_inner || convert_to(v_header || '.' || v_body, 'UTF8'))), 'base64'), '+/=', '-_'),
               'UTF8'))
           IS DISTINCT FROM sha256(convert_to(split_part(p_grant, '.', 3), 'UTF8')) THEN
        IF p_grant COLLATE "C" !~ '^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]$' THEN
            PERFORM replaysafe._invalid('p_grant', 'must be a tenant grant of at most 2048 bytes '
                                        '(replaysafe.issue_tenant_grant makes them)');
        END IF;
        IF NOT FOUND THEN
            PERFORM replaysafe._raise('RS004', 'access denied: the grant was not signed by a key '
                                      'of this installation (another installation''s, or a '
                                      'retired key)');
        END IF;
        PERFORM replaysafe._raise('RS004', 'access denied: the grant''s signature does not match');
    END IF;
    -- Signed by us: the claims are the text issue_tenant_grant encoded.
    v_claims := convert_from(decode(translate(v_body, '-_', '+/')
                                    || repeat('=', (4 - length(v_body) % 4) % 4), 'base64'),
                             'UTF8')::jsonb;
    IF v_claims ->> 'iss' IS DISTINCT FROM v_issuer THEN
        PERFORM replaysafe._raise('RS004', 'access denied: the grant was issued for another '
                                  'database (a copy of this one, or another installation)');
    END IF;
    -- No grant lives longer than 7 days from its issue, which is not in the future (a grant
    -- made with a leaked key is bounded too).
    IF (v_claims ->> 'exp')::numeric - (v_claims ->> 'iat')::numeric > 604800
       OR (v_claims ->> 'iat')::numeric > extract(epoch FROM clock_timestamp()) + 300 THEN
        PERFORM replaysafe._raise('RS004', 'access denied: the grant''s lifetime is not one this '
                                  'installation issues');
    END IF;
    -- A heartbeat or report may come after its grant expired, within the longest lease.
    IF (v_claims ->> 'exp')::numeric
       <= extract(epoch FROM clock_timestamp()) - (CASE WHEN p_report THEN 604800 ELSE 0 END) THEN
        PERFORM replaysafe._raise('RS004', format('access denied: the grant expired at %s',
                                  to_timestamp((v_claims ->> 'exp')::numeric)));
    END IF;
    IF p_tenant_id IS NULL THEN  -- the grant's own tenant (use_grant, grant_in_force)
        p_tenant_id := v_claims ->> 'tid';
        SELECT g.generation INTO v_generation FROM replaysafe.grant_generations g
        WHERE g.tenant_id = p_tenant_id;
    ELSIF (v_claims ->> 'tid') IS DISTINCT FROM p_tenant_id COLLATE "C" THEN
        PERFORM replaysafe._raise('RS004', 'access denied: the grant is for another tenant');
    END IF;
    IF (v_claims ->> 'gen')::bigint IS DISTINCT FROM coalesce(v_generation, 0) THEN
        PERFORM replaysafe._raise('RS004', 'access denied: the tenant''s grants were revoked '
                                  'after this one was issued');
    END IF;
    SELECT c.role_name, c.tenant_id, c.restricted INTO v_role, v_bound, v_restricted
    FROM replaysafe._caller c;
    IF v_restricted THEN
        PERFORM replaysafe._raise('RS004', 'access denied: this role may not act for that tenant');
    END IF;
    IF v_bound COLLATE "C" <> p_tenant_id COLLATE "C" THEN
        PERFORM replaysafe._raise('RS004', 'access denied: this role is bound to another tenant '
                                  '(a bound session accepts grants for its own tenant only)');
    END IF;
    FOREACH v_duty IN ARRAY p_duties LOOP
        IF (v_claims -> 'dut') ? v_duty
           AND (pg_has_role(v_role, coalesce(to_regrole('replaysafe_' || v_duty)::oid, 0::oid),
                            'USAGE')
                OR to_regrole(quote_ident(v_role))::oid
                   = (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'replaysafe')) THEN
            RETURN v_claims;
        END IF;
    END LOOP;
    PERFORM replaysafe._raise('RS004', format(
        'access denied: this call needs the duty %s, which the grant and this role do not both give',
        array_to_string(p_duties, ' or ')));
    RETURN NULL;
END
$$;

-- A thread function's user under a grant: p_user_id must be the grant's user or omitted
-- (then it is the grant's user). A grant for the whole tenant leaves p_user_id as it is.
CREATE OR REPLACE FUNCTION replaysafe._grant_user(p_grant_user text, p_user_id text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_grant_user IS NULL THEN
        RETURN p_user_id;
    END IF;
    IF p_user_id IS NOT NULL AND p_user_id COLLATE "C" <> p_grant_user COLLATE "C" THEN
        PERFORM replaysafe._raise('RS004', 'access denied: the grant is for another user');
    END IF;
    RETURN p_grant_user;
END
$$;

-- Issue a grant (members of replaysafe_issuer, and the schema owner). An issuer bound to a
-- tenant issues for that tenant only.
CREATE OR REPLACE FUNCTION replaysafe.issue_tenant_grant(
    p_tenant_id text,
    p_ttl       interval DEFAULT '1 hour',
    p_user_id   text     DEFAULT NULL,
    p_duties    text[]   DEFAULT '{worker}')
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_scope  replaysafe._caller_scope;
    v_now    timestamptz := clock_timestamp();
    v_header text;
    v_inner  bytea;
    v_outer  bytea;
    v_issuer text;
    v_claims text;
    v_grant  text;
BEGIN
    SELECT * INTO v_scope FROM replaysafe._caller_scope;
    IF NOT v_scope.is_owner AND (replaysafe._in_restricted_operation() OR NOT pg_has_role(
           to_regrole(quote_ident(v_scope.role_name))::oid,
           coalesce(to_regrole('replaysafe_issuer')::oid, 0::oid), 'USAGE')) THEN
        PERFORM replaysafe._raise('RS004', 'access denied: only replaysafe_issuer members issue '
                                  'tenant grants');
    END IF;
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    PERFORM replaysafe._check_id('p_user_id', p_user_id, true);
    IF pg_collation_for(p_tenant_id) COLLATE "C" IS DISTINCT FROM '"default"' THEN
        PERFORM replaysafe._invalid('p_tenant_id', 'the arguments must not carry a COLLATE clause');
    END IF;
    IF v_scope.tenant_id COLLATE "C" <> p_tenant_id COLLATE "C" THEN
        PERFORM replaysafe._raise('RS004', 'access denied: this issuer is bound to another tenant');
    END IF;
    -- A copy (a template clone, a restore) shares the original's keys: until it has keys of
    -- its own it issues nothing the original could be handed.
    IF (SELECT i.database_oid FROM replaysafe.installation i)
       IS DISTINCT FROM (SELECT d.oid FROM pg_database d WHERE d.datname = current_database()) THEN
        PERFORM replaysafe._raise('RS004', 'access denied: this database is a copy of another (a '
                                  'template clone or a restore) and shares its grant keys: make '
                                  'it an installation of its own first, SELECT '
                                  'replaysafe.rotate_grant_key(p_keep_previous => false)');
    END IF;
    IF p_ttl IS NULL OR p_ttl <= interval '0' OR p_ttl > interval '7 days'
       OR date_part('month', p_ttl) <> 0 OR date_part('year', p_ttl) <> 0 THEN
        PERFORM replaysafe._invalid('p_ttl', 'must be a positive interval of at most 7 days '
                                    'without a month part');
    END IF;
    IF p_duties IS NULL OR cardinality(p_duties) = 0 OR array_position(p_duties, NULL) IS NOT NULL
       OR NOT p_duties <@ ARRAY['worker', 'operator', 'auditor'] THEN
        PERFORM replaysafe._invalid('p_duties', 'must name one or more of worker, operator, auditor');
    END IF;
    FOR i IN 1..2 LOOP
        SELECT k.header, k.inner_pad, k.outer_pad, k.issuer || ':' || current_database()
        INTO v_header, v_inner, v_outer, v_issuer
        FROM replaysafe.grant_keys k ORDER BY k.created_at DESC, k.key_id LIMIT 1;
        EXIT WHEN FOUND;
        PERFORM replaysafe._new_grant_key();  -- the first grant of the installation
    END LOOP;
    v_claims := replaysafe._base64url(convert_to(jsonb_strip_nulls(jsonb_build_object(
        'iss', v_issuer,
        'tid', p_tenant_id,
        'sub', p_user_id,
        'dut', (SELECT jsonb_agg(DISTINCT d ORDER BY d) FROM unnest(p_duties) d),
        'iat', round(extract(epoch FROM v_now), 3),
        -- the TTL in seconds (no month part): the same whatever the session's time zone
        'exp', round(extract(epoch FROM v_now), 3) + extract(epoch FROM p_ttl),
        'gen', coalesce((SELECT g.generation FROM replaysafe.grant_generations g
                         WHERE g.tenant_id = p_tenant_id), 0)))::text, 'UTF8'));
    v_grant := v_header || '.' || v_claims || '.' || replaysafe._base64url(sha256(
        v_outer || sha256(v_inner || convert_to(v_header || '.' || v_claims, 'UTF8'))));
    IF octet_length(v_grant) > 2048 THEN
        PERFORM replaysafe._invalid('p_tenant_id', format(
            'the grant would be %s bytes, over 2048: use shorter tenant and user ids',
            octet_length(v_grant)));
    END IF;
    RETURN v_grant;
END
$$;

-- Invalidate every grant issued for the tenant so far, from the next call on (the schema
-- owner, or an operator of that tenant: bound to it, or presenting a grant for it with the
-- operator duty). Returns the tenant's new generation.
CREATE OR REPLACE FUNCTION replaysafe.revoke_tenant_grants(p_tenant_id text, p_grant text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_generation bigint;
BEGIN
    PERFORM replaysafe._check_id('p_tenant_id', p_tenant_id);
    IF p_grant IS NOT NULL THEN
        PERFORM replaysafe._acts_with_grant(p_tenant_id, p_grant, '{operator}');
    ELSE
        IF NOT EXISTS (SELECT 1 FROM replaysafe._caller_scope c WHERE c.owner_or_operator) THEN
            PERFORM replaysafe._raise('RS004', 'access denied: only the schema owner and '
                                      'replaysafe_operator members revoke grants');
        END IF;
        PERFORM replaysafe._acts_for(p_tenant_id);
    END IF;
    PERFORM replaysafe._durable();
    INSERT INTO replaysafe.grant_generations AS g (tenant_id, generation, revoked_at)
    VALUES (p_tenant_id, 1, clock_timestamp())
    ON CONFLICT (tenant_id) DO UPDATE
    SET generation = g.generation + 1, revoked_at = excluded.revoked_at
    RETURNING g.generation INTO v_generation;
    RETURN v_generation;
END
$$;

-- Rotate the signing key (owner only): a new key signs from now on; the one it replaces
-- still verifies the grants it signed (they expire within 7 days), every older key is
-- dropped with its grants. p_keep_previous => false drops every other key at once (a key
-- that leaked, or a copy of the database that must stop sharing the original's keys):
-- every grant issued so far is refused from the next call on, and the database becomes an
-- installation of its own (a new installation id, recorded as made here).
CREATE OR REPLACE FUNCTION replaysafe.rotate_grant_key(p_keep_previous boolean DEFAULT true)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key_id text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM replaysafe._caller_scope c WHERE c.is_owner) THEN
        PERFORM replaysafe._raise('RS004', 'access denied: only the schema owner rotates the grant key');
    END IF;
    IF p_keep_previous IS NULL THEN
        PERFORM replaysafe._invalid('p_keep_previous', 'must not be NULL');
    END IF;
    PERFORM replaysafe._durable();
    LOCK TABLE replaysafe.grant_keys IN EXCLUSIVE MODE;
    DELETE FROM replaysafe.grant_keys k
    WHERE NOT p_keep_previous
       OR k.key_id <> (SELECT n.key_id FROM replaysafe.grant_keys n
                       ORDER BY n.created_at DESC, n.key_id LIMIT 1);
    IF NOT p_keep_previous THEN
        UPDATE replaysafe.installation i
        SET installation_id = gen_random_uuid(),
            database_oid = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database());
    END IF;
    v_key_id := replaysafe._new_grant_key();
    RETURN v_key_id;
END
$$;

-- Make the views honour a grant for the rest of the current transaction (the functions take
-- it as p_grant instead). What is put in force is the grant sealed to this transaction (its
-- backend and start time, MACed with the installation's token secret): a session-level SET
-- of the setting, or a seal copied into another transaction, is honoured by nobody, and
-- every read re-verifies the grant itself (grant_in_force).
CREATE OR REPLACE FUNCTION replaysafe.use_grant(p_grant text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_claims jsonb;
BEGIN
    IF p_grant IS NULL THEN
        PERFORM replaysafe._invalid('p_grant', 'must not be NULL');
    END IF;
    PERFORM replaysafe._acts_with_grant(NULL, p_grant, '{worker,operator,auditor}');
    PERFORM set_config('replaysafe.grant', replaysafe._grant_seal(p_grant) || '.' || p_grant, true);
END
$$;

CREATE OR REPLACE FUNCTION replaysafe._grant_seal(p_grant text)
RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT encode(sha256(i.token_secret || sha256(i.token_secret || convert_to(
        'grant:' || pg_backend_pid()::text || ':'
        || (extract(epoch FROM now()) * 1000000)::bigint::text || ':' || p_grant, 'UTF8'))), 'hex')
    FROM replaysafe.installation i
$$;

-- The grant use_grant put in force in this transaction, re-verified: its tenant and user
-- (no row when none is in force). The views call it (so every replaysafe role may).
CREATE OR REPLACE FUNCTION replaysafe.grant_in_force(OUT tenant_id text, OUT user_id text)
RETURNS SETOF record
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_value  text := current_setting('replaysafe.grant', true);
    v_grant  text;
    v_claims jsonb;
BEGIN
    IF v_value IS NULL OR v_value = '' OR length(v_value) < 66 THEN
        RETURN;
    END IF;
    v_grant := substr(v_value, 66);
    IF left(v_value, 64) COLLATE "C" <> replaysafe._grant_seal(v_grant) COLLATE "C" THEN
        RETURN;  -- not put in force by use_grant in this transaction
    END IF;
    v_claims := replaysafe._acts_with_grant(NULL, v_grant, '{worker,operator,auditor}');
    tenant_id := v_claims ->> 'tid';
    user_id := v_claims ->> 'sub';
    RETURN NEXT;
END
$$;
