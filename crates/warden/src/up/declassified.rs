//! Declassifiers' writes in the audit trail (issue 35): every flush period, the rows each data
//! app's declassifiers wrote down since the last period (its database's `warden.declassified`)
//! are recorded as one `declassified` record per (app, from, to), durably, and only then marked
//! recorded in that database. A crash between the two records them again at the next start: a
//! duplicate, never a loss. Rows written meanwhile wait for the next period.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use warden_core::audit::{Audit, Event};
use warden_core::keys;
use warden_core::model::AppSpec;

use crate::data::Data;

/// Records what declassifiers wrote down, every `period`, until `stop` turns true.
pub(super) async fn follow(
    store: Arc<dyn warden_store::Store>,
    data: Arc<Data>,
    audit: Arc<dyn Audit>,
    period: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let apps = match store.list(keys::APPS).await {
            Ok(l) => l.entries,
            Err(e) => {
                warden_core::log_limited!(warn, error = %e, "cannot list apps to record their declassified writes; trying again next period");
                continue;
            }
        };
        for entry in apps {
            let Ok(spec) = serde_json::from_slice::<AppSpec>(&entry.value) else {
                continue;
            };
            // A process type's spec shares its app's database: the app's pass records it.
            if spec.data && spec.process.is_none() {
                record_app(&data, &*audit, &spec.name).await;
            }
        }
    }
}

/// Records `app`'s new declassified rows, then marks them recorded.
async fn record_app(data: &Data, audit: &dyn Audit, app: &str) {
    let claim = match data.claim_declassified(app).await {
        Ok(Some(c)) => c,
        Ok(None) => return,
        Err(e) => {
            warden_core::log_limited!(warn, app, error = %e, "cannot read an app's declassified writes; trying again next period");
            return;
        }
    };
    // Queued together, so one fsync makes them all durable.
    let durable: Vec<_> = claim
        .writes
        .iter()
        .map(|w| {
            audit.record_durable(Event::Declassified {
                app: app.to_owned(),
                from: w.from.clone(),
                to: w.to.clone(),
                count: w.count,
            })
        })
        .collect();
    for d in durable {
        if let Err(e) = d.await {
            // The claim is dropped, not committed: the rows stay for the next period.
            warden_core::log_limited!(warn, app, error = %e, "declassified writes not recorded; trying again next period");
            return;
        }
    }
    if let Err(e) = claim.commit().await {
        warden_core::log_limited!(warn, app, error = %e, "declassified writes recorded but not marked; the next period records them again");
    }
}
