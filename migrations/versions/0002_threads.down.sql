-- Downgrade of 0002: remove the thread state objects; the ledger (0001) stays.
DROP VIEW IF EXISTS replaysafe.threads_v;
DROP FUNCTION IF EXISTS
    replaysafe.read_thread(text, text, text),
    replaysafe.write_thread(text, text, bigint, jsonb, text, integer),
    replaysafe.thread_history(text, text, text, integer),
    replaysafe.delete_thread(text, text, text),
    replaysafe._thread_args_fail(text, text, text),
    replaysafe._tenant_or_deny(text),
    replaysafe._thread_deny(),
    replaysafe._check_thread_args(text, text, text),
    replaysafe._stale_thread(text, bigint, bigint),
    replaysafe._deny_thread();
DROP TABLE IF EXISTS replaysafe.thread_versions, replaysafe.threads;
DROP TYPE IF EXISTS replaysafe.thread_record;
