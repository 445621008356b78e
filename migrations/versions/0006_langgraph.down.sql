-- Downgrade of 0006.
DROP FUNCTION replaysafe.langgraph_put(text, text, text, text, text, jsonb, jsonb, text[], text[], text[], bytea[], integer);
DROP FUNCTION replaysafe.langgraph_put_writes(text, text, text, text, text, text, integer[], text[], text[], bytea[], boolean);
DROP FUNCTION replaysafe.langgraph_get_tuple(text, text, text, text);
DROP FUNCTION replaysafe.langgraph_list(text, text, text, text, jsonb, text, integer);
DROP FUNCTION replaysafe.langgraph_delete_thread(text, text);
DROP FUNCTION replaysafe.langgraph_delete_for_runs(text, text[]);
DROP FUNCTION replaysafe.langgraph_copy_thread(text, text, text);
DROP FUNCTION replaysafe.langgraph_prune(text, text[], text);
DROP FUNCTION replaysafe._langgraph_collect_blobs(text, text, text);
DROP FUNCTION replaysafe._langgraph_head(text, text, text, text);
DROP FUNCTION replaysafe._langgraph_namespace(text, text, text, boolean);
DROP FUNCTION replaysafe._langgraph_check_args(text, text, text);
DROP TYPE replaysafe.langgraph_put_record;
DROP TYPE replaysafe.langgraph_checkpoint_record;
DROP TABLE replaysafe.langgraph_namespaces;
DROP TABLE replaysafe.langgraph_writes;
DROP TABLE replaysafe.langgraph_blobs;
DROP TABLE replaysafe.langgraph_checkpoints;
