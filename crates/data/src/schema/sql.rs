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

-- What a declassifier's instance writes into `warden_label` to put a row at the label its app
-- was granted (`INSERT ... (body, warden_label) VALUES ($1, warden.declassify_to())`): that
-- label's id, or an error where the app is not a declassifier to a label this session
-- dominates, so a write meant to go down never lands silently at the writer's own label.
CREATE OR REPLACE FUNCTION warden.declassify_to() RETURNS int
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    target int;
BEGIN
    SELECT s.declassify_to INTO target FROM warden.settings s;
    IF target IS NULL OR NOT (target = ANY (warden.writable())) THEN
        RAISE EXCEPTION 'warden: this app is not a declassifier to a label this instance dominates, so it cannot write below its own label'
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'an admin marks an app a declassifier: warden apps update APP --declassify-to LABEL';
    END IF;
    RETURN target;
END
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

-- Labelled tables and their policies' fingerprint at labelling, which the guard compares.
CREATE TABLE IF NOT EXISTS warden.labelled (relid oid PRIMARY KEY, policies text NOT NULL);
REVOKE ALL ON warden.labelled FROM PUBLIC;

CREATE OR REPLACE FUNCTION warden.fingerprint(t oid) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(string_agg(concat_ws(':', polname, polcmd, polpermissive, polroles::text,
        pg_get_expr(polqual, polrelid), pg_get_expr(polwithcheck, polrelid)), ';'
        ORDER BY polname), '')
    FROM pg_policy WHERE polrelid = t
$$;
REVOKE ALL ON FUNCTION warden.fingerprint(oid) FROM PUBLIC;

-- The first unique index or exclusion constraint of `t` not scoped by label: one whose key
-- columns (not its INCLUDE ones) lack warden_label, other than a one-column primary key filled
-- by a sequence, an identity or gen_random_uuid() (which label roles cannot write).
CREATE OR REPLACE FUNCTION warden.unscoped_key(t oid) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT i.indexrelid::regclass::text FROM pg_index i
    WHERE i.indrelid = t AND (i.indisunique OR i.indisexclusion)
      AND NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = i.indrelid
          AND a.attname = 'warden_label'
          AND a.attnum = ANY ((i.indkey::int2[])[0:i.indnkeyatts - 1]))
      AND NOT (i.indisprimary AND i.indnkeyatts = 1 AND EXISTS (
          SELECT 1 FROM pg_attribute a
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
          WHERE a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
            AND (a.attidentity <> ''
                 OR pg_get_expr(d.adbin, d.adrelid) LIKE 'nextval(%'
                 OR pg_get_expr(d.adbin, d.adrelid) = 'gen_random_uuid()')))
    ORDER BY 1 LIMIT 1
$$;
REVOKE ALL ON FUNCTION warden.unscoped_key(oid) FROM PUBLIC;

-- What DDL evaluates over a table's rows (outside row security): CHECK and exclusion
-- constraints (and whether validated), expression and partial indexes. Recorded at labelling;
-- the guard refuses a change to it on a labelled table that holds rows.
ALTER TABLE warden.labelled ADD COLUMN IF NOT EXISTS evaluated text NOT NULL DEFAULT '';
CREATE OR REPLACE FUNCTION warden.evaluated(t oid) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(string_agg(x, ';' ORDER BY x), '') FROM (
        SELECT concat_ws(':', 'con', conname, contype, convalidated) AS x FROM pg_constraint
        WHERE conrelid = t AND contype IN ('c', 'x')
        UNION ALL
        SELECT concat_ws(':', 'idx', indexrelid::regclass::text) FROM pg_index
        WHERE indrelid = t AND (indexprs IS NOT NULL OR indpred IS NOT NULL)
    ) e
$$;
REVOKE ALL ON FUNCTION warden.evaluated(oid) FROM PUBLIC;

-- The app's code that maintenance would run as the owner over every row, outside row
-- security: REINDEX, ANALYZE (autovacuum's too), CLUSTER and VACUUM FULL evaluate index
-- expressions and predicates, constraints, statistics and partition keys without checking
-- them against any label. Any of those that calls a function (directly or through an
-- operator) not built in or warden's, and any expression statistics (ANALYZE evaluates them
-- over rows no check saw; a built-in cast's error would carry a value out), is refused.
-- One row per offence: the table (or domain), the object, why.
CREATE OR REPLACE FUNCTION warden.foreign_code() RETURNS TABLE (tbl text, obj text, why text)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce((SELECT r.relname::text FROM pg_class r WHERE r.oid = x.rel), x.other),
        pg_describe_object(x.classid, x.objid, 0), x.why
    FROM (
        SELECT 'pg_statistic_ext'::regclass AS classid, s.oid AS objid, s.stxrelid AS rel,
            NULL::text AS other,
            'has expressions, which ANALYZE would evaluate over every label''s rows; keep statistics to plain columns' AS why
        FROM pg_statistic_ext s WHERE s.stxexprs IS NOT NULL
        UNION ALL
        SELECT d.classid, d.objid,
            CASE d.classid
                WHEN 'pg_constraint'::regclass THEN (SELECT k.conrelid FROM pg_constraint k
                    WHERE k.oid = d.objid)
                WHEN 'pg_statistic_ext'::regclass THEN (SELECT t.stxrelid FROM pg_statistic_ext t
                    WHERE t.oid = d.objid)
                ELSE coalesce((SELECT i.indrelid FROM pg_index i WHERE i.indexrelid = d.objid),
                    d.objid) END,
            (SELECT 'domain ' || k.contypid::regtype::text FROM pg_constraint k
             WHERE d.classid = 'pg_constraint'::regclass AND k.oid = d.objid),
            format('calls %s, which is not built in: REINDEX, ANALYZE, CLUSTER or VACUUM FULL would run it as the owner over every label''s rows; use built-in functions only there',
                p.oid::regprocedure)
        FROM (SELECT dd.classid, dd.objid, CASE dd.refclassid WHEN 'pg_proc'::regclass
                    THEN dd.refobjid
                    ELSE (SELECT o.oprcode::oid FROM pg_operator o WHERE o.oid = dd.refobjid)
                    END AS fn
              FROM pg_depend dd
              WHERE dd.classid IN ('pg_class'::regclass, 'pg_constraint'::regclass,
                                   'pg_statistic_ext'::regclass)
                AND dd.refclassid IN ('pg_proc'::regclass, 'pg_operator'::regclass)) d
        JOIN pg_proc p ON p.oid = d.fn
        WHERE p.pronamespace NOT IN ('pg_catalog'::regnamespace, 'warden'::regnamespace)
    ) x
$$;
REVOKE ALL ON FUNCTION warden.foreign_code() FROM PUBLIC;
"#;

/// The owner's guard, an event trigger after every DDL command in the app's database: the
/// release migration is the app's code and runs as the owner, which owns the tables, so
/// without it the owner could turn row security off, replace a policy, disable the stamping
/// trigger, grant an unlabelled table to the label roles, or make what runs with its rights
/// outside row security: a SECURITY DEFINER function, a rule, a cascading foreign key. Any of those aborts the command. Superusers (warden's admin)
/// pass. Event triggers need a superuser to make, as warden's admin is.
pub const GUARD: &str = r#"
CREATE OR REPLACE FUNCTION warden.guard() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    bad text;
BEGIN
    IF (SELECT rolsuper FROM pg_roles WHERE rolname = session_user) THEN
        RETURN;
    END IF;
    SELECT c.relname INTO bad FROM warden.labelled l JOIN pg_class c ON c.oid = l.relid
    WHERE NOT c.relrowsecurity OR NOT c.relforcerowsecurity
       OR warden.fingerprint(c.oid) <> l.policies
       -- The label columns stay plain: a domain, default or generation of the app's on them
       -- would run the app's code inside warden's trigger.
       OR (SELECT count(*) FROM pg_attribute a WHERE a.attrelid = c.oid AND NOT a.attisdropped
           AND ((a.attname = 'warden_label' AND a.atttypid = 'int4'::regtype)
                OR (a.attname = 'warden_owner' AND a.atttypid = 'text'::regtype))
           AND NOT a.atthasdef AND a.attgenerated = '' AND a.attidentity = '') <> 2
       OR NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = c.oid
                      AND t.tgname = 'warden_stamp' AND t.tgenabled IN ('O', 'A')
                      AND t.tgfoid = 'warden.stamp()'::regprocedure)
    LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'warden: table % is labelled; its row security, policies and trigger are warden''s', bad
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT p.oid::regprocedure::text INTO bad FROM pg_proc p
    WHERE p.pronamespace = 'public'::regnamespace AND p.prosecdef LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'warden: function % is SECURITY DEFINER; make it SECURITY INVOKER', bad
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- Rules run their actions with the table owner's rights, outside row security: one rule
    -- could copy what a high label inserts into an unlabelled table, another return it to a
    -- low label. Views' own `_RETURN` rules are not granted to anyone.
    SELECT c.relname || '.' || r.rulename INTO bad FROM pg_rewrite r
    JOIN pg_class c ON c.oid = r.ev_class
    WHERE c.relnamespace = 'public'::regnamespace AND r.rulename <> '_RETURN' LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'warden: rule % would run outside row security; use a trigger', bad
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- Foreign-key actions run outside row security too: a cascade from a high row would
    -- delete or change rows of lower labels (a write-down).
    SELECT c.conrelid::regclass::text || '.' || c.conname INTO bad FROM pg_constraint c
    WHERE c.connamespace = 'public'::regnamespace AND c.contype = 'f'
      AND (c.confdeltype NOT IN ('a', 'r') OR c.confupdtype NOT IN ('a', 'r')) LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'warden: foreign key % cascades or sets values outside row security; use NO ACTION or RESTRICT', bad
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- A new CHECK or exclusion constraint, a validation, an expression or partial index on a
    -- labelled table with rows evaluated the migration's code over every label's rows; the
    -- abort undoes what that code wrote (a table, a setting). Sequences and notices are not
    -- undone: SECURITY lists them.
    SELECT c.relname INTO bad FROM warden.labelled l JOIN pg_class c ON c.oid = l.relid
    WHERE warden.evaluated(c.oid) <> l.evaluated AND pg_relation_size(c.oid) > 0 LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'warden: table % is labelled and holds rows; a CHECK or exclusion constraint, expression or partial index on it evaluates the migration''s code over every label''s rows', bad
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT f.tbl || ': ' || f.obj || ' ' || f.why INTO bad FROM warden.foreign_code() f
    ORDER BY 1 LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'warden: %', bad USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- A key not scoped by label lets a low writer probe for higher rows (a duplicate-key
    -- error); labelling refuses it, and this keeps it off a labelled table afterwards.
    SELECT c.relname || '.' || warden.unscoped_key(c.oid) INTO bad
    FROM warden.labelled l JOIN pg_class c ON c.oid = l.relid
    WHERE warden.unscoped_key(c.oid) IS NOT NULL LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'warden: unique key % is not scoped by label; include warden_label in it', bad
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- Grants: only to the app's label roles, only SELECT, INSERT, UPDATE, DELETE on labelled
    -- tables (row security still binds them) and USAGE on sequences; USAGE on the schema
    -- (names only) to anyone.
    SELECT x.what INTO bad FROM (
        SELECT c.relname::text AS what, c.relkind, c.oid AS relid, a.grantor, a.grantee,
            a.privilege_type
        FROM pg_class c, aclexplode(c.relacl) a
        WHERE c.relnamespace = 'public'::regnamespace
        UNION ALL
        SELECT c.relname || '.' || at.attname, c.relkind, c.oid, a.grantor, a.grantee,
            a.privilege_type
        FROM pg_attribute at JOIN pg_class c ON c.oid = at.attrelid, aclexplode(at.attacl) a
        WHERE c.relnamespace = 'public'::regnamespace
        UNION ALL
        SELECT 'schema public', 'n', 0, a.grantor, a.grantee, a.privilege_type
        FROM pg_namespace n, aclexplode(n.nspacl) a WHERE n.nspname = 'public'
    ) x
    WHERE x.grantee <> x.grantor
      AND NOT (x.relkind = 'n' AND x.privilege_type = 'USAGE')
      AND NOT (
        x.grantee IN (SELECT r.oid FROM pg_roles r JOIN warden.roles w ON w.role = r.rolname)
        AND ((x.relid IN (SELECT relid FROM warden.labelled)
              AND x.privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE'))
             OR (x.relkind = 'S' AND x.privilege_type = 'USAGE')))
    LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'warden: only warden grants in an app database (%)', bad
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION warden.guard() FROM PUBLIC;

-- A table rewrite (ALTER COLUMN ... TYPE ... USING, a volatile default) evaluates the
-- migration's expressions over every row, outside row security: refused before it starts on
-- a labelled table that holds or has held rows (its main fork is not empty; a table emptied
-- but not vacuumed counts as holding rows).
CREATE OR REPLACE FUNCTION warden.no_rewrite() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t oid := pg_event_trigger_table_rewrite_oid();
BEGIN
    IF (SELECT rolsuper FROM pg_roles WHERE rolname = session_user) THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM warden.labelled WHERE relid = t) AND pg_relation_size(t) > 0 THEN
        RAISE EXCEPTION 'warden: table % is labelled and holds rows; rewriting it would evaluate the migration''s expressions over every label''s rows', t::regclass
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'make the change on a new table, or on this one while it is empty';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION warden.no_rewrite() FROM PUBLIC;
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'warden_guard') THEN
        CREATE EVENT TRIGGER warden_guard ON ddl_command_end EXECUTE FUNCTION warden.guard();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'warden_no_rewrite') THEN
        CREATE EVENT TRIGGER warden_no_rewrite ON table_rewrite
            EXECUTE FUNCTION warden.no_rewrite();
    END IF;
END
$$;
"#;

/// What the audit trail reads `warden.declassified` by (idempotent; run at `create_app` and
/// before the first read, so databases made before it get it too): an id in write order and
/// whether the row is recorded yet. Rows older than these columns count as not recorded, so
/// the first read after an upgrade records them. The stamping trigger's definer needs the
/// id's sequence. One implicit transaction: two nodes running it at once leave one column.
pub const DECLASSIFIED_AUDIT: &str = r#"
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'warden.declassified'::regclass
                   AND attname = 'audited' AND NOT attisdropped) THEN
        ALTER TABLE warden.declassified ADD COLUMN IF NOT EXISTS id bigserial,
            ADD COLUMN IF NOT EXISTS audited boolean NOT NULL DEFAULT false;
    END IF;
END
$$;
CREATE INDEX IF NOT EXISTS declassified_unaudited ON warden.declassified (id) WHERE NOT audited;
REVOKE ALL ON SEQUENCE warden.declassified_id_seq FROM PUBLIC;
GRANT USAGE ON SEQUENCE warden.declassified_id_seq TO warden_definer;
"#;

/// Claims the rows of `warden.declassified` no record names yet (at most 100,000, oldest
/// first; the rest wait for the next read), marks them recorded and sums them per (from, to)
/// label name. Run inside a transaction committed only once the records are durable: rows
/// another node's open claim holds are skipped, not read twice.
pub const CLAIM_DECLASSIFIED: &str = r#"
WITH done AS (
    UPDATE warden.declassified SET audited = true
    WHERE id IN (SELECT id FROM warden.declassified WHERE NOT audited
                 ORDER BY id LIMIT 100000 FOR UPDATE SKIP LOCKED)
    RETURNING from_label, to_label
)
SELECT coalesce(f.label, '#' || d.from_label), coalesce(t.label, '#' || d.to_label), count(*)
FROM done d
LEFT JOIN warden.labels f ON f.id = d.from_label
LEFT JOIN warden.labels t ON t.id = d.to_label
GROUP BY 1, 2 ORDER BY 1, 2
"#;

/// The NOLOGIN, non-superuser role that owns every SECURITY DEFINER function of the `warden`
/// schema, with only the rights they need: whatever runs inside them (an app's domain check,
/// say, if one ever got past labelling) has these rights, never a superuser's. Global, made
/// once per server by `create_app`.
pub const DEFINER: &str = "warden_definer";

/// Hands the `warden` schema's SECURITY DEFINER functions to [`DEFINER`] (idempotent).
pub const DEFINER_GRANTS: &str = r#"
GRANT SELECT ON warden.roles, warden.labels, warden.settings, warden.labelled TO warden_definer;
GRANT INSERT ON warden.declassified TO warden_definer;
GRANT SELECT ON pg_catalog.pg_roles TO warden_definer;
GRANT EXECUTE ON FUNCTION warden.fingerprint(oid), warden.evaluated(oid), warden.unscoped_key(oid),
    warden.foreign_code(),
    pg_catalog.pg_relation_size(regclass), pg_catalog.pg_relation_size(regclass, text)
    TO warden_definer;
ALTER FUNCTION warden.session_label() OWNER TO warden_definer;
ALTER FUNCTION warden.session_owner() OWNER TO warden_definer;
ALTER FUNCTION warden.readable() OWNER TO warden_definer;
ALTER FUNCTION warden.writable() OWNER TO warden_definer;
ALTER FUNCTION warden.declassify_to() OWNER TO warden_definer;
ALTER FUNCTION warden.stamp() OWNER TO warden_definer;
ALTER FUNCTION warden.guard() OWNER TO warden_definer;
ALTER FUNCTION warden.no_rewrite() OWNER TO warden_definer;
"#;

/// Functions no app role may execute in its database: transaction ids and snapshots (they move
/// with every label's writes), advisory locks and `pg_notify` (covert
/// channels between labels), large objects (storage outside row security), file and server
/// functions (defence in depth: most are already superuser-only), the statistics and activity
/// functions behind `pg_stat_*` (another session's `application_name`, rows inserted and
/// deleted per table: channels from a higher label), the size functions (a table grows by
/// what every label writes) and the WAL position (it moves with every label's writes).
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
               OR p.proname LIKE 'pg\_stat\_get\_%' OR p.proname IN ('pg_lock_status',
                   'pg_blocking_pids', 'pg_safe_snapshot_blocking_pids')
               OR p.proname IN ('pg_relation_size', 'pg_total_relation_size',
                   'pg_table_size', 'pg_indexes_size', 'pg_database_size',
                   'pg_tablespace_size')
               OR p.proname LIKE 'pg\_current\_wal%'
               OR p.proname IN ('txid_current', 'txid_current_if_assigned',
                   'txid_current_snapshot', 'txid_status', 'pg_current_xact_id',
                   'pg_current_xact_id_if_assigned', 'pg_current_snapshot', 'pg_xact_status',
                   'pg_last_committed_xact', 'pg_xact_commit_timestamp',
                   'pg_xact_commit_timestamp_origin'))
    LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
REVOKE SELECT ON pg_catalog.pg_stat_activity, pg_catalog.pg_locks FROM PUBLIC;
-- A role's own settings (`ALTER ROLE CURRENT_USER SET ...`, which PostgreSQL lets any role
-- do) are in these, readable by every role: a channel between labels.
REVOKE SELECT ON pg_catalog.pg_roles, pg_catalog.pg_user, pg_catalog.pg_db_role_setting
    FROM PUBLIC;
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
    WITH CHECK (warden_label = ANY ((SELECT warden.writable())::int[]) AND {owner_check});
CREATE POLICY warden_update ON {t} FOR UPDATE
    USING (warden_label = (SELECT warden.session_label()) AND {owner})
    WITH CHECK (warden_label = ANY ((SELECT warden.writable())::int[]) AND {owner_check});
CREATE POLICY warden_delete ON {t} FOR DELETE
    USING (warden_label = (SELECT warden.session_label()) AND {owner});
CREATE OR REPLACE TRIGGER warden_stamp BEFORE INSERT OR UPDATE ON {t}
    FOR EACH ROW EXECUTE FUNCTION warden.stamp();
"#;

/// The owner rule of every policy: `per_user` roles reach only their user's rows.
pub const OWNER_RULE: &str = "((SELECT warden.session_owner()) IS NULL \
     OR warden_owner = (SELECT warden.session_owner()))";

/// The owner rule of every written row: exactly the session's user (NULL for a role of no
/// user), so an app trigger that runs after warden's cannot put another user's name on a row.
pub const OWNER_CHECK: &str = "warden_owner IS NOT DISTINCT FROM (SELECT warden.session_owner())";
