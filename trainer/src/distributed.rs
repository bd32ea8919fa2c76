//! Data-parallel training on libtorch's own distributed engine, c10d: the
//! launch as torchrun or srun describes it in the environment, and a safe
//! wrapper over the process group that csrc/c10d_shim.cpp forms (a
//! TCPStore at MASTER_ADDR:MASTER_PORT, ProcessGroupGloo on the CPU,
//! ProcessGroupNCCL on CUDA). No collective or rendezvous of our own: the
//! launcher and c10d do both.
//!
//! How ranks share an epoch ([`deal`]) and combine their steps lives here
//! too, so that the trainer and its one-process check deal alike.

use std::time::Duration;

use tch::{Device, Tensor};

use crate::error::{Error, Result};

/// How this process was launched: its place in the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// torchrun or srun, for messages.
    pub launcher: &'static str,
    pub rank: u32,
    pub world: u32,
    /// This process's index among the job's processes on its machine: it
    /// picks the CUDA device, and local rank 0 stages for its machine.
    pub local_rank: u32,
    /// The job's processes on this machine (ranks `rank - local_rank` on,
    /// as torchrun and srun's block distribution number them).
    pub local_world: u32,
    pub master_addr: String,
    pub master_port: u16,
    /// Where the store lives: torchrun's agent hosts it (the workers join
    /// as clients under `/worker/attempt_N`, as torch.distributed's env://
    /// does), else rank 0 hosts it.
    pub agent_store: Option<String>,
}

fn parse<T: std::str::FromStr>(name: &str, value: &str) -> Result<T> {
    value.trim().parse().map_err(|_| {
        Error::InvalidArgument(format!(
            "{name}={value:?} is not a valid number (set by the launcher; check the job script)"
        ))
    })
}

impl Launch {
    /// Reads the launch from `env` (the process environment in the binary):
    /// torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT,
    /// or srun's SLURM_PROCID, SLURM_STEP_NUM_TASKS (SLURM_NTASKS) and
    /// SLURM_LOCALID with MASTER_ADDR and MASTER_PORT from the job script.
    /// `None` when neither launched it: the run is one process, as before.
    /// A job step of one task under srun is one process too.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<Option<Launch>> {
        let get = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let (launcher, rank, world, local_rank, local_world) = if let Some(rank) = get("RANK") {
            let world = get("WORLD_SIZE").ok_or_else(|| {
                Error::InvalidArgument(
                    "RANK is set but WORLD_SIZE is not: launch with torchrun, which sets both"
                        .into(),
                )
            })?;
            let local = get("LOCAL_RANK").unwrap_or_else(|| "0".into());
            let world = parse::<u32>("WORLD_SIZE", &world)?;
            let local_world = match get("LOCAL_WORLD_SIZE") {
                Some(v) => parse::<u32>("LOCAL_WORLD_SIZE", &v)?,
                None => world,
            };
            (
                "torchrun",
                parse::<u32>("RANK", &rank)?,
                world,
                parse::<u32>("LOCAL_RANK", &local)?,
                local_world,
            )
        } else if let (Some(rank), Some(world)) = (
            get("SLURM_PROCID"),
            get("SLURM_STEP_NUM_TASKS").or_else(|| get("SLURM_NTASKS")),
        ) {
            let world = parse::<u32>("SLURM_STEP_NUM_TASKS", &world)?;
            // sbatch's own script is a step of its own: only a step of
            // several tasks (srun) trains data-parallel.
            if world <= 1 || get("SLURM_STEP_ID").is_none() {
                return Ok(None);
            }
            let local = get("SLURM_LOCALID").unwrap_or_else(|| "0".into());
            let node = get("SLURM_NODEID").unwrap_or_else(|| "0".into());
            let local_world = match get("SLURM_STEP_TASKS_PER_NODE") {
                Some(v) => tasks_on_node(&v, parse::<u32>("SLURM_NODEID", &node)?).ok_or_else(
                    || {
                        Error::InvalidArgument(format!(
                            "SLURM_STEP_TASKS_PER_NODE={v:?} does not say how many tasks node {node} runs"
                        ))
                    },
                )?,
                None => world,
            };
            (
                "srun",
                parse::<u32>("SLURM_PROCID", &rank)?,
                world,
                parse::<u32>("SLURM_LOCALID", &local)?,
                local_world,
            )
        } else {
            return Ok(None);
        };
        if world == 0 || rank >= world || local_rank >= local_world || local_rank > rank {
            return Err(Error::InvalidArgument(format!(
                "{launcher} gave rank {rank} of a world of {world}: a rank must be below the world size"
            )));
        }
        let master_addr = get("MASTER_ADDR").ok_or_else(|| {
            Error::InvalidArgument(format!(
                "launched by {launcher} (rank {rank} of {world}) but MASTER_ADDR is not set: set MASTER_ADDR and MASTER_PORT to rank 0's host and a free port (deploy/slurm/train.sbatch shows how)"
            ))
        })?;
        let port = get("MASTER_PORT").ok_or_else(|| {
            Error::InvalidArgument(format!(
                "launched by {launcher} (rank {rank} of {world}) but MASTER_PORT is not set"
            ))
        })?;
        let master_port = parse::<u16>("MASTER_PORT", &port)?;
        let agent_store = (launcher == "torchrun"
            && get("TORCHELASTIC_USE_AGENT_STORE").as_deref() == Some("True"))
        .then(|| {
            format!(
                "/worker/attempt_{}",
                get("TORCHELASTIC_RESTART_COUNT").unwrap_or_else(|| "0".into())
            )
        });
        Ok(Some(Launch {
            launcher,
            rank,
            world,
            local_rank,
            local_world: local_world.min(world - (rank - local_rank)),
            master_addr,
            master_port,
            agent_store,
        }))
    }

    /// The ranks that run on this machine.
    pub fn machine_ranks(&self) -> std::ops::Range<u32> {
        let first = self.rank - self.local_rank;
        first..first + self.local_world
    }

    /// The device this rank trains on: LOCAL_RANK's GPU when `device` is a
    /// CUDA device, else `device`.
    pub fn device(&self, device: Device) -> Device {
        match device {
            Device::Cuda(_) => Device::Cuda(self.local_rank as usize),
            other => other,
        }
    }
}

/// The tasks node `node` runs, from Slurm's compressed list of tasks per
/// node: "2(x3),1" is nodes 0-2 with 2 tasks each, then node 3 with 1.
fn tasks_on_node(list: &str, node: u32) -> Option<u32> {
    let mut first = 0u32;
    for part in list.split(',') {
        let (tasks, repeat) = match part.split_once("(x") {
            Some((t, r)) => (
                t.trim().parse().ok()?,
                r.trim_end_matches(')').parse().ok()?,
            ),
            None => (part.trim().parse().ok()?, 1u32),
        };
        if node < first + repeat {
            return Some(tasks);
        }
        first += repeat;
    }
    None
}

#[allow(non_camel_case_types)]
#[repr(C)]
struct offgnn_c10d_group {
    _private: [u8; 0],
}

#[cfg(offgnn_c10d)]
unsafe extern "C" {
    fn offgnn_c10d_has_nccl() -> libc::c_int;
    fn offgnn_c10d_new(
        host: *const libc::c_char,
        port: u16,
        is_server: libc::c_int,
        prefix: *const libc::c_char,
        rank: libc::c_int,
        world: libc::c_int,
        backend: libc::c_int,
        timeout_ms: i64,
        err: *mut *mut libc::c_char,
    ) -> *mut offgnn_c10d_group;
    fn offgnn_c10d_free(group: *mut offgnn_c10d_group);
    fn offgnn_c10d_allreduce_sum(
        group: *mut offgnn_c10d_group,
        tensor: *mut libc::c_void,
        err: *mut *mut libc::c_char,
    ) -> libc::c_int;
    fn offgnn_c10d_broadcast(
        group: *mut offgnn_c10d_group,
        tensor: *mut libc::c_void,
        root: libc::c_int,
        err: *mut *mut libc::c_char,
    ) -> libc::c_int;
    fn offgnn_c10d_barrier(
        group: *mut offgnn_c10d_group,
        err: *mut *mut libc::c_char,
    ) -> libc::c_int;
}

/// Whether this build can form a process group at all, and with NCCL.
pub fn support() -> (bool, bool) {
    #[cfg(offgnn_c10d)]
    {
        // SAFETY: a constant.
        (true, unsafe { offgnn_c10d_has_nccl() } != 0)
    }
    #[cfg(not(offgnn_c10d))]
    {
        (false, false)
    }
}

/// What forming a process group returned: the group, or null and the
/// shim's message.
#[cfg(offgnn_c10d)]
struct Joined {
    ptr: *mut offgnn_c10d_group,
    err: *mut libc::c_char,
}

// SAFETY: handed once from the thread that formed the group to the one
// that uses it, as `Group` itself may be.
#[cfg(offgnn_c10d)]
unsafe impl Send for Joined {}

/// Runs `join` (which blocks in libtorch until the other ranks join, or
/// its timeout passes) on a thread of its own, and returns what it
/// returned; or an error once SIGINT or SIGTERM arrives or `timeout` (and
/// a little) has passed, leaving the thread blocked until the process
/// ends. libtorch's wait polls no signal, so a rank whose peers never came
/// sat out the whole wait, which is longer than the timeout: its client
/// tries to connect twice, a random delay between (41 s for 20).
/// `at` names the rank and the store.
#[cfg(offgnn_c10d)]
fn join_or_stop(
    join: impl FnOnce() -> Joined + Send + 'static,
    timeout: Duration,
    at: &str,
) -> Result<Joined> {
    // libtorch's own failure, with its reason, first where it comes in time.
    const GRACE: Duration = Duration::from_millis(500);
    let started = std::time::Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("c10d-join".into())
        .spawn(move || {
            // The receiver is gone only once the process is stopping.
            let _ = tx.send(join());
        })
        .map_err(|e| Error::Distributed(format!("cannot start a thread to join the group: {e}")))?;
    loop {
        match rx.recv_timeout(std::time::Duration::from_millis(100)) {
            Ok(joined) => return Ok(joined),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if let Some(signal) = offgnn_shared::signals::received() {
                    return Err(Error::Stopped(format!(
                        "{at}: stopped by {signal} while waiting for the other ranks to join; nothing was written"
                    )));
                }
                if started.elapsed() > timeout + GRACE {
                    return Err(Error::Distributed(format!(
                        "{at}: the other ranks did not join within {} s (--dist-timeout): check that every rank was started with the same MASTER_ADDR and MASTER_PORT and can reach it",
                        timeout.as_secs()
                    )));
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(Error::Internal(
                    "the thread joining the process group ended without an answer".into(),
                ));
            }
        }
    }
}

/// A c10d process group of the job's ranks. Collectives block until every
/// rank has called them (or the group's timeout passes, or a rank's
/// connection closes: then they fail with libtorch's message).
pub struct Group {
    ptr: *mut offgnn_c10d_group,
    pub rank: u32,
    pub world: u32,
    what: String,
}

// SAFETY: c10d's process groups are used from one thread at a time here
// (the training loop); moving the handle between threads is what libtorch
// does itself.
unsafe impl Send for Group {}

impl Group {
    /// Joins the job's store and forms the process group: Gloo for the CPU,
    /// NCCL for CUDA. Waits up to `timeout` for the other ranks.
    pub fn connect(launch: &Launch, device: Device, timeout: Duration) -> Result<Group> {
        let backend = if device.is_cuda() { "NCCL" } else { "Gloo" };
        let what = format!("rank {} of {}", launch.rank, launch.world);
        #[cfg(offgnn_c10d)]
        {
            let host = std::ffi::CString::new(launch.master_addr.clone())
                .map_err(|_| Error::InvalidArgument("MASTER_ADDR holds a NUL byte".into()))?;
            let prefix = std::ffi::CString::new(match &launch.agent_store {
                Some(attempt) => format!("{attempt}/offgnn/"),
                None => "offgnn/".into(),
            })
            .expect("no NUL");
            let (port, rank, world) = (launch.master_port, launch.rank, launch.world);
            let is_server = launch.agent_store.is_none() && launch.rank == 0;
            let cuda = device.is_cuda();
            let join = move || {
                let mut err = std::ptr::null_mut();
                // SAFETY: valid C strings for the call's duration; err is an
                // out-pointer the shim sets on failure.
                let ptr = unsafe {
                    offgnn_c10d_new(
                        host.as_ptr(),
                        port,
                        is_server as libc::c_int,
                        prefix.as_ptr(),
                        rank as libc::c_int,
                        world as libc::c_int,
                        cuda as libc::c_int,
                        timeout.as_millis().min(i64::MAX as u128) as i64,
                        &mut err,
                    )
                };
                Joined { ptr, err }
            };
            let at = format!(
                "{what}: the store at {}:{}",
                launch.master_addr, launch.master_port
            );
            let Joined { ptr, err } = join_or_stop(join, timeout, &at)?;
            if ptr.is_null() {
                return Err(Error::Distributed(format!(
                    "{what}: cannot form the {backend} process group through the store at {}:{}: {}",
                    launch.master_addr,
                    launch.master_port,
                    crate::cuda::take_error(err)
                )));
            }
            Ok(Group {
                ptr,
                rank: launch.rank,
                world: launch.world,
                what,
            })
        }
        #[cfg(not(offgnn_c10d))]
        {
            let _ = timeout;
            Err(Error::Distributed(format!(
                "{what}: launched by {} but this trainer was built without c10d (Gloo's headers were missing at build time: run scripts/setup, then build again)",
                launch.launcher
            )))
        }
    }

    #[cfg(offgnn_c10d)]
    fn call(&self, op: &str, f: impl FnOnce(*mut *mut libc::c_char) -> libc::c_int) -> Result<()> {
        let mut err = std::ptr::null_mut();
        if f(&mut err) == 0 {
            return Ok(());
        }
        Err(Error::Distributed(format!(
            "{}: {op} failed, so another rank stopped or cannot be reached: {}",
            self.what,
            crate::cuda::take_error(err)
        )))
    }

    /// Sums `t` over the ranks, in place: every rank ends with the same
    /// bits.
    pub fn all_reduce_sum(&self, t: &Tensor) -> Result<()> {
        #[cfg(offgnn_c10d)]
        {
            let tensor = t.as_ptr() as *mut libc::c_void;
            // SAFETY: `tensor` is tch's at::Tensor handle, alive for the call.
            self.call("all-reduce", |err| unsafe {
                offgnn_c10d_allreduce_sum(self.ptr, tensor, err)
            })
        }
        #[cfg(not(offgnn_c10d))]
        {
            let _ = t;
            unreachable!("no group can be formed in this build")
        }
    }

    /// Overwrites `t` with `root`'s, in place.
    pub fn broadcast(&self, t: &Tensor, root: u32) -> Result<()> {
        #[cfg(offgnn_c10d)]
        {
            let tensor = t.as_ptr() as *mut libc::c_void;
            // SAFETY: as in all_reduce_sum.
            self.call("broadcast", |err| unsafe {
                offgnn_c10d_broadcast(self.ptr, tensor, root as libc::c_int, err)
            })
        }
        #[cfg(not(offgnn_c10d))]
        {
            let _ = (t, root);
            unreachable!("no group can be formed in this build")
        }
    }

    /// Waits until every rank reaches it.
    pub fn barrier(&self) -> Result<()> {
        #[cfg(offgnn_c10d)]
        {
            // SAFETY: the group is alive.
            self.call("barrier", |err| unsafe {
                offgnn_c10d_barrier(self.ptr, err)
            })
        }
        #[cfg(not(offgnn_c10d))]
        unreachable!("no group can be formed in this build")
    }

    /// Sums `values` over the ranks (float64: exact for counts below 2^53).
    pub fn sum_f64(&self, values: &[f64], device: Device) -> Result<Vec<f64>> {
        let t = Tensor::from_slice(values).to_device(device);
        self.all_reduce_sum(&t)?;
        Ok(Vec::<f64>::try_from(t.to_device(Device::Cpu))?)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        #[cfg(offgnn_c10d)]
        // SAFETY: made by offgnn_c10d_new, freed once.
        unsafe {
            offgnn_c10d_free(self.ptr)
        };
    }
}

/// Says how an epoch's `n` training batches are dealt to `world` ranks
/// where they do not divide evenly: a warning where the ranks outnumber
/// the batches.
pub(crate) fn say_padding(n: usize, world: usize) {
    match padding_line(n, world) {
        Some(said) if world > n => tracing::warn!("{said}: more ranks than batches"),
        Some(said) => tracing::info!("{said}"),
        None => {}
    }
}

/// The line [`say_padding`] says, where there is one.
fn padding_line(n: usize, world: usize) -> Option<String> {
    if world <= 1 || n.is_multiple_of(world) {
        return None;
    }
    let padded = n.div_ceil(world) * world;
    let extra = padded - n;
    let repeated = if extra <= n {
        format!("its first {extra} repeated")
    } else {
        format!("its batches repeated in turn for {extra} more")
    };
    Some(format!(
        "an epoch's {n} training batches are dealt to {world} ranks as {padded}, {repeated} (as torch's DistributedSampler pads)"
    ))
}

/// Rank `rank`'s share of an epoch's `n` batches (positions into the
/// epoch's order), for a world of `world`: as torch's DistributedSampler
/// deals, the order is padded to a multiple of the world by repeating its
/// first batches, so that every rank takes the same number of steps (also
/// when there are fewer batches than ranks); unlike it, each rank takes a
/// contiguous run of the padded order, so that a rank reads few segments.
pub fn deal(n: usize, world: usize, rank: usize) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    let steps = n.div_ceil(world);
    (rank * steps..(rank + 1) * steps).map(|i| i % n).collect()
}

/// Rank `rank`'s part of `n` evaluation batches: the contiguous run of
/// [`deal`], without padding (each batch is counted once).
pub fn eval_share(n: usize, world: usize, rank: usize) -> std::ops::Range<usize> {
    let (q, r) = (n / world, n % world);
    let start = rank * q + rank.min(r);
    start..start + q + usize::from(rank < r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The padding is said as it is dealt, also where it repeats every
    /// batch more than once.
    #[test]
    fn padding_is_said_as_dealt() {
        assert_eq!(padding_line(8, 2), None);
        let line = padding_line(7, 2).unwrap();
        assert!(line.contains("as 8, its first 1 repeated"), "{line}");
        let line = padding_line(7, 20).unwrap();
        assert!(
            line.contains("as 20, its batches repeated in turn for 13 more"),
            "{line}"
        );
    }
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn no_launcher_is_one_process() {
        assert_eq!(Launch::from_env(env(&[])).unwrap(), None);
        // sbatch's own script (no step of several tasks) is one process.
        let batch = env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "4")]);
        assert_eq!(Launch::from_env(batch).unwrap(), None);
    }

    #[test]
    fn torchrun_and_srun_are_read() {
        let l = Launch::from_env(env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
            ("TORCHELASTIC_RESTART_COUNT", "2"),
            ("LOCAL_WORLD_SIZE", "2"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((l.rank, l.world, l.local_rank), (3, 4, 1));
        assert_eq!(l.machine_ranks(), 2..4);
        assert_eq!(l.agent_store.as_deref(), Some("/worker/attempt_2"));
        assert_eq!(l.device(Device::Cuda(0)), Device::Cuda(1));
        assert_eq!(l.device(Device::Cpu), Device::Cpu);
        let l = Launch::from_env(env(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_STEP_NUM_TASKS", "2"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NODEID", "1"),
            ("SLURM_STEP_TASKS_PER_NODE", "1(x2)"),
            ("MASTER_ADDR", "node1"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((l.launcher, l.rank, l.world), ("srun", 1, 2));
        assert_eq!(l.machine_ranks(), 1..2);
        assert_eq!(tasks_on_node("2(x3),1", 2), Some(2));
        assert_eq!(tasks_on_node("2(x3),1", 3), Some(1));
        assert_eq!(tasks_on_node("4", 1), None);
        assert_eq!(l.agent_store, None);
    }

    #[test]
    fn a_bad_launch_is_refused_by_name() {
        let e = Launch::from_env(env(&[("RANK", "0"), ("WORLD_SIZE", "2")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("MASTER_ADDR"), "{e}");
        let e = Launch::from_env(env(&[
            ("RANK", "2"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(e.contains("rank 2 of a world of 2"), "{e}");
        let e = Launch::from_env(env(&[("RANK", "x"), ("WORLD_SIZE", "2")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("RANK=\"x\""), "{e}");
    }

    #[test]
    fn dealing_covers_every_batch_in_equal_steps() {
        for n in 0..40 {
            for world in 1..6 {
                let shares: Vec<Vec<usize>> = (0..world).map(|r| deal(n, world, r)).collect();
                let steps = n.div_ceil(world);
                assert!(shares.iter().all(|s| s.len() == steps), "{n} {world}");
                // The padded order, rank after rank: every batch, then the
                // first ones again.
                let all: Vec<usize> = shares.concat();
                assert_eq!(
                    all,
                    (0..steps * world).map(|i| i % n.max(1)).collect::<Vec<_>>()
                );
                let mut seen: Vec<usize> =
                    (0..world).flat_map(|r| eval_share(n, world, r)).collect();
                seen.sort();
                assert_eq!(seen, (0..n).collect::<Vec<_>>());
            }
        }
        assert_eq!(deal(5, 2, 0), vec![0, 1, 2]);
        assert_eq!(deal(5, 2, 1), vec![3, 4, 0]);
        assert_eq!(deal(1, 2, 1), vec![0]);
        assert_eq!(deal(4, 1, 0), vec![0, 1, 2, 3]);
    }

    /// Two ranks in one process, on two threads, over loopback: the
    /// collectives are libtorch's Gloo, and they agree.
    #[cfg(offgnn_c10d)]
    #[test]
    fn two_ranks_reduce_broadcast_and_meet() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let ranks: Vec<_> = (0..2u32)
            .map(|rank| {
                std::thread::spawn(move || {
                    let launch = Launch {
                        launcher: "torchrun",
                        rank,
                        world: 2,
                        local_rank: rank,
                        local_world: 2,
                        master_addr: "127.0.0.1".into(),
                        master_port: port,
                        agent_store: None,
                    };
                    let g = Group::connect(&launch, Device::Cpu, Duration::from_secs(60)).unwrap();
                    let t = Tensor::from_slice(&[1.0f32, 2.0]) * (rank as f64 + 1.0);
                    g.all_reduce_sum(&t).unwrap();
                    let b = Tensor::from_slice(&[rank as i64 * 10 + 7]);
                    g.broadcast(&b, 1).unwrap();
                    g.barrier().unwrap();
                    let sums = g.sum_f64(&[rank as f64, 1.5], Device::Cpu).unwrap();
                    (Vec::<f32>::try_from(t).unwrap(), b.int64_value(&[0]), sums)
                })
            })
            .collect();
        for r in ranks {
            let (t, b, sums) = r.join().unwrap();
            assert_eq!(t, vec![3.0, 6.0]);
            assert_eq!(b, 17);
            assert_eq!(sums, vec![1.0, 3.0]);
        }
    }
}
