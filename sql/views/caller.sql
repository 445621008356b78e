-- Who is calling: the caller's role and tenant, for the functions (_caller, _caller_scope)
-- and for the views (_reader). See sql/functions/tenancy.sql.

CREATE OR REPLACE VIEW replaysafe._caller AS
SELECT r.role_name,
       CASE WHEN p.restricted THEN NULL ELSE replaysafe._binding() END AS tenant_id,  -- see them
       p.restricted
FROM (SELECT CASE WHEN current_setting('role') = 'none' THEN session_user::text
                  ELSE current_setting('role') END AS role_name) r,
     LATERAL (SELECT replaysafe._in_restricted_operation() AS restricted) p;

-- The caller's wider rights, for the functions (never needed on a bound caller's hot path).
-- It is the owner when it is the schema owner or an explicit member of it (pg_auth_members:
-- unlike pg_has_role(), a superuser is not a member of every role, so an unbound superuser
-- that is not the schema owner acts for no tenant), and not inside a security-restricted
-- operation; unbound, the owner acts for every tenant, and so does a session whose current
-- role or login bind_role_to_all_tenants() named (by OID and name: a renamed role, or a
-- node where another role has that OID, fails closed); the owner and replaysafe_operator
-- members may pass a p_now far from the clock. (No parameters, no pg_roles: one cached plan,
-- syscache probes.)
CREATE OR REPLACE VIEW replaysafe._caller_scope AS
WITH RECURSIVE
    owners(roleid) AS (
        SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'replaysafe'
        UNION
        SELECT a.member FROM pg_auth_members a JOIN owners o ON a.roleid = o.roleid),
    operators(roleid) AS (
        SELECT to_regrole('replaysafe_operator')::oid
        UNION
        SELECT a.member FROM pg_auth_members a JOIN operators o ON a.roleid = o.roleid),
    me AS (
        SELECT c.role_name, c.tenant_id, to_regrole(quote_ident(c.role_name))::oid AS role_oid,
               replaysafe._in_restricted_operation() AS restricted
        FROM replaysafe._caller c)
SELECT me.role_name, me.tenant_id, s.is_owner,
       me.tenant_id IS NULL AND (s.is_owner OR (NOT me.restricted AND EXISTS (
           SELECT 1 FROM replaysafe.all_tenant_roles a
           WHERE (a.role_oid, a.role_name) IN ((me.role_oid, me.role_name),
                                               (to_regrole(quote_ident(session_user::text))::oid,
                                                session_user::text)))))
           AS acts_for_all,
       s.is_owner OR (NOT me.restricted AND me.role_oid IN (SELECT o.roleid FROM operators o))
           AS owner_or_operator
FROM me
CROSS JOIN LATERAL (SELECT NOT me.restricted AND me.role_oid IN (SELECT o.roleid FROM owners o)
                        AS is_owner) s;

-- Who is reading a view: a view does not switch user, so current_user is the reader (in a
-- security-restricted operation, the code's owner, not the session's login). Its tenant is
-- its binding, else its login's, else that of the grant use_grant put in force in this
-- transaction (grant_in_force; its user, if it names one, limits threads_v to that user's
-- threads); unbound and without a grant, it reads every tenant when it is a member of the
-- schema owner or bind_role_to_all_tenants() named it (or its login, as for the login's
-- binding), and nothing otherwise, whatever its groups. (Pure SQL: a view may call no
-- private helper.)
CREATE OR REPLACE VIEW replaysafe._reader AS
SELECT coalesce(r.tenant_id, g.tenant_id) AS tenant_id,
       CASE WHEN r.tenant_id IS NOT NULL OR g.tenant_id IS NOT NULL THEN false
            -- A group role itself never reads every tenant: code a tenant made it own (after
            -- SET ROLE) may run in anyone's session.
            WHEN current_user IN ('replaysafe_worker', 'replaysafe_operator', 'replaysafe_auditor',
                                  'replaysafe_issuer')
                THEN false
            ELSE pg_has_role(current_user, n.nspowner, 'USAGE')
                 -- Only for the session's own current role (or its login), never for code
                 -- an all-tenant role owns running in someone else's session.
                 OR (current_user::text = CASE WHEN current_setting('role') = 'none'
                                               THEN session_user::text
                                               ELSE current_setting('role') END
                     AND EXISTS (SELECT 1 FROM replaysafe.all_tenant_roles a
                                 WHERE (a.role_oid = to_regrole(quote_ident(current_user))::oid
                                        AND a.role_name = current_user::text)
                                    OR (a.role_oid = to_regrole(quote_ident(session_user))::oid
                                        AND a.role_name = session_user::text)))
            END AS reads_all,
       g.user_id
FROM (SELECT coalesce(
          (SELECT b.tenant_id FROM replaysafe.role_bindings b
           WHERE b.role_oid = to_regrole(quote_ident(current_user))::oid),
          -- The login's binding only when current_user is the session's own current role
          -- (SET ROLE never widens): not for code of another owner running in this session
          -- (an index expression analyzed here, a definer function).
          (SELECT b.tenant_id FROM replaysafe.role_bindings b
           WHERE b.role_oid = to_regrole(quote_ident(session_user))::oid
             AND current_user::text = CASE WHEN current_setting('role') = 'none'
                                           THEN session_user::text
                                           ELSE current_setting('role') END))
          AS tenant_id) r
     -- Only for the session's own current role, as the login's binding above.
     LEFT JOIN LATERAL (SELECT f.tenant_id, f.user_id FROM replaysafe.grant_in_force() f
                        WHERE current_user::text = CASE WHEN current_setting('role') = 'none'
                                                        THEN session_user::text
                                                        ELSE current_setting('role') END) g
            ON true,
     pg_namespace n
WHERE n.nspname = 'replaysafe'
  -- Always true, and parallel unsafe: no query through the views starts parallel workers.
  -- They cost ~15 ms of start-up at 1 M actions and more, against ~2 ms for a tenant's rows,
  -- and the planner, counting every tenant's rows in the readers-of-everything branch,
  -- would start them for any aggregate over a tenant.
  AND pg_current_xact_id_if_assigned() IS DISTINCT FROM '0'::xid8;
