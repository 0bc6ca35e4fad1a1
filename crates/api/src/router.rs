//! The router: every route of [`crate::ROUTES`], its access rules and its layers, over the
//! handlers of [`crate::routes`].

use axum::http::{header, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};

use crate::*;

impl Api {
    /// The router with every route of [`ROUTES`].
    pub fn router(self) -> Router {
        use axum::routing::delete;
        use routes::*;
        let admin = Router::new()
            .route("/v1/status", get(status::show))
            .route("/v1/apps", get(apps::list).post(apps::create))
            .route(
                "/v1/apps/{name}",
                get(apps::show).patch(apps::update).delete(apps::remove),
            )
            .route("/v1/users", get(users::list).post(users::create))
            .route(
                "/v1/users/{name}",
                get(users::show).patch(users::change).delete(users::remove),
            )
            .route("/v1/sessions", get(users::sessions))
            .route("/v1/users/{name}/sessions", delete(users::end))
            .route("/v1/instances", get(instances::list).post(instances::start))
            .route("/v1/instances/{id}", delete(instances::kill))
            .route("/v1/instances/{id}/logs", get(instances::logs))
            .route("/v1/nodes", get(nodes::list))
            .route(
                "/v1/nodes/{name}/drain",
                post(nodes::drain).delete(nodes::undrain),
            )
            .route("/v1/apps/{name}/scale", post(apps::scale))
            .route("/v1/apps/{name}/ps", get(ps::show))
            .route("/v1/apps/{name}/data", get(data::show))
            .route(
                "/v1/apps/{name}/releases",
                get(releases::list)
                    .post(releases::push)
                    .layer(axum::extract::DefaultBodyLimit::disable()),
            )
            .route("/v1/apps/{name}/releases/{number}/log", get(releases::log))
            .route("/v1/limits", get(releases::limits))
            .route("/v1/apps/{name}/logs", get(instances::app_logs))
            .route("/v1/apps/{name}/requests", get(instances::router_lines))
            .route(
                "/v1/apps/{name}/config",
                get(releases::config_show).post(releases::config_change),
            )
            .route("/v1/apps/{name}/rollback", post(releases::rollback))
            .route("/v1/apps/{name}/restart", post(restart::restart))
            .route(git::REFS, get(git::refs))
            .route(
                git::RECEIVE,
                post(git::receive).layer(axum::extract::DefaultBodyLimit::disable()),
            )
            .route("/v1/apps/{name}/run", post(run::run))
            .route("/v1/lattice", get(lattice::show).put(lattice::replace))
            .route("/v1/store/backup", get(store::backup))
            .route("/v1/audit", get(audit::list))
            .route("/v1/audit/verify", get(audit::verify))
            .route(
                "/v1/operators",
                get(operators::list).post(operators::create),
            )
            .route(
                "/v1/operators/{name}",
                get(operators::show)
                    .patch(operators::change)
                    .delete(operators::remove),
            )
            .route("/v1/logout", post(tokens::logout))
            .route("/v1/tokens", get(tokens::list).post(tokens::create))
            .route("/v1/tokens/{id}", delete(tokens::revoke))
            .route(
                "/v1/oidc/providers",
                get(oidc_providers::list).post(oidc_providers::create),
            )
            .route(
                "/v1/oidc/providers/{id}",
                get(oidc_providers::show)
                    .patch(oidc_providers::change)
                    .delete(oidc_providers::remove),
            )
            // Inside the token check: only changes it allowed are recorded here, with their
            // principal as the actor.
            .route_layer(axum::middleware::from_fn_with_state(
                self.clone(),
                crate::audit::record_change,
            ))
            .route_layer(axum::middleware::from_fn_with_state(
                self.clone(),
                authz::authorize,
            ));
        let json = Router::new()
            .route(
                "/healthz",
                get(|| async {
                    Json(Health {
                        error: None,
                        status: "ok".into(),
                        audit: None,
                    })
                }),
            )
            .route("/readyz", get(readyz))
            .route(
                "/v1/openapi.json",
                get(|| async { ([(header::CONTENT_TYPE, "application/json")], OPENAPI) }),
            )
            .route("/metrics", get(metrics))
            // Outside the token check: it makes tokens; throttled on its own.
            .route("/v1/login", post(routes::tokens::login))
            .route("/v1/login/device", post(routes::login_device::start))
            .route("/v1/login/device/poll", post(routes::login_device::poll))
            .merge(admin)
            .fallback(|| async {
                ApiError::not_found("no such route; GET /v1/openapi.json lists the API")
            })
            .method_not_allowed_fallback(|| async {
                ApiError::new(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "method not allowed on this route; GET /v1/openapi.json lists the API",
                )
            })
            .layer(axum::extract::DefaultBodyLimit::max(1024 * 1024))
            .with_state(self.clone());
        // The dashboard calls the JSON API through this very router (its token check, its
        // table, its handlers, its audit), so it has no access rule of its own.
        let ui = ui::router(self, json.clone());
        json.merge(ui)
    }
}
