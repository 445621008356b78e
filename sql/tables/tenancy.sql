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
CREATE TABLE replaysafe.installation (
    id           boolean PRIMARY KEY DEFAULT true CHECK (id),
    key_secret   bytea NOT NULL CHECK (length(key_secret) >= 16),
    created_at   timestamptz NOT NULL DEFAULT now(),
    token_secret bytea NOT NULL CHECK (length(token_secret) >= 16)
);
-- 244 random bits each from the server's strong random source (no extension needed).
INSERT INTO replaysafe.installation (key_secret, token_secret)
VALUES (decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'),
        decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'));

ALTER TABLE replaysafe.role_bindings ENABLE ROW LEVEL SECURITY;
ALTER TABLE replaysafe.installation ENABLE ROW LEVEL SECURITY;
