-- Attempt tokens (docs/sql-ledger.md): every attempt a capability. The function set that
-- follows brings the new functions and views; this is what it cannot say.

-- The ledger's tables first, in the order workers lock them (no deadlock with a claim or
-- report in flight: the step waits for it).
LOCK TABLE replaysafe.actions, replaysafe.action_attempts IN ACCESS EXCLUSIVE MODE;

-- The secret attempt tokens are derived with (a claim-token retry answers the same token).
ALTER TABLE replaysafe.installation ADD COLUMN token_secret bytea CHECK (length(token_secret) >= 16);
UPDATE replaysafe.installation
SET token_secret = decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex');
ALTER TABLE replaysafe.installation ALTER COLUMN token_secret SET NOT NULL;

-- Claim tokens are kept as their sha256 only; attempts keep their token's sha256. The views
-- over every column of the tables are made again by the function set.
DROP VIEW replaysafe.actions_v, replaysafe.unresolved_actions, replaysafe._visible_actions;
ALTER TABLE replaysafe.actions ADD COLUMN claim_token_hash bytea, ADD COLUMN attempt_token_hash bytea;
UPDATE replaysafe.actions SET claim_token_hash = sha256(convert_to(claim_token, 'UTF8'))
WHERE claim_token IS NOT NULL;
ALTER TABLE replaysafe.action_attempts ADD COLUMN attempt_token_hash bytea;
-- An attempt running now under a claim token gets the attempt token that a retry with its
-- claim token will answer (derived as replaysafe._attempt_token derives it), so a worker
-- that asks again after the upgrade can report. Attempts running without a claim token have
-- none: no report or heartbeat of theirs is accepted, and their leases run out into
-- "unknown" (or "retryable") as a crashed worker's would. Stop workers before upgrading.
UPDATE replaysafe.actions x
SET attempt_token_hash = sha256(convert_to('rsat_' || encode(sha256(i.token_secret || sha256(
        i.token_secret || convert_to(length(x.tenant_id)::text || ':' || x.tenant_id
                                     || length(x.action_key)::text || ':' || x.action_key
                                     || x.attempt::text || ':' || x.claim_token, 'UTF8'))),
        'hex'), 'UTF8'))
FROM replaysafe.installation i
WHERE x.state = 'running' AND x.claim_token IS NOT NULL;
UPDATE replaysafe.action_attempts t SET attempt_token_hash = x.attempt_token_hash
FROM replaysafe.actions x
WHERE x.tenant_id = t.tenant_id AND x.action_key = t.action_key AND x.attempt = t.attempt
  AND x.attempt_token_hash IS NOT NULL;
ALTER TABLE replaysafe.actions DROP COLUMN claim_token;

ALTER TYPE replaysafe.claim_record ADD ATTRIBUTE attempt_token text;

-- New signatures: the token after the attempt.
DROP FUNCTION replaysafe.heartbeat_action(text, text, integer, interval, timestamptz);
DROP FUNCTION replaysafe.complete_action(text, text, integer, jsonb, text, timestamptz);
DROP FUNCTION replaysafe.fail_action(text, text, integer, jsonb, boolean, timestamptz);
DROP FUNCTION replaysafe.mark_action_unknown(text, text, integer, jsonb, timestamptz);
DROP FUNCTION replaysafe._report(text, text, integer, replaysafe.action_state, jsonb, jsonb, text,
                                 timestamptz);
