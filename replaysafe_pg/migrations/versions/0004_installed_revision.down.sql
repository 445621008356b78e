-- Downgrade of 0004.
DROP FUNCTION replaysafe.installed_revision();
