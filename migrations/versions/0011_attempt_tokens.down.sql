-- Back to 0010: no attempt tokens. Claim tokens cannot be had back from their hashes: a claim
-- in flight cannot be asked for again by its token (it runs out into "unknown" if its answer
-- was lost). Stop workers before downgrading. The ledger's tables are locked first, in the
-- order workers lock them (a claim or report in flight is waited for, never deadlocked).
LOCK TABLE replaysafe.actions, replaysafe.action_attempts IN ACCESS EXCLUSIVE MODE;
DROP FUNCTION replaysafe.heartbeat_action(text, text, integer, text, interval, timestamptz);
DROP FUNCTION replaysafe.complete_action(text, text, integer, text, jsonb, text, timestamptz);
DROP FUNCTION replaysafe.fail_action(text, text, integer, text, jsonb, boolean, timestamptz);
DROP FUNCTION replaysafe.mark_action_unknown(text, text, integer, text, jsonb, timestamptz);
DROP FUNCTION replaysafe._report(text, text, integer, text, replaysafe.action_state, jsonb, jsonb,
                                 text, timestamptz);
DROP FUNCTION replaysafe._attempt_token(text, text, integer, text);
DROP FUNCTION replaysafe._check_attempt_token(text, text, integer, bytea);
DROP FUNCTION replaysafe._transaction_began(timestamptz);

DROP VIEW replaysafe.actions_v, replaysafe.unresolved_actions, replaysafe._visible_actions,
    replaysafe.action_attempts_v, replaysafe.multi_effect_actions,
    replaysafe._visible_first_attempts, replaysafe._first_attempts, replaysafe._visible_attempts;
ALTER TABLE replaysafe.action_attempts DROP COLUMN attempt_token_hash;
ALTER TABLE replaysafe.actions ADD COLUMN claim_token text;
ALTER TABLE replaysafe.actions DROP COLUMN claim_token_hash, DROP COLUMN attempt_token_hash;
ALTER TYPE replaysafe.claim_record DROP ATTRIBUTE attempt_token;
ALTER TABLE replaysafe.installation DROP COLUMN token_secret;
