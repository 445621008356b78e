-- ---------------------------------------------------------------------------------------
-- Audit views: owner-rights (they read the private tables) and security_barrier (a reader's
-- own functions in a WHERE clause never see rows the filter removes). Each shows the
-- reader's tenant only (every tenant to the unbound owner and unbound auditors), or the
-- tenant of the grant use_grant put in force.
--
-- The private _visible_* views do the filtering as a UNION ALL: the reader's tenant as an
-- index condition (a reader's own conditions join it, so no row of another tenant is ever
-- read: EXPLAIN ANALYZE cannot confirm another tenant's key by "Rows Removed by Filter"),
-- and every row behind a one-time test of reads_all, never executed for anyone else.
-- ---------------------------------------------------------------------------------------

-- The first attempt of an action has no row in action_attempts while the action row says
-- all there is to say about it: a claim writes one row, its report updates one row (the
-- extra row cost a third of a claim+complete's WAL). Its row is written, from the action
-- row, by _keep_first_attempt before anything but that attempt's own report changes the
-- action (expiry, a second attempt, an operator's resolve or reopen, a late or superseded
-- report); until then the audit view shows the row derived here (action_attempts_v).
CREATE OR REPLACE VIEW replaysafe._first_attempts AS
SELECT x.tenant_id, x.action_key, x.attempt, x.worker_id, x.created_at AS claimed_at,
       CASE WHEN x.state <> 'running' THEN x.updated_at END AS ended_at,
       CASE WHEN x.state <> 'running' THEN x.state END AS outcome,
       false AS superseded, x.error, x.result, x.provider_reference, x.attempt_token_hash
FROM replaysafe.actions x
WHERE x.attempt = 1
  AND NOT EXISTS (SELECT 1 FROM replaysafe.action_attempts t
                  WHERE t.tenant_id = x.tenant_id AND t.action_key = x.action_key
                    AND t.attempt = 1);

CREATE OR REPLACE VIEW replaysafe._visible_actions WITH (security_barrier = true) AS
SELECT x.* FROM replaysafe.actions x
WHERE x.tenant_id = (SELECT r.tenant_id FROM replaysafe._reader r)
UNION ALL
SELECT x.* FROM replaysafe.actions x
WHERE (SELECT r.reads_all FROM replaysafe._reader r);

CREATE OR REPLACE VIEW replaysafe._visible_attempts WITH (security_barrier = true) AS
SELECT t.* FROM replaysafe.action_attempts t
WHERE t.tenant_id = (SELECT r.tenant_id FROM replaysafe._reader r)
UNION ALL
SELECT t.* FROM replaysafe.action_attempts t
WHERE (SELECT r.reads_all FROM replaysafe._reader r);

-- Under a grant that names a user, that user's threads only.
CREATE OR REPLACE VIEW replaysafe._visible_threads WITH (security_barrier = true) AS
SELECT t.* FROM replaysafe.threads t
WHERE t.tenant_id = (SELECT r.tenant_id FROM replaysafe._reader r)
  AND ((SELECT r.user_id FROM replaysafe._reader r) IS NULL
       OR t.user_id = (SELECT r.user_id FROM replaysafe._reader r))
UNION ALL
SELECT t.* FROM replaysafe.threads t
WHERE (SELECT r.reads_all FROM replaysafe._reader r);

CREATE OR REPLACE VIEW replaysafe.actions_v WITH (security_barrier = true) AS
SELECT x.tenant_id, x.action_key, x.thread_id, x.operation, x.state, x.attempt, x.on_expired,
       x.idempotency_key, x.request, x.result, x.error, x.provider_reference, x.lease_expires_at,
       x.created_at, x.updated_at, x.completed_at, x.worker_id, x.resolution_note, x.resolved_at
FROM replaysafe._visible_actions x;

-- First attempts without a row of their own (_first_attempts), filtered as above.
CREATE OR REPLACE VIEW replaysafe._visible_first_attempts WITH (security_barrier = true) AS
SELECT f.* FROM replaysafe._first_attempts f
WHERE f.tenant_id = (SELECT r.tenant_id FROM replaysafe._reader r)
UNION ALL
SELECT f.* FROM replaysafe._first_attempts f
WHERE (SELECT r.reads_all FROM replaysafe._reader r);

CREATE OR REPLACE VIEW replaysafe.action_attempts_v WITH (security_barrier = true) AS
SELECT t.tenant_id, t.action_key, t.attempt, t.worker_id, t.claimed_at, t.ended_at, t.outcome,
       t.superseded, t.error, t.result, t.provider_reference
FROM replaysafe._visible_attempts t
UNION ALL
SELECT f.tenant_id, f.action_key, f.attempt, f.worker_id, f.claimed_at, f.ended_at, f.outcome,
       f.superseded, f.error, f.result, f.provider_reference
FROM replaysafe._visible_first_attempts f;

CREATE OR REPLACE VIEW replaysafe.unresolved_actions WITH (security_barrier = true) AS
SELECT x.tenant_id, x.action_key, x.operation, x.state, x.lease_expires_at,
       now() - CASE WHEN x.state = 'running' THEN x.lease_expires_at ELSE x.updated_at END AS age,
       x.thread_id, x.created_at, x.updated_at
FROM replaysafe._visible_actions x
WHERE x.state = 'unknown' OR (x.state = 'running' AND x.lease_expires_at <= now());

CREATE OR REPLACE VIEW replaysafe.multi_effect_actions WITH (security_barrier = true) AS
SELECT m.tenant_id, m.action_key, a.operation, m.successful_attempts
FROM (SELECT t.tenant_id, t.action_key, count(*) AS successful_attempts
      FROM replaysafe._visible_attempts t
      WHERE t.outcome = 'succeeded'
      GROUP BY t.tenant_id, t.action_key
      HAVING count(*) > 1) m
-- One primary-key lookup per multi-effect action (LIMIT keeps the planner from a hash join
-- that reads every tenant's actions).
CROSS JOIN LATERAL (SELECT x.operation FROM replaysafe.actions x
                    WHERE x.tenant_id = m.tenant_id AND x.action_key = m.action_key LIMIT 1) a;

-- Ownership by user id is enforced by the functions; the view shows every thread of the
-- reader's tenant (under a grant that names a user, that user's threads).
CREATE OR REPLACE VIEW replaysafe.threads_v WITH (security_barrier = true) AS
SELECT t.tenant_id, t.thread_id, t.user_id, t.version, t.deleted, v.state, t.history_limit,
       t.created_at, t.updated_at
FROM replaysafe._visible_threads t
LEFT JOIN replaysafe.thread_versions v
       ON v.tenant_id = t.tenant_id AND v.thread_id = t.thread_id AND v.version = t.version;
