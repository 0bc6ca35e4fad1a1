//! The rows declassifiers wrote down, as the audit trail reads them (issue 35): every such row
//! is in the app database's `warden.declassified` (the stamping trigger writes it), and
//! [`Admin::claim_declassified`] hands out the ones no record names yet, summed per (from, to)
//! label. The claim marks them recorded inside a transaction the caller commits only once its
//! records are durable: a crash before that leaves them to be recorded again (a duplicate,
//! never a loss), and a second node reading meanwhile skips the rows the claim holds.

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::{check_name, db_name, sql, Admin, SchemaError};

/// Rows written down from one label to another since the last claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declassified {
    /// The label of the writer (its session's).
    pub from: String,
    /// The label the rows were written at.
    pub to: String,
    /// How many rows.
    pub count: u64,
}

/// Rows claimed for the audit trail: [`Claim::commit`] marks them recorded; dropped without
/// it, its connection closes and they stay for the next claim.
pub struct Claim {
    client: Client,
    /// The rows, summed per (from, to).
    pub writes: Vec<Declassified>,
}

impl Claim {
    /// Marks the claimed rows recorded: call once their records are durable.
    pub async fn commit(self) -> Result<(), SchemaError> {
        self.client
            .batch_execute("COMMIT")
            .await
            .map_err(sql("marking declassified rows recorded"))
    }
}

impl Admin<'_> {
    /// Claims `app`'s declassified rows no record names yet; `None` when there are none.
    pub async fn claim_declassified(&self, app: &str) -> Result<Option<Claim>, SchemaError> {
        check_name(app)?;
        let client = self.server.admin(Some(&db_name(app))).await?;
        client
            .batch_execute("BEGIN")
            .await
            .map_err(sql("starting a claim of declassified rows"))?;
        let rows = match client.query(super::sql::CLAIM_DECLASSIFIED, &[]).await {
            Ok(rows) => rows,
            // A database made before the trail read it: given the columns, then read.
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_COLUMN) => {
                let what = "making warden.declassified readable by the audit trail";
                for stmts in ["ROLLBACK", super::sql::DECLASSIFIED_AUDIT, "BEGIN"] {
                    client.batch_execute(stmts).await.map_err(sql(what))?;
                }
                client
                    .query(super::sql::CLAIM_DECLASSIFIED, &[])
                    .await
                    .map_err(sql("claiming declassified rows"))?
            }
            Err(e) => return Err(sql("claiming declassified rows")(e)),
        };
        if rows.is_empty() {
            return Ok(None);
        }
        let writes = rows
            .iter()
            .map(|r| Declassified {
                from: r.get(0),
                to: r.get(1),
                count: u64::try_from(r.get::<_, i64>(2)).unwrap_or(0),
            })
            .collect();
        Ok(Some(Claim { client, writes }))
    }
}
