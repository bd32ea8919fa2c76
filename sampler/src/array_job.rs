//! Which shard of a sharded run this process samples: from `--shard` and
//! `--num-shards`, or, where they are not given, from the array-job index of
//! the engine the sampler runs under (a Kubernetes Indexed Job, an AWS Batch
//! array job, a Slurm job array), so that one command line serves every task
//! of the array.
//!
//! [`resolve`] is a pure function of the flags and an environment lookup:
//! the binary passes the process environment, tests a map.

use crate::error::{Error, Result};

/// The shard count where the engine tells its tasks none (a Kubernetes
/// Indexed Job's `completions` is not in its pods' environment).
pub const NUM_SHARDS_VAR: &str = "OFFGNN_NUM_SHARDS";

const K8S_INDEX: &str = "JOB_COMPLETION_INDEX";
const AWS_INDEX: &str = "AWS_BATCH_JOB_ARRAY_INDEX";
const AWS_SIZE: &str = "AWS_BATCH_JOB_ARRAY_SIZE";
const SLURM_ID: &str = "SLURM_ARRAY_TASK_ID";
const SLURM_COUNT: &str = "SLURM_ARRAY_TASK_COUNT";
const SLURM_MIN: &str = "SLURM_ARRAY_TASK_MIN";
const SLURM_MAX: &str = "SLURM_ARRAY_TASK_MAX";

/// An engine that runs one command as an array of indexed tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Kubernetes,
    AwsBatch,
    Slurm,
}

impl Engine {
    fn name(self) -> &'static str {
        match self {
            Engine::Kubernetes => "Kubernetes Indexed Job",
            Engine::AwsBatch => "AWS Batch array job",
            Engine::Slurm => "Slurm array job",
        }
    }
}

/// This process's shard, and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    pub shard: u32,
    pub num_shards: u32,
    /// The engine whose environment gave the shard or the count.
    pub engine: Option<Engine>,
    /// The flags and variables the two numbers came from, as
    /// `NAME=value`, `--flag value`; empty when nothing was given.
    pub sources: Vec<String>,
    /// Where `--shard` chose another shard than the engine's index says:
    /// the line that warns of it.
    pub overridden: Option<String>,
}

impl Assignment {
    /// The line logged at the start of a run whose shard the environment
    /// chose in part, or `None` where only flags (or nothing) did.
    pub fn log_line(&self) -> Option<String> {
        let from_env = self.sources.iter().any(|s| !s.starts_with("--"));
        from_env.then(|| {
            format!(
                "{}: shard {} of {} ({})",
                self.engine.map_or("environment", Engine::name),
                self.shard,
                self.num_shards,
                self.sources.join(", ")
            )
        })
    }
}

/// A variable of the environment that is set (an empty value counts as unset).
struct Var {
    name: &'static str,
    value: u32,
}

impl Var {
    fn source(&self) -> String {
        format!("{}={}", self.name, self.value)
    }
}

fn bad(message: String) -> Error {
    Error::InvalidArgument(message)
}

/// Reads `name` as a whole number, if it is set.
fn read(env: &dyn Fn(&str) -> Option<String>, name: &'static str) -> Result<Option<Var>> {
    let Some(text) = env(name).filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    match text.trim().parse::<u32>() {
        Ok(value) => Ok(Some(Var { name, value })),
        Err(_) => Err(bad(format!(
            "{name}={text:?} is not a whole number (the sampler reads it to choose its shard)"
        ))),
    }
}

/// What one engine's variables say: a shard index, and the count where the
/// engine gives one.
struct EngineIndex {
    engine: Engine,
    index: u32,
    index_source: String,
    count: Option<Var>,
}

fn kubernetes(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<EngineIndex>> {
    Ok(read(env, K8S_INDEX)?.map(|i| EngineIndex {
        engine: Engine::Kubernetes,
        index: i.value,
        index_source: i.source(),
        count: None,
    }))
}

fn aws_batch(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<EngineIndex>> {
    match (read(env, AWS_INDEX)?, read(env, AWS_SIZE)?) {
        (None, None) => Ok(None),
        (Some(i), Some(size)) => Ok(Some(EngineIndex {
            engine: Engine::AwsBatch,
            index: i.value,
            index_source: i.source(),
            count: Some(size),
        })),
        (Some(i), None) => Err(bad(format!(
            "{} is set without {AWS_SIZE} (AWS Batch sets both in an array job's children); pass --shard and --num-shards",
            i.source()
        ))),
        (None, Some(size)) => Err(bad(format!(
            "{} is set without {AWS_INDEX}: no shard index; pass --shard and --num-shards",
            size.source()
        ))),
    }
}

fn slurm(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<EngineIndex>> {
    let (id, count) = match (read(env, SLURM_ID)?, read(env, SLURM_COUNT)?) {
        (None, None) => return Ok(None),
        (Some(id), Some(count)) => (id, count),
        (Some(id), None) => {
            return Err(bad(format!(
                "{} is set without {SLURM_COUNT} (Slurm sets both in an array job); pass --shard and --num-shards",
                id.source()
            )));
        }
        (None, Some(count)) => {
            return Err(bad(format!(
                "{} is set without {SLURM_ID}: no shard index; pass --shard and --num-shards",
                count.source()
            )));
        }
    };
    let Some(min) = read(env, SLURM_MIN)? else {
        return Err(bad(format!(
            "{} is set without {SLURM_MIN} (Slurm sets both in an array job); pass --shard and --num-shards",
            id.source()
        )));
    };
    if id.value < min.value {
        return Err(bad(format!(
            "{} is below {}: not a task of this array; pass --shard and --num-shards",
            id.source(),
            min.source()
        )));
    }
    // Shards are 0..count: the array must be one unbroken range of indices
    // (an array of 1,3,7 or 0-12:4 has indices that no shard numbering fits).
    if let Some(max) = read(env, SLURM_MAX)?
        && max.value.checked_sub(min.value).map(|span| span as u64 + 1) != Some(count.value as u64)
    {
        return Err(bad(format!(
            "{}, {} and {}: the array's indices are not one unbroken range; submit it as --array={}-{}",
            min.source(),
            max.source(),
            count.source(),
            min.value,
            min.value as u64 + count.value as u64 - 1
        )));
    }
    Ok(Some(EngineIndex {
        engine: Engine::Slurm,
        index: id.value - min.value,
        index_source: if min.value == 0 {
            id.source()
        } else {
            format!("{} - {}", id.source(), min.source())
        },
        count: Some(count),
    }))
}

/// The warning for `--shard` given where an engine's index says another.
fn overridden(shard: u32, engine: Option<&EngineIndex>) -> Option<String> {
    engine.filter(|e| e.index != shard).map(|e| {
        format!(
            "--shard {shard} wins over {} of this {}, which names shard {}",
            e.index_source,
            e.engine.name(),
            e.index
        )
    })
}

/// Both numbers given as flags: the environment does not choose, but a
/// flag that disagrees with the engine's index is worth a warning (what
/// the environment holds is not checked further).
fn by_flags(shard: u32, num_shards: u32, env: &dyn Fn(&str) -> Option<String>) -> Assignment {
    let engine = [kubernetes, aws_batch, slurm]
        .into_iter()
        .find_map(|engine| engine(env).ok().flatten());
    Assignment {
        shard,
        num_shards,
        engine: None,
        sources: vec![
            format!("--shard {shard}"),
            format!("--num-shards {num_shards}"),
        ],
        overridden: overridden(shard, engine.as_ref()),
    }
}

/// This process's shard and shard count. Flags win: both given, the
/// environment is not read. Otherwise the missing number comes from the
/// environment, and a flag that disagrees with it, an index without a count
/// (or a count without an index), an index out of range or a value that is
/// no number is refused in one line that names the variables.
pub fn resolve(
    shard: Option<u32>,
    num_shards: Option<u32>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Assignment> {
    if let (Some(shard), Some(num_shards)) = (shard, num_shards) {
        return Ok(by_flags(shard, num_shards, env));
    }

    let mut found = Vec::new();
    for engine in [kubernetes, aws_batch, slurm] {
        found.extend(engine(env)?);
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|e| e.engine.name()).collect();
        return Err(bad(format!(
            "the environment holds the array indices of {} ({}); pass --shard and --num-shards",
            names.join(" and "),
            found
                .iter()
                .map(|e| e.index_source.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let engine = found.pop();
    let named_count = read(env, NUM_SHARDS_VAR)?;

    // The count: --num-shards, else OFFGNN_NUM_SHARDS and the engine's own,
    // which must agree where both are set.
    let engine_count = engine.as_ref().and_then(|e| e.count.as_ref());
    let (count, count_source) = match (num_shards, &named_count, engine_count) {
        (Some(n), _, Some(c)) if c.value != n => {
            return Err(bad(format!(
                "--num-shards {n} disagrees with {} of this {}; give both --shard and --num-shards to choose by hand",
                c.source(),
                engine
                    .as_ref()
                    .expect("a count comes with its engine")
                    .engine
                    .name()
            )));
        }
        (Some(n), _, _) => (Some(n), format!("--num-shards {n}")),
        (None, Some(named), Some(c)) if named.value != c.value => {
            return Err(bad(format!(
                "{} disagrees with {}; unset one, or pass --num-shards",
                named.source(),
                c.source()
            )));
        }
        (None, _, Some(c)) => (Some(c.value), c.source()),
        (None, Some(named), None) => (Some(named.value), named.source()),
        (None, None, None) => (None, String::new()),
    };

    let overridden = shard.and_then(|s| overridden(s, engine.as_ref()));
    let (shard, shard_source) = match (shard, &engine) {
        (Some(s), _) => (s, format!("--shard {s}")),
        (None, Some(e)) => (e.index, e.index_source.clone()),
        (None, None) => match count {
            // No index anywhere: one shard is the whole run, as without flags.
            None | Some(1) => (0, String::new()),
            Some(n) => {
                return Err(bad(format!(
                    "{count_source} names {n} shards but not which one this is: pass --shard, or run as an array job ({K8S_INDEX}, {AWS_INDEX} or {SLURM_ID} sets it)"
                )));
            }
        },
    };
    let Some(count) = count else {
        return match &engine {
            Some(e) if e.engine == Engine::Kubernetes => Err(bad(format!(
                "{} gives the shard but nothing gives the number of shards: a Kubernetes Indexed Job does not tell its pods its completions; set {NUM_SHARDS_VAR} to them (or pass --num-shards)",
                e.index_source
            ))),
            // --shard alone, as before the environment was read: shard 0 is
            // the whole run, and another is out of range of 1 shard.
            _ => Ok(Assignment {
                shard,
                num_shards: 1,
                engine: None,
                sources: [shard_source]
                    .into_iter()
                    .filter(|s| !s.is_empty())
                    .collect(),
                overridden,
            }),
        };
    };
    if count == 0 {
        return Err(bad(format!(
            "{count_source}: the number of shards must be at least 1"
        )));
    }
    if shard >= count {
        return Err(bad(format!(
            "{shard_source} gives shard {shard}, out of range for {count} shards ({count_source}; shards are 0 to {})",
            count - 1
        )));
    }
    Ok(Assignment {
        shard,
        num_shards: count,
        engine: engine.map(|e| e.engine),
        sources: [shard_source, count_source]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect(),
        overridden,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn resolve_in(
        shard: Option<u32>,
        num_shards: Option<u32>,
        vars: &[(&str, &str)],
    ) -> Result<Assignment> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        resolve(shard, num_shards, &|k| map.get(k).cloned())
    }

    fn ok(shard: Option<u32>, num_shards: Option<u32>, vars: &[(&str, &str)]) -> Assignment {
        resolve_in(shard, num_shards, vars).unwrap_or_else(|e| panic!("{vars:?}: {e}"))
    }

    /// The one-line refusal, checked to name every part of `want`.
    fn refused(shard: Option<u32>, num_shards: Option<u32>, vars: &[(&str, &str)], want: &[&str]) {
        let err = resolve_in(shard, num_shards, vars)
            .expect_err(&format!("{vars:?} should be refused"))
            .to_string();
        assert_eq!(err.lines().count(), 1, "{err}");
        for w in want {
            assert!(err.contains(w), "{err} should mention {w}");
        }
    }

    const SLURM_2_OF_4: &[(&str, &str)] = &[
        ("SLURM_ARRAY_TASK_ID", "7"),
        ("SLURM_ARRAY_TASK_MIN", "5"),
        ("SLURM_ARRAY_TASK_MAX", "8"),
        ("SLURM_ARRAY_TASK_COUNT", "4"),
    ];

    #[test]
    fn without_flags_or_an_array_job_the_run_is_whole() {
        let a = ok(None, None, &[("SLURM_JOB_ID", "12")]);
        assert_eq!((a.shard, a.num_shards, a.engine), (0, 1, None));
        assert_eq!(a.log_line(), None);
    }

    #[test]
    fn each_engine_gives_shard_and_count() {
        let a = ok(None, None, SLURM_2_OF_4);
        assert_eq!((a.shard, a.num_shards), (2, 4));
        assert_eq!(a.engine, Some(Engine::Slurm));
        assert_eq!(
            a.log_line().unwrap(),
            "Slurm array job: shard 2 of 4 (SLURM_ARRAY_TASK_ID=7 - SLURM_ARRAY_TASK_MIN=5, SLURM_ARRAY_TASK_COUNT=4)"
        );

        let a = ok(
            None,
            None,
            &[
                ("AWS_BATCH_JOB_ARRAY_INDEX", "3"),
                ("AWS_BATCH_JOB_ARRAY_SIZE", "8"),
            ],
        );
        assert_eq!((a.shard, a.num_shards), (3, 8));
        assert_eq!(a.engine, Some(Engine::AwsBatch));

        // Kubernetes gives the index; the count is OFFGNN_NUM_SHARDS or the flag.
        let a = ok(
            None,
            None,
            &[("JOB_COMPLETION_INDEX", "5"), ("OFFGNN_NUM_SHARDS", "6")],
        );
        assert_eq!((a.shard, a.num_shards), (5, 6));
        assert_eq!(
            a.log_line().unwrap(),
            "Kubernetes Indexed Job: shard 5 of 6 (JOB_COMPLETION_INDEX=5, OFFGNN_NUM_SHARDS=6)"
        );
        let a = ok(None, Some(6), &[("JOB_COMPLETION_INDEX", "5")]);
        assert_eq!((a.shard, a.num_shards), (5, 6));
        assert_eq!(
            a.log_line().unwrap(),
            "Kubernetes Indexed Job: shard 5 of 6 (JOB_COMPLETION_INDEX=5, --num-shards 6)"
        );
    }

    #[test]
    fn both_flags_win_over_any_environment() {
        let mut vars = SLURM_2_OF_4.to_vec();
        vars.push(("JOB_COMPLETION_INDEX", "not a number"));
        let a = ok(Some(1), Some(3), &vars);
        assert_eq!((a.shard, a.num_shards, a.engine), (1, 3, None));
        assert_eq!(a.log_line(), None);
    }

    #[test]
    fn one_flag_and_the_environment_agree_or_are_refused() {
        // A count that agrees with the array's is fine; one that does not is refused.
        let a = ok(None, Some(4), SLURM_2_OF_4);
        assert_eq!((a.shard, a.num_shards), (2, 4));
        refused(
            None,
            Some(3),
            SLURM_2_OF_4,
            &["--num-shards 3", "SLURM_ARRAY_TASK_COUNT=4"],
        );
        // --shard alone takes the count from the environment.
        let a = ok(Some(0), None, SLURM_2_OF_4);
        assert_eq!((a.shard, a.num_shards), (0, 4));
        let a = ok(Some(1), None, &[("OFFGNN_NUM_SHARDS", "2")]);
        assert_eq!((a.shard, a.num_shards, a.engine), (1, 2, None));
        refused(
            Some(4),
            None,
            SLURM_2_OF_4,
            &[
                "--shard 4",
                "out of range for 4 shards",
                "SLURM_ARRAY_TASK_COUNT=4",
            ],
        );
        // OFFGNN_NUM_SHARDS must agree with the engine's own count.
        let mut vars = SLURM_2_OF_4.to_vec();
        vars.push(("OFFGNN_NUM_SHARDS", "5"));
        refused(
            None,
            None,
            &vars,
            &["OFFGNN_NUM_SHARDS=5", "SLURM_ARRAY_TASK_COUNT=4"],
        );
        vars.pop();
        vars.push(("OFFGNN_NUM_SHARDS", "4"));
        assert_eq!(ok(None, None, &vars).num_shards, 4);
        // ...and the flag wins over it.
        let a = ok(
            None,
            Some(3),
            &[("JOB_COMPLETION_INDEX", "2"), ("OFFGNN_NUM_SHARDS", "9")],
        );
        assert_eq!((a.shard, a.num_shards), (2, 3));
        assert_eq!(a.overridden, None);
    }

    #[test]
    fn a_shard_flag_that_overrides_the_engine_warns() {
        let k8s = &[("JOB_COMPLETION_INDEX", "2"), ("OFFGNN_NUM_SHARDS", "4")];
        for num_shards in [None, Some(4)] {
            let a = ok(Some(1), num_shards, k8s);
            assert_eq!(a.shard, 1);
            assert_eq!(
                a.overridden.as_deref(),
                Some(
                    "--shard 1 wins over JOB_COMPLETION_INDEX=2 of this Kubernetes Indexed Job, which names shard 2"
                )
            );
        }
        assert_eq!(ok(Some(2), None, k8s).overridden, None);
        assert_eq!(ok(Some(1), Some(4), &[]).overridden, None);
        // The range names the last shard, not one past it.
        refused(
            None,
            None,
            &[("JOB_COMPLETION_INDEX", "4"), ("OFFGNN_NUM_SHARDS", "4")],
            &["shards are 0 to 3"],
        );
    }

    #[test]
    fn an_index_without_a_count_and_a_count_without_an_index_are_refused() {
        refused(
            None,
            None,
            &[("JOB_COMPLETION_INDEX", "1")],
            &["JOB_COMPLETION_INDEX=1", "OFFGNN_NUM_SHARDS", "completions"],
        );
        refused(
            None,
            None,
            &[("AWS_BATCH_JOB_ARRAY_INDEX", "1")],
            &["AWS_BATCH_JOB_ARRAY_INDEX=1", "AWS_BATCH_JOB_ARRAY_SIZE"],
        );
        refused(
            None,
            None,
            &[("AWS_BATCH_JOB_ARRAY_SIZE", "4")],
            &["AWS_BATCH_JOB_ARRAY_SIZE=4", "AWS_BATCH_JOB_ARRAY_INDEX"],
        );
        refused(
            None,
            None,
            &[("SLURM_ARRAY_TASK_ID", "1"), ("SLURM_ARRAY_TASK_MIN", "0")],
            &["SLURM_ARRAY_TASK_ID=1", "SLURM_ARRAY_TASK_COUNT"],
        );
        refused(
            None,
            None,
            &[("SLURM_ARRAY_TASK_COUNT", "4")],
            &["SLURM_ARRAY_TASK_COUNT=4", "SLURM_ARRAY_TASK_ID"],
        );
        refused(
            None,
            None,
            &[
                ("SLURM_ARRAY_TASK_ID", "1"),
                ("SLURM_ARRAY_TASK_COUNT", "4"),
            ],
            &["SLURM_ARRAY_TASK_MIN"],
        );
        refused(
            None,
            None,
            &[("OFFGNN_NUM_SHARDS", "4")],
            &["OFFGNN_NUM_SHARDS=4", "--shard", "JOB_COMPLETION_INDEX"],
        );
        refused(None, Some(4), &[], &["--num-shards 4", "--shard"]);
        // One shard needs no index.
        assert_eq!(ok(None, Some(1), &[]).num_shards, 1);
    }

    #[test]
    fn out_of_range_and_malformed_values_are_refused() {
        refused(
            None,
            None,
            &[
                ("AWS_BATCH_JOB_ARRAY_INDEX", "4"),
                ("AWS_BATCH_JOB_ARRAY_SIZE", "4"),
            ],
            &["AWS_BATCH_JOB_ARRAY_INDEX=4", "AWS_BATCH_JOB_ARRAY_SIZE=4"],
        );
        refused(
            None,
            None,
            &[("JOB_COMPLETION_INDEX", "8"), ("OFFGNN_NUM_SHARDS", "8")],
            &["JOB_COMPLETION_INDEX=8", "OFFGNN_NUM_SHARDS=8"],
        );
        refused(
            None,
            None,
            &[("JOB_COMPLETION_INDEX", "0"), ("OFFGNN_NUM_SHARDS", "0")],
            &["OFFGNN_NUM_SHARDS=0", "at least 1"],
        );
        for (name, value) in [
            ("JOB_COMPLETION_INDEX", "x"),
            ("JOB_COMPLETION_INDEX", "-1"),
            ("OFFGNN_NUM_SHARDS", "4.0"),
            ("SLURM_ARRAY_TASK_ID", "3_1"),
        ] {
            let mut vars = vec![("JOB_COMPLETION_INDEX", "0"), ("OFFGNN_NUM_SHARDS", "4")];
            vars.retain(|(k, _)| *k != name);
            vars.push((name, value));
            refused(None, None, &vars, &[name, value, "not a whole number"]);
        }
        // A stepped or listed Slurm array has indices no shard numbering fits.
        refused(
            None,
            None,
            &[
                ("SLURM_ARRAY_TASK_ID", "4"),
                ("SLURM_ARRAY_TASK_MIN", "0"),
                ("SLURM_ARRAY_TASK_MAX", "12"),
                ("SLURM_ARRAY_TASK_COUNT", "4"),
            ],
            &["SLURM_ARRAY_TASK_MAX=12", "unbroken range", "--array=0-3"],
        );
        refused(
            None,
            None,
            &[
                ("SLURM_ARRAY_TASK_ID", "1"),
                ("SLURM_ARRAY_TASK_MIN", "2"),
                ("SLURM_ARRAY_TASK_COUNT", "4"),
            ],
            &["SLURM_ARRAY_TASK_ID=1", "SLURM_ARRAY_TASK_MIN=2"],
        );
        // An empty variable is an unset one.
        assert_eq!(
            ok(None, None, &[("JOB_COMPLETION_INDEX", "")]).num_shards,
            1
        );
    }

    #[test]
    fn two_engines_at_once_are_refused() {
        let mut vars = SLURM_2_OF_4.to_vec();
        vars.push(("JOB_COMPLETION_INDEX", "1"));
        refused(
            None,
            None,
            &vars,
            &[
                "Kubernetes",
                "Slurm",
                "JOB_COMPLETION_INDEX=1",
                "--shard and --num-shards",
            ],
        );
    }
}
