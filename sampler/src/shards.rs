//! Why a sharded run cannot complete: the shards of an array job never
//! meet, and a shard launched with other settings (another seed, another
//! shard count) writes its summary under another run's id, so the run it
//! was meant for waits for it forever. When a shard finds its run
//! incomplete, it looks at the other runs' shard summaries at the location
//! for the shards its run lacks, and names the first setting that differs.

use offgnn_shared::samples::ShardSummary;
use offgnn_shared::store::Store;
use serde_json::Value;

use crate::error::{Error, Result};

/// Where every run's shard summaries live: `_shards/RUN/shard-I-of-N.json`.
const SHARDS: &str = "_shards/";

/// The shard index and count a summary's name gives.
fn parse_name(name: &str) -> Option<(&str, u32, u32)> {
    let (run, file) = name.strip_prefix(SHARDS)?.split_once('/')?;
    let (shard, count) = file
        .strip_prefix("shard-")?
        .strip_suffix(".json")?
        .split_once("-of-")?;
    Some((run, shard.parse().ok()?, count.parse().ok()?))
}

/// The settings that make two shards parts of one run, by name, in a fixed
/// order: the shard count, then every sampling parameter.
fn settings(s: &ShardSummary) -> Vec<(String, String)> {
    let mut out = vec![("--num-shards".to_string(), s.num_shards.to_string())];
    if let Ok(Value::Object(params)) = serde_json::to_value(&s.params) {
        out.extend(params.into_iter().map(|(k, v)| (k, v.to_string())));
    }
    out
}

/// The first setting on which `theirs` differs from `ours`, as
/// `NAME THEIRS (this shard: OURS)`.
fn first_difference(ours: &ShardSummary, theirs: &ShardSummary) -> Option<String> {
    let theirs = settings(theirs);
    settings(ours)
        .into_iter()
        .zip(theirs)
        .find(|(a, b)| a != b)
        .map(|((name, ours), (_, theirs))| format!("{name} {theirs} (this shard: {ours})"))
}

/// Where `ours` (a shard of an incomplete run, whose shards `missing` are
/// absent) meets a shard of the same dataset sampled under other settings
/// that stands in for one of them: the line that says so. `None` where no
/// other run's summary explains the gap (its shards may still be running).
pub(crate) fn conflict(
    store: &Store,
    ours: &ShardSummary,
    missing: &[u32],
) -> Result<Option<Error>> {
    let mut others: Vec<(String, u32, u32)> = store
        .list(SHARDS)?
        .into_iter()
        .filter_map(|(name, _)| {
            let (run, shard, count) = parse_name(&name)?;
            (run != ours.run_id).then_some((name.clone(), shard, count))
        })
        .collect();
    // A summary for a shard this run lacks comes first; then any of another
    // shard count, which stands in for a shard by another numbering.
    others.sort_by_key(|(name, shard, count)| {
        let stands_in = *count == ours.num_shards && missing.contains(shard);
        (!stands_in, name.clone())
    });
    for (name, shard, count) in others {
        if count == ours.num_shards && !missing.contains(&shard) {
            continue;
        }
        let Ok(theirs) = serde_json::from_slice::<ShardSummary>(&store.get(&name)?) else {
            continue;
        };
        if theirs.dataset.fingerprint != ours.dataset.fingerprint {
            continue;
        }
        let Some(setting) = first_difference(ours, &theirs) else {
            continue;
        };
        let lacking: Vec<String> = missing.iter().map(u32::to_string).collect();
        return Ok(Some(Error::InvalidArgument(format!(
            "this run cannot complete: it lacks shard(s) {} of {}, and {} is shard {shard} of {count} sampled with {setting}; run the missing shards again with this shard's settings (or every shard with the other's), or remove {} if that run is abandoned",
            lacking.join(", "),
            ours.num_shards,
            store.join(&name),
            store.join(&format!("{SHARDS}{}", theirs.run_id)),
        ))));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_into_run_shard_and_count() {
        assert_eq!(
            parse_name("_shards/abc/shard-00003-of-00004.json"),
            Some(("abc", 3, 4))
        );
        assert_eq!(parse_name("_shards/abc/other.json"), None);
        assert_eq!(parse_name("samples/abc/shard-00003-of-00004.json"), None);
    }
}
