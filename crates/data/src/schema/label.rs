//! Labels in rows: the `warden.labels` ranks, labelling an app's tables after a migration, and
//! what `warden data show` reports.
//!
//! Unique keys (polyinstantiation): a unique index or exclusion constraint is accepted only if
//! it includes `warden_label` (keys scoped by label: two labels may hold the same key, and
//! neither learns of the other) or is a single-column primary key filled by a sequence, an
//! identity or `gen_random_uuid()`. Any other would let a low writer learn that a higher row
//! holds a value (its insert fails), so labelling fails naming the table and the index.

use tokio_postgres::Client;
use warden_auth::lattice::Lattice;

use super::{
    connect_as, quote_ident, sql, sql::OWNER_CHECK, sql::OWNER_RULE, sql::POLICIES, RoleLogin,
    SchemaError,
};

/// What an app's database holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppData {
    /// `pg_database_size`, in bytes.
    pub size_bytes: i64,
    /// The app's tables.
    pub tables: Vec<TableData>,
    /// The label the app may write down to (canonical), if it is a declassifier.
    pub declassify_to: Option<String>,
    /// Rows written below their writer's label, as `warden.declassified` records them.
    pub declassified_writes: i64,
}

/// One table of an app.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableData {
    /// The table's name.
    pub name: String,
    /// Rows per label (canonical text), for labelled tables.
    pub rows_per_label: Vec<(String, i64)>,
}

/// The id of `canonical` in `warden.labels`, inserting it with its rank under `lattice`.
pub(super) async fn ensure_label(
    c: &Client,
    lattice: &Lattice,
    canonical: &str,
) -> Result<i32, SchemaError> {
    let (level, cats) = rank(lattice, canonical)?;
    let row = c
        .query_one(
            "INSERT INTO warden.labels (label, level, categories) VALUES ($1, $2, $3) \
             ON CONFLICT (label) DO UPDATE SET level = EXCLUDED.level, \
             categories = EXCLUDED.categories RETURNING id",
            &[&canonical, &level, &cats],
        )
        .await
        .map_err(sql("recording a label"))?;
    Ok(row.get(0))
}

/// A label's level rank (0 in a lattice without levels) and category names.
fn rank(lattice: &Lattice, text: &str) -> Result<(i32, Vec<String>), SchemaError> {
    let label = lattice.parse(text)?;
    let level = label.level().unwrap_or(0) as i32;
    let cats = label
        .categories()
        .map(|i| lattice.categories[i].clone())
        .collect();
    Ok((level, cats))
}

/// The labelled tables of the app's schema: those warden recorded at labelling. Never picked by
/// policy name: the owner may name a policy of an unlabelled table `warden_select` too.
async fn labelled_tables(c: &Client) -> Result<Vec<String>, SchemaError> {
    let rows = c
        .query(
            "SELECT c.relname::text FROM warden.labelled l JOIN pg_class c ON c.oid = l.relid \
             WHERE c.relnamespace = 'public'::regnamespace ORDER BY 1",
            &[],
        )
        .await
        .map_err(sql("listing labelled tables"))?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Whether every table of the app's schema is one warden recorded at labelling, read from the
/// catalogs without a lock. A recorded table stays labelled (the owner's guard keeps its row
/// security, policies, trigger and label columns warden's), and one made since has no grant to
/// any label role, so an instance's start may skip labelling when this holds, and takes no
/// lock that would queue every session of the app behind a long transaction of one.
pub(super) async fn all_labelled(c: &Client) -> Result<bool, SchemaError> {
    let row = c
        .query_one(
            "SELECT NOT EXISTS (SELECT 1 FROM pg_class c \
               WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p') \
               AND c.oid NOT IN (SELECT relid FROM warden.labelled))",
            &[],
        )
        .await
        .map_err(sql("checking for unlabelled tables"))?;
    Ok(row.get(0))
}

/// Grants every labelled table (and the schema's sequences) to `roles`.
pub(super) async fn grant_labelled(c: &Client, roles: &[String]) -> Result<(), SchemaError> {
    if roles.is_empty() {
        return Ok(());
    }
    let to: Vec<String> = roles.iter().map(|r| quote_ident(r)).collect();
    let to = to.join(", ");
    let mut stmts = format!(
        "GRANT USAGE ON SCHEMA public TO {to};\
         GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {to};"
    );
    for t in labelled_tables(c).await? {
        let q = format!("public.{}", quote_ident(&t));
        // A key exempt from label scoping (a serial, identity or uuid primary key) is the
        // default's alone: a role that could insert or set a chosen id would learn from a
        // duplicate-key error that a row of another label holds it. So label roles get INSERT
        // and UPDATE on every other column only.
        let others: Option<String> = c
            .query_one(
                "SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) \
                 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid \
                 WHERE i.indrelid = $1::text::regclass AND i.indisprimary \
                   AND i.indnkeyatts = 1 AND a.attnum > 0 AND NOT a.attisdropped \
                   AND a.attnum <> i.indkey[0] AND NOT EXISTS (SELECT 1 FROM pg_attribute k \
                       WHERE k.attrelid = i.indrelid AND k.attnum = i.indkey[0] \
                         AND k.attname = 'warden_label')",
                &[&q],
            )
            .await
            .map_err(sql("listing a table's columns"))?
            .get(0);
        stmts.push_str(&match others {
            Some(cols) => format!(
                "REVOKE INSERT, UPDATE ON {q} FROM {to};\
                 GRANT SELECT, DELETE ON {q} TO {to};\
                 GRANT INSERT ({cols}), UPDATE ({cols}) ON {q} TO {to};"
            ),
            None => format!("GRANT SELECT, INSERT, UPDATE, DELETE ON {q} TO {to};"),
        });
    }
    c.batch_execute(&stmts)
        .await
        .map_err(sql("granting labelled tables"))
}

/// Labels every table of the app's schema; returns the tables labelled. Fails, naming the
/// table, on a unique key not scoped by label, a row-security policy warden did not make, a
/// SECURITY DEFINER function (it would run as the owner, outside the labels' grants), or the
/// app's code where maintenance would run it over every row (`check_foreign_code`).
///
/// `c` must be a connection of its own (not shared): the checks and the writes are one
/// transaction that first locks every table of the app, so nothing the owner does on another
/// connection (a release command's statement still running, say) lands between what is
/// checked and what is recorded as warden's.
pub(super) async fn label_tables(
    c: &Client,
    lattice: &Lattice,
    owner: &RoleLogin,
) -> Result<Vec<String>, SchemaError> {
    // Before the transaction: a label column the migration made may hold NULLs, and filling
    // them runs the app's triggers over a connection of the owner's, which the transaction's
    // locks would block. The transaction then refuses any NULL left (SET NOT NULL fails).
    refuse_definer_functions(c).await?;
    for t in &list_tables(c).await? {
        check_label_columns(c, t).await?;
        fill_labels(c, t, lattice, owner).await?;
    }
    c.batch_execute("BEGIN")
        .await
        .map_err(sql("starting the labelling"))?;
    match label_locked(c, lattice).await {
        Ok(tables) => {
            c.batch_execute("COMMIT")
                .await
                .map_err(sql("committing the labelling"))?;
            Ok(tables)
        }
        Err(e) => {
            // The error says what went wrong; a failed rollback ends with the connection.
            let _ = c.batch_execute("ROLLBACK").await;
            Err(e)
        }
    }
}

/// The tables of the app's schema.
async fn list_tables(c: &Client) -> Result<Vec<String>, SchemaError> {
    Ok(c.query(
        "SELECT c.relname::text FROM pg_class c \
             WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p') \
             ORDER BY 1",
        &[],
    )
    .await
    .map_err(sql("listing the app's tables"))?
    .iter()
    .map(|r| r.get(0))
    .collect())
}

/// Checks and labels every table, inside the caller's transaction, under locks that keep the
/// owner out until it ends.
async fn label_locked(c: &Client, lattice: &Lattice) -> Result<Vec<String>, SchemaError> {
    let tables = list_tables(c).await?;
    if !tables.is_empty() {
        let all: Vec<String> = tables
            .iter()
            .map(|t| format!("public.{}", quote_ident(t)))
            .collect();
        // Bounded: an instance's long transaction on a table must not hang a release.
        c.batch_execute(&format!(
            "SET LOCAL lock_timeout = '60s'; LOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
            all.join(", ")
        ))
        .await
        .map_err(sql("locking the app's tables"))?;
    }
    // A table made between the listing and the lock is not locked: refuse rather than label
    // it unlocked (the next labelling takes it).
    if let Some(t) = list_tables(c)
        .await?
        .into_iter()
        .find(|t| !tables.contains(t))
    {
        return Err(SchemaError::Unlabellable {
            table: t,
            reason: "it was made while warden was labelling the app's tables; label again \
                     (push again, or restart the app) once its owner is done"
                .into(),
        });
    }
    refuse_definer_functions(c).await?;
    check_foreign_code(c).await?;
    for t in &tables {
        check_label_columns(c, t).await?;
        check_unique_keys(c, t).await?;
        check_foreign_policies(c, t).await?;
    }
    let bottom = bottom_label(c, lattice).await?;
    for t in &tables {
        label_one(c, t, bottom).await?;
        // What is recorded is warden's alone (the lock keeps it so; this says so).
        check_foreign_policies(c, t).await?;
    }
    let roles: Vec<String> = c
        .query("SELECT role::text FROM warden.roles", &[])
        .await
        .map_err(sql("listing the app's roles"))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    grant_labelled(c, &roles).await?;
    Ok(tables)
}

/// The lattice's lowest label: existing rows of a newly labelled table get it.
async fn bottom_label(c: &Client, lattice: &Lattice) -> Result<i32, SchemaError> {
    let text = match lattice.levels.first() {
        Some(l) => lattice.canonical(l)?,
        None => lattice.canonical("{}")?,
    };
    ensure_label(c, lattice, &text).await
}

async fn label_one(c: &Client, table: &str, bottom: i32) -> Result<(), SchemaError> {
    let t = format!("public.{}", quote_ident(table));
    // A constant default fills the rows already there without rewriting the table or firing
    // anything of the app's (warden's connection is a superuser's).
    c.batch_execute(&format!(
        "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS warden_label int NOT NULL DEFAULT {bottom};\
         ALTER TABLE {t} ALTER COLUMN warden_label DROP DEFAULT;\
         ALTER TABLE {t} ADD COLUMN IF NOT EXISTS warden_owner text;"
    ))
    .await
    .map_err(sql(&format!("adding label columns to {table:?}")))?;
    let has_fk = c
        .query_opt(
            "SELECT 1 FROM pg_constraint WHERE conrelid = $1::text::regclass \
             AND conname = 'warden_label_fk'",
            &[&t],
        )
        .await
        .map_err(sql("looking up the label key"))?
        .is_some();
    let mut stmts = format!("ALTER TABLE {t} ALTER COLUMN warden_label SET NOT NULL;");
    if !has_fk {
        stmts.push_str(&format!(
            "ALTER TABLE {t} ADD CONSTRAINT warden_label_fk FOREIGN KEY (warden_label) \
             REFERENCES warden.labels (id);"
        ));
    }
    stmts.push_str(
        &POLICIES
            .replace("{owner_check}", OWNER_CHECK)
            .replace("{owner}", OWNER_RULE)
            .replace("{t}", &t),
    );
    c.batch_execute(&stmts)
        .await
        .map_err(sql(&format!("labelling {table:?}")))?;
    // What the owner's guard holds the table to from now on.
    c.execute(
        "INSERT INTO warden.labelled (relid, policies, evaluated) \
         SELECT oid, warden.fingerprint(oid), warden.evaluated(oid) FROM pg_class \
         WHERE oid = $1::text::regclass \
         ON CONFLICT (relid) DO UPDATE SET policies = EXCLUDED.policies, \
         evaluated = EXCLUDED.evaluated",
        &[&t],
    )
    .await
    .map_err(sql(&format!("recording {table:?} as labelled")))?;
    Ok(())
}

/// A label column the migration made itself (to scope a key by it) may hold NULLs: they get
/// the lattice's lowest label. Filling them runs the app's triggers, defaults and index
/// expressions, so it runs over a connection logged in as the owner: never on the admin's
/// session, where `SET ROLE` is no bound (the app's trigger may `RESET ROLE` back to the
/// superuser). Once labelled, the column is NOT NULL and this touches nothing. Reading here
/// runs no app code: the column is a plain int4 (`check_label_columns`, called first).
async fn fill_labels(
    c: &Client,
    table: &str,
    lattice: &Lattice,
    owner: &RoleLogin,
) -> Result<(), SchemaError> {
    let t = format!("public.{}", quote_ident(table));
    let has_column = c
        .query_opt(
            "SELECT 1 FROM pg_attribute WHERE attrelid = $1::text::regclass \
             AND attname = 'warden_label' AND NOT attisdropped",
            &[&t],
        )
        .await
        .map_err(sql("looking up the label column"))?
        .is_some();
    if !has_column {
        return Ok(());
    }
    let unfilled = c
        .query_one(
            &format!("SELECT EXISTS (SELECT 1 FROM {t} WHERE warden_label IS NULL)"),
            &[],
        )
        .await
        .map_err(sql(&format!("looking for unlabelled rows of {table:?}")))?
        .get::<_, bool>(0);
    if unfilled {
        let bottom = bottom_label(c, lattice).await?;
        let o = connect_as(owner).await?;
        o.execute(
            &format!("UPDATE {t} SET warden_label = $1 WHERE warden_label IS NULL"),
            &[&bottom],
        )
        .await
        .map_err(sql(&format!("labelling the existing rows of {table:?}")))?;
    }
    Ok(())
}

/// Refuses the app's code where maintenance would run it as the owner over every label's
/// rows (`warden.foreign_code`, which the owner's guard holds every later command to).
async fn check_foreign_code(c: &Client) -> Result<(), SchemaError> {
    let bad = c
        .query_opt(
            "SELECT tbl, obj, why FROM warden.foreign_code() ORDER BY 1, 2 LIMIT 1",
            &[],
        )
        .await
        .map_err(sql("checking what maintenance would run"))?;
    if let Some(row) = bad {
        let (table, obj, why): (String, String, String) = (row.get(0), row.get(1), row.get(2));
        return Err(SchemaError::Unlabellable {
            table,
            reason: format!("its {obj} {why}"),
        });
    }
    Ok(())
}

/// Label columns the migration made must be exactly `int4` and `text`, with nothing of the
/// app's attached: warden's trigger (which runs as warden's definer role) assigns to them, and a
/// domain's CHECK or a default would run the app's function there.
async fn check_label_columns(c: &Client, table: &str) -> Result<(), SchemaError> {
    let bad = c
        .query_opt(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
             WHERE a.attrelid = $1::text::regclass AND NOT a.attisdropped \
               AND a.attname IN ('warden_label', 'warden_owner') \
               AND (a.atttypid <> CASE a.attname WHEN 'warden_label' THEN 'int4'::regtype \
                                                 ELSE 'text'::regtype END \
                    OR a.atthasdef OR a.attgenerated <> '' OR a.attidentity <> '')",
            &[&format!("public.{}", quote_ident(table))],
        )
        .await
        .map_err(sql("checking the label columns"))?;
    if let Some(row) = bad {
        let (column, ty): (String, String) = (row.get(0), row.get(1));
        return Err(SchemaError::Unlabellable {
            table: table.to_owned(),
            reason: format!(
                "its column {column} ({ty}) is warden's: declare `warden_label int` or \
                 `warden_owner text` exactly, with no domain, default, identity or generation"
            ),
        });
    }
    Ok(())
}

async fn check_unique_keys(c: &Client, table: &str) -> Result<(), SchemaError> {
    // The rule is `warden.unscoped_key`'s, which the guard also holds labelled tables to.
    let bad = c
        .query(
            "SELECT k FROM warden.unscoped_key($1::text::regclass) k WHERE k IS NOT NULL",
            &[&format!("public.{}", quote_ident(table))],
        )
        .await
        .map_err(sql("checking unique keys"))?;
    if let Some(row) = bad.first() {
        let index: String = row.get(0);
        return Err(SchemaError::Unlabellable {
            table: table.to_owned(),
            reason: format!(
                "its unique index {index} is not scoped by label, so a write could learn that \
                 a row of a higher label holds the same key; add a column `warden_label int` \
                 in the migration and include it in the key, or use a serial, identity or \
                 gen_random_uuid() primary key"
            ),
        });
    }
    Ok(())
}

async fn check_foreign_policies(c: &Client, table: &str) -> Result<(), SchemaError> {
    let other = c
        .query_opt(
            "SELECT policyname::text FROM pg_policies WHERE schemaname = 'public' \
             AND tablename = $1 AND policyname NOT IN \
             ('warden_select', 'warden_insert', 'warden_update', 'warden_delete')",
            &[&table],
        )
        .await
        .map_err(sql("checking row-security policies"))?;
    if let Some(row) = other {
        let name: String = row.get(0);
        return Err(SchemaError::Unlabellable {
            table: table.to_owned(),
            reason: format!(
                "it has a row-security policy {name:?}; row security is warden's, drop it in \
                 the migration"
            ),
        });
    }
    Ok(())
}

async fn refuse_definer_functions(c: &Client) -> Result<(), SchemaError> {
    let f = c
        .query_opt(
            "SELECT p.oid::regprocedure::text FROM pg_proc p \
             WHERE p.pronamespace = 'public'::regnamespace AND p.prosecdef",
            &[],
        )
        .await
        .map_err(sql("checking the app's functions"))?;
    if let Some(row) = f {
        let name: String = row.get(0);
        return Err(SchemaError::Unlabellable {
            table: name.clone(),
            reason: format!(
                "function {name} is SECURITY DEFINER: it would run as the owner, beside the \
                 labels; make it SECURITY INVOKER"
            ),
        });
    }
    Ok(())
}

/// Re-ranks the database's labels under `lattice`; returns the labels it lacks (their level
/// becomes NULL, which no comparison passes).
pub(super) async fn rerank(c: &Client, lattice: &Lattice) -> Result<Vec<String>, SchemaError> {
    let rows = c
        .query("SELECT id, label FROM warden.labels", &[])
        .await
        .map_err(sql("listing labels"))?;
    let mut lost = Vec::new();
    for row in rows {
        let (id, text): (i32, String) = (row.get(0), row.get(1));
        match rank(lattice, &text) {
            Ok((level, cats)) => {
                // The canonical text follows the lattice's order of categories, so a role asked
                // for by its new spelling finds this label (unless that spelling is taken).
                let canonical = lattice.canonical(&text)?;
                c.execute(
                    "UPDATE warden.labels SET level = $2, categories = $3, label = CASE \
                     WHEN EXISTS (SELECT 1 FROM warden.labels o WHERE o.label = $4 AND o.id <> $1) \
                     THEN label ELSE $4 END WHERE id = $1",
                    &[&id, &level, &cats, &canonical],
                )
                .await
                .map_err(sql("re-ranking a label"))?;
            }
            Err(_) => {
                c.execute(
                    "UPDATE warden.labels SET level = NULL WHERE id = $1",
                    &[&id],
                )
                .await
                .map_err(sql("retiring a label"))?;
                lost.push(text);
            }
        }
    }
    Ok(lost)
}

/// Size, tables and rows per label; read as the admin, which row security does not bind.
pub(super) async fn show(c: &Client) -> Result<AppData, SchemaError> {
    let size: i64 = c
        .query_one("SELECT pg_database_size(current_database())", &[])
        .await
        .map_err(sql("reading the database's size"))?
        .get(0);
    let labelled = labelled_tables(c).await?;
    let mut tables = Vec::new();
    for name in labelled {
        let rows = c
            .query(
                &format!(
                    "SELECT l.label, count(*) FROM public.{} t \
                     JOIN warden.labels l ON l.id = t.warden_label GROUP BY 1 ORDER BY 1",
                    quote_ident(&name)
                ),
                &[],
            )
            .await
            .map_err(sql("counting rows per label"))?;
        tables.push(TableData {
            name,
            rows_per_label: rows.iter().map(|r| (r.get(0), r.get(1))).collect(),
        });
    }
    let declassify_to: Option<String> = c
        .query_one(
            "SELECT l.label FROM warden.settings s LEFT JOIN warden.labels l \
             ON l.id = s.declassify_to",
            &[],
        )
        .await
        .map_err(sql("reading the declassifier mark"))?
        .get(0);
    let declassified_writes: i64 = c
        .query_one("SELECT count(*) FROM warden.declassified", &[])
        .await
        .map_err(sql("counting declassified writes"))?
        .get(0);
    Ok(AppData {
        size_bytes: size,
        tables,
        declassify_to,
        declassified_writes,
    })
}
