-- replaysafe: the action ledger, versioned thread state, tenant bindings and the trust
-- boundary. This tree (sql/) is the desired state, by concern: tables/ (what revisions
-- create and change: tables, indexes, row types), functions/, views/ and grants.sql (the
-- function set, applied whole by the migration runner after each revision's DDL).
--
-- The trust boundary (docs/isolation.md): the functions are the only way in. They are
-- SECURITY DEFINER, owned by the schema owner, and every one pins its search_path to
-- pg_catalog, pg_temp, so nothing in a body resolves through the caller's search_path (a
-- hostile function, operator or type in public or pg_temp changes nothing). No group role
-- holds any privilege on a table or on a private helper (a name starting with "_").
-- Row-level security is enabled with no policy on every table: should a privilege on a
-- table ever be granted by mistake, that role still reads and writes nothing (the owner,
-- which the functions run as, is not subject to it: it costs them nothing).
--
-- Tenancy: the schema, the role bindings and the installation's secret.

CREATE SCHEMA IF NOT EXISTS replaysafe;
COMMENT ON SCHEMA replaysafe IS 'replaysafe_pg: action ledger and versioned thread state';

-- Bound by role OID: a renamed role keeps its tenant, a dropped and re-created one (same
-- name, new OID) gets none. role_name is the name at binding time, for people.
CREATE TABLE replaysafe.role_bindings (
    role_name  text NOT NULL,
    tenant_id  text NOT NULL,
    bound_at   timestamptz NOT NULL DEFAULT now(),
    role_oid   oid NOT NULL,
    CONSTRAINT role_bindings_pkey PRIMARY KEY (role_oid)
);

-- The installation's secrets. key_secret salts the derived idempotency keys (and so the
-- wake-up payloads), so nobody who lacks it can confirm a guessed (tenant, key) pair;
-- token_secret derives the attempt token of a claim made with a claim token, so that a
-- claim-token retry can answer the same token again while only its hash is stored.
-- installation_id names this installation in the tenant grants it issues (with the name of
-- the database, so a template clone refuses the original's grants); database_oid is the
-- database it was created in (doctor reports a copy: a template clone or a restore).
CREATE TABLE replaysafe.installation (
    id              boolean PRIMARY KEY DEFAULT true CHECK (id),
    key_secret      bytea NOT NULL CHECK (length(key_secret) >= 16),
    created_at      timestamptz NOT NULL DEFAULT now(),
    token_secret    bytea NOT NULL CHECK (length(token_secret) >= 16),
    installation_id uuid NOT NULL DEFAULT gen_random_uuid(),
    database_oid    oid NOT NULL
);
-- 244 random bits each from the server's strong random source (no extension needed).
INSERT INTO replaysafe.installation (key_secret, token_secret, database_oid)
SELECT decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'),
       decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'),
       d.oid
FROM pg_database d WHERE d.datname = current_database();

-- The keys tenant grants are signed with (HMAC-SHA256), not the secrets above: only the
-- owner reads them. header is the grant's first part for this key, base64url (it pins the
-- algorithm and names the key: a grant is looked up by it); issuer names the installation
-- that made the key (a grant names it and the database); inner_pad and outer_pad are the
-- key XOR HMAC's ipad and opad, so a verification costs two sha256() calls. The newest key
-- signs; rotate_grant_key() makes a new one and keeps the previous one verifying.
CREATE TABLE replaysafe.grant_keys (
    header     text PRIMARY KEY,
    key_id     text NOT NULL,
    issuer     text NOT NULL,
    inner_pad  bytea NOT NULL CHECK (length(inner_pad) = 64),
    outer_pad  bytea NOT NULL CHECK (length(outer_pad) = 64),
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- A tenant's revocation generation: a grant names the generation it was issued under and is
-- valid only while it is current (revoke_tenant_grants moves it on). No row: generation 0.
CREATE TABLE replaysafe.grant_generations (
    tenant_id  text PRIMARY KEY,
    generation bigint NOT NULL CHECK (generation > 0),
    revoked_at timestamptz NOT NULL
);

-- Roles that act for every tenant of this installation, within their duties (their group
-- roles): an auditor that reads all, a central reconciler. Set by bind_role_to_all_tenants();
-- a role's tenant binding (role_bindings) is removed when it gets this one, and the other way
-- round. Nobody else reads or acts for every tenant but the schema owner.
CREATE TABLE replaysafe.all_tenant_roles (
    role_oid  oid PRIMARY KEY,
    role_name text NOT NULL,
    bound_at  timestamptz NOT NULL DEFAULT now()
);

-- The size limits (docs/limits.md), one row, owner-only: the functions refuse (RS005) a
-- value over its limit before they write anything; a result over its limit is recorded
-- "unknown" instead (the effect happened). *_bytes are stored sizes (pg_column_size of the
-- value); number_digits bounds the text form of every number in a JSON value (jsonb prints
-- numbers in full); langgraph_key_bytes bounds the key columns of one LangGraph row together.
-- Without its row no limit is enforced.
CREATE TABLE replaysafe.limits (
    id                       boolean PRIMARY KEY DEFAULT true CHECK (id),
    request_bytes            bigint NOT NULL DEFAULT 1048576 CHECK (request_bytes > 0),
    result_bytes             bigint NOT NULL DEFAULT 1048576 CHECK (result_bytes > 0),
    error_bytes              bigint NOT NULL DEFAULT 1048576 CHECK (error_bytes > 0),
    provider_reference_bytes bigint NOT NULL DEFAULT 1048576 CHECK (provider_reference_bytes > 0),
    thread_state_bytes       bigint NOT NULL DEFAULT 33554432 CHECK (thread_state_bytes > 0),
    checkpoint_bytes         bigint NOT NULL DEFAULT 33554432 CHECK (checkpoint_bytes > 0),
    blob_bytes               bigint NOT NULL DEFAULT 33554432 CHECK (blob_bytes > 0),
    pending_write_bytes      bigint NOT NULL DEFAULT 33554432 CHECK (pending_write_bytes > 0),
    number_digits            bigint NOT NULL DEFAULT 1000 CHECK (number_digits > 0),
    langgraph_key_bytes      bigint NOT NULL DEFAULT 2000 CHECK (langgraph_key_bytes > 0)
);
INSERT INTO replaysafe.limits DEFAULT VALUES;

ALTER TABLE replaysafe.role_bindings ENABLE ROW LEVEL SECURITY;
ALTER TABLE replaysafe.installation ENABLE ROW LEVEL SECURITY;
ALTER TABLE replaysafe.grant_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE replaysafe.grant_generations ENABLE ROW LEVEL SECURITY;
ALTER TABLE replaysafe.all_tenant_roles ENABLE ROW LEVEL SECURITY;
ALTER TABLE replaysafe.limits ENABLE ROW LEVEL SECURITY;
