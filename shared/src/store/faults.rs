//! Fault injection for object stores: an `ObjectStore` that passes every
//! request to another one but fails or stalls a share of them, so that tests
//! (and a person chasing a bug) can watch the programs meet a flaky store.
//!
//! Off unless asked for. [`crate::store::Store::open`] wraps every store it
//! opens when `OFFGNN_STORE_FAULTS` is set, for example
//! `OFFGNN_STORE_FAULTS=fail=0.2,stall=0.1,stall_ms=300,seed=7`:
//! - `fail`: the share of requests that fail with a transient error;
//! - `stall`: the share of requests held back `stall_ms` before they go on;
//! - `seed`: the draws are a deterministic sequence from it.
//!
//! Every kind of request can be hit: whole puts, each part of a multipart
//! upload and its completion, gets (whole and ranged), heads, lists, deletes
//! and copies.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, UploadPart,
};
use rand::{Rng, SeedableRng};

/// The environment variable that turns fault injection on.
pub const ENV: &str = "OFFGNN_STORE_FAULTS";

/// How often requests fail or stall.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FaultPlan {
    pub fail: f64,
    pub stall: f64,
    pub stall_for: Duration,
    pub seed: u64,
}

impl FaultPlan {
    /// Parses `fail=0.2,stall=0.1,stall_ms=300,seed=7` (every key optional).
    pub fn parse(text: &str) -> Result<FaultPlan, String> {
        let mut plan = FaultPlan {
            fail: 0.0,
            stall: 0.0,
            stall_for: Duration::from_millis(200),
            seed: 0,
        };
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| format!("{ENV}: '{item}' is not key=value"))?;
            let bad = || format!("{ENV}: {key}={value} is not a valid value");
            match key {
                "fail" | "stall" => {
                    let p: f64 = value.parse().map_err(|_| bad())?;
                    if !(0.0..=1.0).contains(&p) {
                        return Err(bad());
                    }
                    if key == "fail" {
                        plan.fail = p;
                    } else {
                        plan.stall = p;
                    }
                }
                "stall_ms" => {
                    plan.stall_for = Duration::from_millis(value.parse().map_err(|_| bad())?)
                }
                "seed" => plan.seed = value.parse().map_err(|_| bad())?,
                _ => {
                    return Err(format!(
                        "{ENV}: unknown key '{key}' (fail, stall, stall_ms, seed)"
                    ));
                }
            }
        }
        Ok(plan)
    }
}

/// Counts of what the wrapper did.
#[derive(Debug, Default)]
pub struct FaultCounts {
    pub requests: AtomicU64,
    pub failed: AtomicU64,
    pub stalled: AtomicU64,
}

struct Dice {
    plan: FaultPlan,
    rng: Mutex<rand_pcg::Pcg64Mcg>,
    counts: Arc<FaultCounts>,
}

impl Dice {
    /// One request's fate: `Err` to fail it; a stall is slept here.
    async fn roll(&self, what: &str) -> object_store::Result<()> {
        let (fail, stall) = {
            let mut rng = self
                .rng
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            (
                rng.random_bool(self.plan.fail),
                rng.random_bool(self.plan.stall),
            )
        };
        self.counts.requests.fetch_add(1, Ordering::Relaxed);
        if stall {
            self.counts.stalled.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(self.plan.stall_for).await;
        }
        if fail {
            self.counts.failed.fetch_add(1, Ordering::Relaxed);
            return Err(injected(what));
        }
        Ok(())
    }
}

fn injected(what: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "fault injection",
        source: Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            format!("injected fault in {what}"),
        )),
    }
}

/// An `ObjectStore` that fails or stalls a share of the requests to `inner`.
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    dice: Arc<Dice>,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn ObjectStore>, plan: FaultPlan) -> Self {
        FaultyStore {
            inner,
            dice: Arc::new(Dice {
                plan,
                rng: Mutex::new(rand_pcg::Pcg64Mcg::seed_from_u64(plan.seed)),
                counts: Arc::default(),
            }),
        }
    }

    /// What it has done so far.
    #[cfg(test)]
    pub fn counts(&self) -> Arc<FaultCounts> {
        Arc::clone(&self.dice.counts)
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

impl fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyStore")
            .field("plan", &self.dice.plan)
            .finish()
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.dice.roll("put").await?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.dice.roll("multipart start").await?;
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(FaultyUpload {
            inner,
            dice: Arc::clone(&self.dice),
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.dice.roll("get").await?;
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let dice = Arc::clone(&self.dice);
        let inner = Arc::clone(&self.inner);
        let mut locations = Some(locations);
        futures::stream::once(async move { dice.roll("delete").await })
            .flat_map(move |fate| match fate {
                Ok(()) => inner.delete_stream(
                    locations
                        .take()
                        .expect("a stream of one fate is mapped once"),
                ),
                Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let dice = Arc::clone(&self.dice);
        let inner = Arc::clone(&self.inner);
        let prefix = prefix.cloned();
        futures::stream::once(async move { dice.roll("list").await })
            .flat_map(move |fate| match fate {
                Ok(()) => inner.list(prefix.as_ref()),
                Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
            })
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.dice.roll("list").await?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.dice.roll("copy").await?;
        self.inner.copy_opts(from, to, options).await
    }
}

/// A multipart upload whose parts and completion can fail.
#[derive(Debug)]
struct FaultyUpload {
    inner: Box<dyn MultipartUpload>,
    dice: Arc<Dice>,
}

impl fmt::Debug for Dice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dice").field("plan", &self.plan).finish()
    }
}

#[async_trait]
impl MultipartUpload for FaultyUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let part = self.inner.put_part(data);
        let dice = Arc::clone(&self.dice);
        Box::pin(async move {
            dice.roll("multipart part").await?;
            part.await
        })
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.dice.roll("multipart complete").await?;
        self.inner.complete().await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.inner.abort().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_parse_and_bad_ones_are_named() {
        let p = FaultPlan::parse("fail=0.25, stall=0.5,stall_ms=20,seed=9").unwrap();
        assert_eq!(
            p,
            FaultPlan {
                fail: 0.25,
                stall: 0.5,
                stall_for: Duration::from_millis(20),
                seed: 9
            }
        );
        assert!(FaultPlan::parse("fail=2").unwrap_err().contains("fail=2"));
        assert!(
            FaultPlan::parse("boom=1")
                .unwrap_err()
                .contains("unknown key")
        );
        assert!(FaultPlan::parse("fail").unwrap_err().contains("key=value"));
    }
}
