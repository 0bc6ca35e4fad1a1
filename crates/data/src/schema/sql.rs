//! The fixed SQL warden runs in every app database, as the admin. Nothing here is made from
//! input: names and ids reach PostgreSQL as quoted identifiers or bound parameters elsewhere.

/// Tables, functions and the trigger function of the `warden` schema (idempotent).
///
/// `session_label()` and friends key on `session_user`, which neither `SET ROLE` (refused:
/// the roles are members of nothing) nor a SECURITY DEFINER function of the app changes. The
/// functions are SECURITY DEFINER over tables no app role may read, with `search_path` pinned
/// so an app's objects cannot stand in for catalog ones. A label absent from the lattice has
/// `level` NULL: it dominates nothing and nothing dominates it (fail closed).
pub const WARDEN_SCHEMA: &str = r#"
CREATE SCHEMA IF NOT EXISTS warden;
REVOKE ALL ON SCHEMA warden FROM PUBLIC;
GRANT USAGE ON SCHEMA warden TO PUBLIC;
CREATE TABLE IF NOT EXISTS warden.labels (
    id serial PRIMARY KEY,
    label text NOT NULL UNIQUE,
    level int,
    categories text[] NOT NULL
);
CREATE TABLE IF NOT EXISTS warden.roles (
    role name PRIMARY KEY,
    label_id int NOT NULL REFERENCES warden.labels (id),
    owner text
);
CREATE TABLE IF NOT EXISTS warden.settings (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    declassify_to int REFERENCES warden.labels (id)
);
INSERT INTO warden.settings (one) VALUES (true) ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS warden.declassified (
    at timestamptz NOT NULL DEFAULT now(),
    role name NOT NULL,
    table_name text NOT NULL,
    from_label int NOT NULL,
    to_label int NOT NULL
);
REVOKE ALL ON ALL TABLES IN SCHEMA warden FROM PUBLIC;

CREATE OR REPLACE FUNCTION warden.session_label() RETURNS int
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT label_id FROM warden.roles WHERE role = session_user
$$;

CREATE OR REPLACE FUNCTION warden.session_owner() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT owner FROM warden.roles WHERE role = session_user
$$;

CREATE OR REPLACE FUNCTION warden.readable() RETURNS int[]
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(array_agg(l.id), '{}')
    FROM warden.roles r
    JOIN warden.labels me ON me.id = r.label_id
    JOIN warden.labels l ON l.level <= me.level AND l.categories <@ me.categories
    WHERE r.role = session_user
$$;

CREATE OR REPLACE FUNCTION warden.writable() RETURNS int[]
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(array_agg(x), '{}') FROM (
        SELECT warden.session_label() AS x
        UNION
        SELECT s.declassify_to FROM warden.settings s
        WHERE s.declassify_to = ANY (warden.readable())
    ) w WHERE x IS NOT NULL
$$;

CREATE OR REPLACE FUNCTION warden.stamp() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    mine int := warden.session_label();
BEGIN
    IF mine IS NULL THEN
        RAISE EXCEPTION 'warden: role % has no label and cannot write rows', session_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.warden_label IS NULL OR NEW.warden_label <> mine
       AND NOT (NEW.warden_label = ANY (warden.writable())) THEN
        NEW.warden_label := mine;
    END IF;
    NEW.warden_owner := warden.session_owner();
    IF NEW.warden_label <> mine THEN
        INSERT INTO warden.declassified (role, table_name, from_label, to_label)
        VALUES (session_user, TG_TABLE_NAME, mine, NEW.warden_label);
    END IF;
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION warden.stamp() FROM PUBLIC;
"#;

/// Functions no app role may execute in its database: advisory locks and `pg_notify` (covert
/// channels between labels), large objects (storage outside row security), file and server
/// functions (defence in depth: most are already superuser-only), and the activity views'
/// functions (another session's `application_name` is otherwise visible to every role).
pub const REVOKE_FUNCTIONS: &str = r#"
DO $$
DECLARE f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = 'pg_catalog'::regnamespace
          AND (p.proname LIKE 'pg\_advisory%' OR p.proname LIKE 'pg\_try\_advisory%'
               OR p.proname LIKE 'lo\_%' OR p.proname IN ('loread', 'lowrite')
               OR p.proname IN ('pg_notify', 'pg_listening_channels',
                   'pg_notification_queue_usage')
               OR p.proname LIKE 'pg\_read\_%file%' OR p.proname IN ('pg_ls_dir', 'pg_stat_file')
               OR p.proname IN ('pg_stat_get_activity', 'pg_lock_status',
                   'pg_blocking_pids', 'pg_safe_snapshot_blocking_pids'))
    LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
REVOKE SELECT ON pg_catalog.pg_stat_activity, pg_catalog.pg_locks FROM PUBLIC;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
"#;

/// The policies of a labelled table, after `{t}` is replaced by its quoted name. Each is
/// dropped and made again at every labelling, so a table's policies are always these.
pub const POLICIES: &str = r#"
ALTER TABLE {t} ENABLE ROW LEVEL SECURITY;
ALTER TABLE {t} FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS warden_select ON {t};
DROP POLICY IF EXISTS warden_insert ON {t};
DROP POLICY IF EXISTS warden_update ON {t};
DROP POLICY IF EXISTS warden_delete ON {t};
CREATE POLICY warden_select ON {t} FOR SELECT
    USING (warden_label = ANY ((SELECT warden.readable())::int[]) AND {owner});
CREATE POLICY warden_insert ON {t} FOR INSERT
    WITH CHECK (warden_label = ANY ((SELECT warden.writable())::int[]) AND {owner});
CREATE POLICY warden_update ON {t} FOR UPDATE
    USING (warden_label = (SELECT warden.session_label()) AND {owner})
    WITH CHECK (warden_label = ANY ((SELECT warden.writable())::int[]) AND {owner});
CREATE POLICY warden_delete ON {t} FOR DELETE
    USING (warden_label = (SELECT warden.session_label()) AND {owner});
CREATE OR REPLACE TRIGGER warden_stamp BEFORE INSERT OR UPDATE ON {t}
    FOR EACH ROW EXECUTE FUNCTION warden.stamp();
"#;

/// The owner rule of every policy: `per_user` roles reach only their user's rows.
pub const OWNER_RULE: &str = "((SELECT warden.session_owner()) IS NULL \
     OR warden_owner = (SELECT warden.session_owner()))";
