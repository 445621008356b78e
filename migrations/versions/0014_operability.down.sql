-- Back to 0013: no metrics(), no purge_threads(), nor what they read.

DROP FUNCTION replaysafe.metrics(boolean, timestamptz, text);
DROP FUNCTION replaysafe.purge_threads(interval, integer, timestamptz, text, text);
DROP FUNCTION replaysafe._estimate(regclass, text);
DROP FUNCTION replaysafe._langgraph_hold_thread(text, text);
DROP FUNCTION replaysafe._check_purge(interval, integer, timestamptz, text, text);

DROP INDEX replaysafe.actions_retryable_idx;
DROP INDEX replaysafe.action_attempts_superseded_success_idx;
ALTER TABLE replaysafe.langgraph_namespaces DROP COLUMN written_at;
DROP TABLE replaysafe.langgraph_threads;
