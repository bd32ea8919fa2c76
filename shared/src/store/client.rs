//! The `object_store` client behind a [`Store`](super::Store): how one is
//! built from a URL, how its requests are retried, the tokio runtime they
//! run on, and the fault injection tests ask for.

use std::sync::{Arc, OnceLock};

use object_store::ObjectStore;
use object_store::path::Path;
use tokio::runtime::Runtime;

use crate::error::{Error, Result};

/// Tries of an idempotent request before its error is returned. HTTP stores
/// retry inside `object_store` too; this covers what reaches us anyway (a
/// connection dropped mid-body, a 5xx after its retries, injected faults).
pub(super) const ATTEMPTS: u32 = 4;
/// The first wait before a retry; each further one doubles it.
const FIRST_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);

/// Whether an error may pass if the request is sent again: I/O failures
/// are; answers about the object (missing, exists, changed), refusals
/// (unauthenticated, not implemented) and what an HTTP store's client has
/// already retried with backoff (see [`http_retry`]) are not.
fn transient(e: &object_store::Error) -> bool {
    match e {
        object_store::Error::Generic { store, .. } => {
            !matches!(*store, "S3" | "GCS" | "MicrosoftAzure" | "HTTP")
        }
        object_store::Error::JoinError { .. } => true,
        _ => false,
    }
}

/// How the HTTP stores' clients retry: with exponential backoff (each wait
/// drawn between 300 ms and twice the last, at most 5 s), up to 10 times or
/// 20 s, so that an outage of a few seconds passes unnoticed and a store
/// that is gone is reported within 20-odd seconds, not after object_store's
/// default three minutes. The waits are jittered, so only their floor is
/// sure: 10 x 300 ms = 3 s, a floor set high enough that a short outage
/// cannot use up every retry.
pub(super) fn http_retry() -> object_store::RetryConfig {
    object_store::RetryConfig {
        backoff: object_store::BackoffConfig {
            init_backoff: std::time::Duration::from_millis(300),
            max_backoff: std::time::Duration::from_secs(5),
            base: 2.0,
        },
        max_retries: 10,
        retry_timeout: std::time::Duration::from_secs(20),
    }
}

/// The store behind a URL, configured by `options` (object_store keys),
/// with [`http_retry`] for S3, GCS and Azure (and http(s):// in
/// `super::http`).
pub(super) fn build_store(
    url: &url::Url,
    options: Vec<(String, String)>,
) -> object_store::Result<(Box<dyn ObjectStore>, Path)> {
    use object_store::ObjectStoreScheme as Scheme;
    macro_rules! configured {
        ($builder:expr) => {{
            let mut builder = $builder.with_url(url.as_str()).with_retry(http_retry());
            for (key, value) in &options {
                if let Ok(key) = key.parse() {
                    builder = builder.with_config(key, value);
                }
            }
            Box::new(builder.build()?) as Box<dyn ObjectStore>
        }};
    }
    let (scheme, path) = Scheme::parse(url)?;
    let store = match scheme {
        Scheme::AmazonS3 => configured!(object_store::aws::AmazonS3Builder::new()),
        Scheme::GoogleCloudStorage => {
            configured!(object_store::gcp::GoogleCloudStorageBuilder::new())
        }
        Scheme::MicrosoftAzure => configured!(object_store::azure::MicrosoftAzureBuilder::new()),
        Scheme::Http => {
            // A plain http:// location is what the user asked for: the
            // client refuses unencrypted HTTP unless told it may.
            let mut options = options;
            if url.scheme() == "http" {
                options.push(("allow_http".into(), "true".into()));
            }
            return super::http::build(url, options);
        }
        _ => return object_store::parse_url_opts(url, options),
    };
    Ok((store, path))
}

/// Runs `op` until it succeeds, fails for good, or has been tried
/// [`ATTEMPTS`] times, sleeping 100 ms, 200 ms, 400 ms between tries.
pub(super) fn with_retry<T, F, Fut>(what: &str, mut op: F) -> object_store::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = object_store::Result<T>>,
{
    runtime().block_on(async {
        let mut wait = FIRST_BACKOFF;
        let mut attempt = 1;
        loop {
            match op().await {
                Err(e) if transient(&e) && attempt < ATTEMPTS => {
                    tracing::debug!(
                        "{what}: {e}; retrying in {wait:?} (attempt {attempt} of {ATTEMPTS})"
                    );
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                    attempt += 1;
                }
                result => return result,
            }
        }
    })
}

/// The store as opened, wrapped for fault injection when
/// [`crate::store::faults::ENV`] asks for it.
pub(super) fn maybe_faulty(inner: Arc<dyn ObjectStore>) -> Result<Arc<dyn ObjectStore>> {
    let Ok(text) = std::env::var(crate::store::faults::ENV) else {
        return Ok(inner);
    };
    let plan = crate::store::faults::FaultPlan::parse(&text).map_err(Error::InvalidArgument)?;
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            "fault injection is on ({}={text})",
            crate::store::faults::ENV
        );
    }
    Ok(Arc::new(crate::store::faults::FaultyStore::new(
        inner, plan,
    )))
}

pub(super) fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("offgnn-store")
            .enable_all()
            .build()
            .expect("a tokio runtime for object-store I/O")
    })
}
