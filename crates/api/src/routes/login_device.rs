//! `POST /v1/login/device` and `POST /v1/login/device/poll`: `warden login --provider ID`, an
//! operator's sign-in through an identity provider's device flow (RFC 8628).
//!
//! The API holds the client secret; the CLI never sees it nor the provider's device code. A
//! start asks the provider for the codes and keeps the device code SEALED in a leased record
//! `oidc/devices/<SHA-256 of a random handle>` (the handle goes to the CLI, never to the
//! store). A poll calls the provider's token endpoint once, at most once per interval (sooner
//! is answered `slow_down` without calling it), and on success checks the ID token as the
//! gateway does (signature, issuer, audience, expiry, iat; the device flow sends no nonce),
//! maps the claims to roles (`operator_rules`), writes the operator (`provider_operators`) and
//! answers a session token. The session ends no later than the provider's tokens do: at
//! min(the API's session time, 12 h by default; the ID token's expiry, or the access token's
//! if sooner). warden keeps no refresh token for operators, so it cannot follow the person's
//! groups past that; the next `warden login --provider` reads them again.
//!
//! Both routes are outside the token check. Starts from one address are throttled (each start
//! counts), as are polls with unknown handles; at most `MAX_LIVE` (100) sign-ins are in flight.

use std::net::IpAddr;
use std::time::Duration;

use axum::extract::{FromRequest, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use warden_api_types::{DeviceLogin, DevicePollAnswer, DevicePollRequest, DeviceStarted};
use warden_core::{keys, model::now_ms};
use warden_oidc::{DevicePoll, OidcError, Secret, Tokens};
use warden_store::CasOutcome;

use super::device_live::Full;
use super::provider_operators::{self, OperatorProvider};
use crate::authz::{self, throttle::network};
use crate::error::{ApiError, ApiJson};
use crate::Api;

/// Most device sign-ins in flight at once, over every address: each holds a store record.
pub(crate) const MAX_LIVE: usize = 100;
/// Longest a device sign-in stays in flight, whatever the provider says.
const MAX_FLIGHT: Duration = Duration::from_secs(15 * 60);
/// How long a record outlives its flight: a poll just before the end still finds it.
const LEASE_SLACK: Duration = Duration::from_secs(30);
/// The throttle's names for starts and for polls with unknown handles.
const STARTS: &str = "(device start)";
const BAD_POLLS: &str = "(device poll)";
const START_ROUTE: &str = "/v1/login/device";
const POLL_ROUTE: &str = "/v1/login/device/poll";

/// A device sign-in in flight, at `oidc/devices/<handle hash>`.
#[derive(Serialize, Deserialize)]
struct DeviceRecord {
    /// The provider's id.
    provider: String,
    /// The provider's device code, sealed for this record's key.
    sealed: String,
    /// When it ends, milliseconds since the Unix epoch (the lease clears it soon after).
    expires_ms: u64,
    /// Seconds between two polls of the provider.
    interval: u64,
    /// The provider is polled no sooner than this.
    next_poll_ms: u64,
    /// The network the sign-in began from (an IPv6 host by its /64), for the session's label:
    /// the code may be entered by someone other than who started it (RFC 8628 §5.4).
    #[serde(default)]
    from: String,
}

/// The sealing context of a device record: its key.
fn context(handle_hash: &str) -> String {
    format!("oidc-device:{handle_hash}")
}

/// Sums a refusal for the audit trail, where one is kept.
fn refused(api: &Api, status: u16, addr: IpAddr, route: &str) {
    if api.audit.kept() {
        api.refusals.add(status, Some(addr), route);
    }
}

fn too_many(wait: Duration, what: &str) -> Response {
    let secs = wait.as_secs() + 1;
    let mut resp = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        format!("too many {what} from this address; wait {secs} s and try again"),
    )
    .into_response();
    resp.headers_mut().insert(header::RETRY_AFTER, secs.into());
    resp
}

/// The provider's failure as the CLI shows it: unreachable (502, try again) or refusing.
/// The caller is anyone: what the provider said goes to warden's log, not to them.
fn provider_error(p: &OperatorProvider, e: &OidcError) -> ApiError {
    tracing::warn!(provider = %p.provider.config().id, error = %e, "device sign-in: the identity provider failed");
    if e.provider_down() {
        return ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!(
                "the identity provider {} did not answer; try again later, or log in with a password",
                p.label
            ),
        );
    }
    ApiError::new(
        StatusCode::BAD_GATEWAY,
        format!(
            "the identity provider {} answered something warden cannot use; tell an owner (warden's log says what)",
            p.label
        ),
    )
}

/// The peer's network (an IPv6 host by its /64) and the body, or the answer refusing it.
async fn read<T: serde::de::DeserializeOwned>(
    api: &Api,
    req: Request,
) -> Result<(IpAddr, T), Response> {
    let addr = network(authz::peer(&req).unwrap_or(IpAddr::from([0, 0, 0, 0])));
    let ApiJson(body) = ApiJson::<T>::from_request(req, &())
        .await
        .map_err(IntoResponse::into_response)?;
    // Like a password login: none while `--audit required` cannot record it.
    if let Some(why) = api.audit.refusing() {
        return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, why).into_response());
    }
    Ok((addr, body))
}

/// `POST /v1/login/device`: the codes from the provider, the device code sealed in the store.
pub async fn start(State(api): State<Api>, req: Request) -> Response {
    let (addr, DeviceLogin { provider }) = match read(&api, req).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    if let Err(wait) = api.device_throttle.check(STARTS, addr) {
        refused(&api, 429, addr, START_ROUTE);
        return too_many(wait, "device sign-ins");
    }
    api.device_throttle.fail(STARTS, addr);
    match begin(&api, &provider, addr).await {
        Ok(started) => Json(started).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn begin(api: &Api, provider: &str, addr: IpAddr) -> Result<DeviceStarted, ApiError> {
    let Some(idp) = &api.idp else {
        return Err(ApiError::not_found(
            "no identity provider gives operator roles here; add operator_rules to an [[oidc]] table of the config, or log in with a password",
        ));
    };
    // Not the ids that do: the caller is anyone.
    let Some(p) = idp.find(provider) else {
        return Err(ApiError::not_found(format!(
            "no identity provider {provider:?} gives operator roles here; ask an owner for the id to pass to `warden login --provider`"
        )));
    };
    let live = api.store.list(keys::OIDC_DEVICES).await?.entries.len();
    if live >= MAX_LIVE {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many device sign-ins are in flight; try again in a few minutes",
        ));
    }
    let handle = warden_core::id::secret_token();
    let hash = authz::token_hash(&handle);
    // A slot of this network's share before the provider is asked; given back if the
    // sign-in never gets its record.
    api.device_live
        .take(addr, &hash, MAX_FLIGHT + LEASE_SLACK, MAX_LIVE)
        .map_err(|full| {
            let from = match full {
                Full::All => {
                    return ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "too many device sign-ins are in flight; try again in a few minutes",
                    )
                }
                Full::Network => "your address",
                Full::Site => "your network",
            };
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!("too many device sign-ins are in flight from {from}; finish one, or try again once they end (at most 15 min)"),
            )
        })?;
    let started = stored(api, idp, p, provider, addr, handle, &hash).await;
    if started.is_err() {
        api.device_live.release(&hash);
    }
    started
}

/// Asks the provider for the codes and keeps the device code sealed under `hash`.
async fn stored(
    api: &Api,
    idp: &provider_operators::OperatorIdp,
    p: &OperatorProvider,
    provider: &str,
    addr: IpAddr,
    handle: String,
    hash: &str,
) -> Result<DeviceStarted, ApiError> {
    let d = p
        .provider
        .device_start()
        .await
        .map_err(|e| provider_error(p, &e))?;
    let flight = Duration::from_secs(d.expires_in.max(1)).min(MAX_FLIGHT);
    let now = now_ms();
    let record = DeviceRecord {
        provider: provider.to_owned(),
        sealed: idp.sealer.seal(&context(hash), &d.device_code),
        expires_ms: now + flight.as_millis() as u64,
        interval: d.interval,
        next_poll_ms: now,
        from: addr.to_string(),
    };
    // A little past the flight: a poll just before the end still finds its record.
    let lease = api.store.grant_lease(flight + LEASE_SLACK).await?;
    warden_store::put_json(&*api.store, &keys::oidc_device(hash), &record, Some(lease)).await?;
    Ok(DeviceStarted {
        handle,
        user_code: d.user_code,
        verification_uri: d.verification_uri,
        verification_uri_complete: d.verification_uri_complete,
        interval: d.interval,
        expires_in: flight.as_secs(),
    })
}

/// `POST /v1/login/device/poll`: one poll of the provider, and the session once approved.
pub async fn poll(State(api): State<Api>, req: Request) -> Response {
    let (addr, DevicePollRequest { handle }) = match read(&api, req).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    if let Err(wait) = api.device_throttle.check(BAD_POLLS, addr) {
        refused(&api, 429, addr, POLL_ROUTE);
        return too_many(wait, "polls of unknown sign-ins");
    }
    match poll_once(&api, &handle, addr).await {
        Ok(answer) => Json(answer).into_response(),
        Err(e) => {
            let status = e.status().as_u16();
            if status == 404 {
                api.device_throttle.fail(BAD_POLLS, addr);
            }
            if (400..500).contains(&status) {
                refused(&api, status, addr, POLL_ROUTE);
            }
            e.into_response()
        }
    }
}

fn again(provider: &str) -> String {
    format!("run `warden login --provider {provider}` again")
}

async fn poll_once(api: &Api, handle: &str, addr: IpAddr) -> Result<DevicePollAnswer, ApiError> {
    let hash = authz::token_hash(handle);
    let key = keys::oidc_device(&hash);
    let gone = || {
        ApiError::not_found(
            "no such device sign-in: it ended, expired or never began; run `warden login --provider ID` again",
        )
    };
    let entry = api.store.get(&key).await?.ok_or_else(gone)?;
    let mut record: DeviceRecord = warden_store::decode(&key, &entry.value).map_err(|_| gone())?;
    let (Some(idp), now) = (&api.idp, now_ms()) else {
        return Err(gone());
    };
    let Some(p) = idp.find(&record.provider) else {
        end(api, &key, &hash).await?;
        return Err(gone());
    };
    if now >= record.expires_ms {
        end(api, &key, &hash).await?;
        return Err(ApiError::new(
            StatusCode::GONE,
            format!("the sign-in's codes expired; {}", again(&record.provider)),
        ));
    }
    if now < record.next_poll_ms {
        return Ok(DevicePollAnswer::SlowDown {
            interval: record.interval,
        });
    }
    // Claim this poll: of two polls at once, one calls the provider, the other slows down.
    record.next_poll_ms = now + record.interval * 1000;
    let bytes = serde_json::to_vec(&record).map_err(ApiError::internal)?;
    let rev = match api
        .store
        .compare_and_swap(&key, Some(entry.mod_revision), Some(bytes), entry.lease)
        .await?
    {
        CasOutcome::Done(rev) => rev,
        CasOutcome::Conflict { .. } => {
            return Ok(DevicePollAnswer::SlowDown {
                interval: record.interval,
            })
        }
    };
    let code = match idp.sealer.open(&context(&hash), &record.sealed) {
        Ok(c) => c,
        Err(e) => {
            end(api, &key, &hash).await?;
            return Err(ApiError::new(
                StatusCode::GONE,
                format!("{e}: {}", again(&record.provider)),
            ));
        }
    };
    let tokens = match asked(p, &code, &record).await {
        Ok(Some(t)) => t,
        Ok(None) => {
            return Ok(DevicePollAnswer::Pending {
                interval: record.interval,
            })
        }
        Err(Asked::SlowDown) => {
            record.interval += 5;
            if let Ok(bytes) = serde_json::to_vec(&record) {
                let _ = api
                    .store
                    .compare_and_swap(&key, Some(rev), Some(bytes), entry.lease)
                    .await;
            }
            return Ok(DevicePollAnswer::SlowDown {
                interval: record.interval,
            });
        }
        Err(Asked::Ended(e)) => {
            end(api, &key, &hash).await?;
            return Err(e);
        }
        Err(Asked::Failed(e)) => return Err(e),
    };
    // Only the poll whose delete found the record finishes the sign-in.
    if end(api, &key, &hash).await?.is_none() {
        return Err(gone());
    }
    if let Some(l) = entry.lease {
        let _ = api.store.revoke_lease(l).await;
    }
    let token = finish(api, p, tokens, &record.from, addr).await?;
    Ok(DevicePollAnswer::Done { token })
}

/// Deletes the device record at `key` and gives its slot back.
async fn end(api: &Api, key: &str, hash: &str) -> Result<Option<warden_store::Revision>, ApiError> {
    api.device_live.release(hash);
    Ok(api.store.delete(key).await?)
}

/// How a poll of the provider went wrong.
enum Asked {
    /// Polled too often: wait longer.
    SlowDown,
    /// The sign-in is over (expired, declined, refused): the record goes.
    Ended(ApiError),
    /// The provider did not answer: poll again.
    Failed(ApiError),
}

/// One poll of the provider: the tokens, `None` while pending.
async fn asked(
    p: &OperatorProvider,
    code: &Secret,
    record: &DeviceRecord,
) -> Result<Option<Tokens>, Asked> {
    let id = &record.provider;
    match p.provider.device_poll(code).await {
        Ok(DevicePoll::Done(t)) => Ok(Some(t)),
        Ok(DevicePoll::Pending) => Ok(None),
        Ok(DevicePoll::SlowDown) => Err(Asked::SlowDown),
        Err(OidcError::Refused { error }) => Err(Asked::Ended(match error.as_str() {
            "expired_token" => ApiError::new(
                StatusCode::GONE,
                format!(
                    "the code expired before the sign-in at {} was finished; {}",
                    p.label,
                    again(id)
                ),
            ),
            "access_denied" => ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "the sign-in was declined at {}; {} to try again",
                    p.label,
                    again(id)
                ),
            ),
            other => ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "the identity provider {} refused the sign-in ({other}); {}",
                    p.label,
                    again(id)
                ),
            ),
        })),
        Err(e) if e.provider_down() => Err(Asked::Failed(provider_error(p, &e))),
        Err(e) => {
            tracing::warn!(provider = %id, error = %e, "device sign-in: the provider's tokens did not check out");
            Err(Asked::Ended(ApiError::new(
                StatusCode::UNAUTHORIZED,
                format!(
                    "the identity provider {}'s answer did not check out (warden's log says why); {}",
                    p.label,
                    again(id)
                ),
            )))
        }
    }
}

/// The person's roles from their claims, their operator written, a session token made.
async fn finish(
    api: &Api,
    p: &OperatorProvider,
    tokens: Tokens,
    from: &str,
    addr: IpAddr,
) -> Result<warden_api_types::IssuedToken, ApiError> {
    // Both addresses: a code entered by someone other than who started the sign-in
    // (RFC 8628 §5.4) shows as a start from elsewhere.
    let how = format!("device login started from {from}, finished from {addr}");
    let (token, record) = provider_operators::sign_in(api, p, tokens, &how, POLL_ROUTE).await?;
    Ok(super::tokens::issued(token, record))
}
