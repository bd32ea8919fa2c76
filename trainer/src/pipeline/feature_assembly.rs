//! Stage 2, feature assembly (DiskGNN §4, §5.3): one `[inputs, d]` float
//! tensor on the device from the GPU cache, the CPU cache and the rows
//! loaded from disk, each in its input position.

use tch::{Device, Kind, Tensor};

use super::feature_loading::Loaded;
use super::sources::{AssembleSources, FeatureMode};
use super::staging_buffer::{Staging, indices_at, put_indices};
use crate::error::{Error, Result};

/// A dense `[n, d]` CPU tensor whose rows `fill` writes, every one of them
/// (the tensor's memory is not zeroed first), straight into the tensor:
/// a batch's input matrix is hundreds of MB, not worth a second copy.
fn host_matrix(
    src: &AssembleSources,
    n: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<()>,
) -> Result<Tensor> {
    let x = Tensor::f_empty([n as i64, src.dim], (src.kind, Device::Cpu))?;
    let len = n * src.row_bytes;
    debug_assert_eq!(x.numel() * x.kind().elt_size_in_bytes(), len);
    if len == 0 {
        fill(&mut [])?;
        return Ok(x);
    }
    // SAFETY: `x` is a new contiguous CPU tensor of `len` bytes (n rows of
    // `row_bytes`, its dtype's row) that nothing else refers to; the slice
    // ends before `x` is returned.
    let bytes = unsafe { std::slice::from_raw_parts_mut(x.data_ptr().cast::<u8>(), len) };
    fill(bytes)?;
    Ok(x)
}

/// Checks every address of the batch against what it indexes, once,
/// before any row is copied: input positions against the batch's rows,
/// cache slots and node ids against their tier's rows, disk rows against
/// the bytes read. A table that does not match the layout it is read with
/// is then an error naming the batch, not a panic in the assembler's
/// thread.
fn check_addresses(src: &AssembleSources, l: &Loaded) -> Result<()> {
    let t = &l.table;
    let (n, rb) = (u64::from(t.num_inputs), src.row_bytes as u64);
    let bad = |what: String| {
        Error::Layout(format!(
            "the address table of batch {} ({}epoch {}) does not match the layout: {what}",
            t.index,
            t.split.map_or(String::new(), |s| format!("{s}, ")),
            t.epoch
        ))
    };
    let rows_in = |bytes: &Option<std::sync::Arc<Vec<u8>>>| {
        bytes.as_ref().map(|b| b.len() as u64 / rb.max(1))
    };
    // `what` #i of `values` must be below `bound`, the count of `of`.
    let past = |what: &str, values: &[u32], bound: u64, of: &str| -> Result<()> {
        match values
            .iter()
            .enumerate()
            .find(|(_, v)| u64::from(**v) >= bound)
        {
            Some((i, v)) => Err(bad(format!("{what} #{i} is {v}, but {of} {bound}"))),
            None => Ok(()),
        }
    };
    if src.mode == FeatureMode::Packed {
        let gpu_rows = match &src.gpu_cache {
            Some(cache) => Some(cache.size()[0] as u64),
            None => rows_in(&src.gpu_rows),
        };
        let cpu_rows = src.cpu_rows.as_ref().map(|c| c.num_rows());
        for (tier, pos, slots, rows) in [
            ("GPU-cache", &t.gpu_pos, &t.gpu_slot, gpu_rows),
            ("CPU-cache", &t.cpu_pos, &t.cpu_slot, cpu_rows),
            ("CPU-cache admission", &t.admit_pos, &t.admit_slot, cpu_rows),
        ] {
            if pos.len() != slots.len() {
                return Err(bad(format!(
                    "{} {tier} positions but {} slots",
                    pos.len(),
                    slots.len()
                )));
            }
            past(&format!("{tier} position"), pos, n, "the inputs are")?;
            if let Some(rows) = rows {
                past(&format!("{tier} slot"), slots, rows, "the tier's rows are")?;
            }
        }
    }
    if src.mode == FeatureMode::Memory
        && let Some(rows) = rows_in(&src.all_rows)
    {
        if t.input_nodes.len() as u64 != n {
            return Err(bad(format!(
                "{} input nodes for {n} inputs",
                t.input_nodes.len()
            )));
        }
        past("input node", &t.input_nodes, rows, "the nodes are")?;
    }
    let read = l.buf.as_slice().len() as u64;
    for (i, &(p, off)) in l.disk.iter().enumerate() {
        if u64::from(p) >= n || off as u64 + rb > read {
            return Err(bad(format!(
                "disk row #{i} goes to input {p} of {n}, from byte {off} of the {read} read"
            )));
        }
    }
    Ok(())
}

/// Copies the rows `slots` of `from` to input positions `pos` of `out`
/// (checked by [`check_addresses`]).
fn gather(out: &mut [u8], pos: &[u32], from: &[u8], slots: &[u32], rb: usize) {
    for (&p, &s) in pos.iter().zip(slots) {
        let (d, f) = (p as usize * rb, s as usize * rb);
        out[d..d + rb].copy_from_slice(&from[f..f + rb]);
    }
}

/// Stage 2: one `[inputs, d]` float tensor on the device from the GPU
/// cache, the CPU cache and the loaded rows (DiskGNN §4, feature assembling).
/// On the CPU the rows are copied on the calling thread: the pipeline's
/// assembler runs beside the model step, whose threads take the cores.
pub fn assemble(src: &AssembleSources, l: &Loaded) -> Result<(Tensor, [u64; 3])> {
    assemble_with(src, l, false)
}

/// [`assemble`], the rows copied on rayon's threads on the CPU: for a
/// caller that assembles between model steps, not beside them (the typed
/// loop), where one thread's copy of a batch's hundreds of MB would leave
/// the other cores idle.
pub fn assemble_parallel(src: &AssembleSources, l: &Loaded) -> Result<(Tensor, [u64; 3])> {
    assemble_with(src, l, true)
}

fn assemble_with(src: &AssembleSources, l: &Loaded, parallel: bool) -> Result<(Tensor, [u64; 3])> {
    let t = &l.table;
    let tiers = [t.gpu_pos.len() as u64, t.cpu_pos.len() as u64, l.disk_rows];
    if src.device != Device::Cpu {
        return Ok((assemble_staged(src, l)?, tiers));
    }
    let (n, rb) = (t.num_inputs as usize, src.row_bytes);
    let x = with_host(src, l, |host| {
        host_matrix(src, n, |out| {
            // A pruned batch's unread inputs get zeros, not what the
            // allocator left (a NaN there would reach the weight gradients
            // through a zero): their rows are listed first.
            if parallel || l.pruned {
                copy_listed_rows(out, host, l, rb, parallel)
            } else {
                copy_rows(out, host, l, rb);
                Ok(())
            }
        })
    })?;
    Ok((x.to_kind(Kind::Float), tiers))
}

/// Runs `f` on the host rows batch `l` is gathered from, its addresses
/// checked first; the CPU cache is held while `f` runs, and the rows the
/// batch admits into a CPU cache that follows the batch order are
/// admitted once `f` is done.
fn with_host<T>(
    src: &AssembleSources,
    l: &Loaded,
    f: impl FnOnce(HostRows<'_>) -> Result<T>,
) -> Result<T> {
    check_addresses(src, l)?;
    let t = &l.table;
    let packed = src.mode == FeatureMode::Packed;
    let cpu = wanted(packed && !t.cpu_pos.is_empty(), &src.cpu_rows, "cache")?.map(|c| c.rows());
    let gpu = wanted(packed && !t.gpu_pos.is_empty(), &src.gpu_rows, "cache")?;
    let all = wanted(src.mode == FeatureMode::Memory, &src.all_rows, "memory")?;
    let host = HostRows {
        all: all.map(|a| a.as_slice()),
        gpu: gpu.map(|g| g.as_slice()),
        cpu: cpu.as_ref().map(|c| c.as_slice()),
    };
    let out = f(host)?;
    drop(cpu);
    admit(src, l)?;
    Ok(out)
}

/// `rows` where the batch reads them (`read`), else none; an error where
/// it reads rows the sources lack.
fn wanted<'a, T>(read: bool, rows: &'a Option<T>, what: &str) -> Result<Option<&'a T>> {
    match (read, rows) {
        (false, _) => Ok(None),
        (true, Some(r)) => Ok(Some(r)),
        (true, None) => Err(missing(what)),
    }
}

/// The host rows a CPU batch is gathered from: every node's (memory
/// mode), or the caches' (packed).
#[derive(Clone, Copy)]
struct HostRows<'a> {
    all: Option<&'a [u8]>,
    gpu: Option<&'a [u8]>,
    cpu: Option<&'a [u8]>,
}

/// Copies each input row of batch `l` into `out` from its tier, in turn.
fn copy_rows(out: &mut [u8], host: HostRows<'_>, l: &Loaded, rb: usize) {
    let t = &l.table;
    if let Some(all) = host.all {
        for (row, &v) in out.chunks_exact_mut(rb).zip(&t.input_nodes) {
            row.copy_from_slice(&all[v as usize * rb..][..rb]);
        }
    }
    if let Some(rows) = host.gpu {
        gather(out, &t.gpu_pos, rows, &t.gpu_slot, rb);
    }
    if let Some(rows) = host.cpu {
        gather(out, &t.cpu_pos, rows, &t.cpu_slot, rb);
    }
    let data = l.buf.as_slice();
    for &(p, off) in &l.disk {
        let d = p as usize * rb;
        out[d..d + rb].copy_from_slice(&data[off..off + rb]);
    }
}

/// [`copy_rows`] from a list of where each input row comes from
/// ([`row_sources`]), on rayon's threads where `parallel` (the threads
/// write disjoint runs of `out` in order); an input without a row (a
/// pruned batch's) gets zeros.
fn copy_listed_rows(
    out: &mut [u8],
    host: HostRows<'_>,
    l: &Loaded,
    rb: usize,
    parallel: bool,
) -> Result<()> {
    use rayon::prelude::*;
    if rb == 0 || l.table.num_inputs == 0 {
        return Ok(());
    }
    let from = row_sources(host, l, rb)?;
    let put = |(o, f): (&mut [u8], &&[u8])| {
        if f.is_empty() {
            o.fill(0);
        } else {
            o.copy_from_slice(f);
        }
    };
    if parallel {
        out.par_chunks_mut(rb)
            .zip(from.par_iter())
            .with_min_len(64)
            .for_each(put);
    } else {
        out.chunks_mut(rb).zip(&from).for_each(put);
    }
    Ok(())
}

/// Each input row of batch `l`, in input order, where it lies: its tier's
/// rows or the bytes read. A row that no tier gives is an error (a serial
/// copy would leave it as the allocator left it), except in a batch pruned
/// against the historical cache, whose pruned inputs no layer reads (an
/// empty slice here; the copy writes zeros).
fn row_sources<'a>(host: HostRows<'a>, l: &'a Loaded, rb: usize) -> Result<Vec<&'a [u8]>> {
    let t = &l.table;
    let n = t.num_inputs as usize;
    let mut from: Vec<&[u8]> = vec![&[]; n];
    if let Some(all) = host.all {
        for (f, &v) in from.iter_mut().zip(&t.input_nodes) {
            *f = &all[v as usize * rb..][..rb];
        }
    }
    for (rows, pos, slots) in [
        (host.gpu, &t.gpu_pos, &t.gpu_slot),
        (host.cpu, &t.cpu_pos, &t.cpu_slot),
    ] {
        let Some(rows) = rows else { continue };
        for (&p, &s) in pos.iter().zip(slots) {
            from[p as usize] = &rows[s as usize * rb..][..rb];
        }
    }
    let data = l.buf.as_slice();
    for &(p, off) in &l.disk {
        from[p as usize] = &data[off..off + rb];
    }
    if rb > 0
        && !l.pruned
        && let Some(p) = from.iter().position(|f| f.is_empty())
    {
        return Err(Error::Layout(format!(
            "the address table of batch {} gives input {p} of {n} no row",
            t.index
        )));
    }
    Ok(from)
}

/// Runs `f` on each input row of batch `l` where it lies (the caches, the
/// bytes read), in input order, instead of copying them into one matrix:
/// for a CPU consumer that reads each row there (R-SAGE's first layer,
/// [`crate::hetero::first_layer`]), with the addresses checked and the
/// admissions made as for assembly.
pub fn with_host_rows<T>(
    src: &AssembleSources,
    l: &Loaded,
    f: impl FnOnce(&[&[u8]]) -> Result<T>,
) -> Result<T> {
    if src.device != Device::Cpu {
        return Err(Error::Internal("host rows are a CPU batch's".into()));
    }
    with_host(src, l, |host| f(&row_sources(host, l, src.row_bytes)?))
}

/// After a batch is gathered: the rows it admits into a CPU cache that
/// follows the batch order.
fn admit(src: &AssembleSources, l: &Loaded) -> Result<()> {
    match (&src.cpu_rows, src.mode) {
        (Some(cache), FeatureMode::Packed) => cache.admit(l),
        _ => Ok(()),
    }
}

fn missing(what: &str) -> Error {
    Error::Internal(format!("{what} mode without its rows"))
}

/// Where a batch's parts sit in its staging buffer: `k` rows first, then
/// from byte `idx_at` the int64 indices: `placed` host positions, `g`
/// GPU-cache slots and `g` GPU-cache positions.
#[derive(Clone, Copy)]
struct StagedParts {
    k: usize,
    idx_at: usize,
    placed: usize,
    g: usize,
}

/// The rows of a host tier (`None`: none), their input positions and their
/// slots in the tier.
type HostTier<'a> = (Option<&'a [u8]>, &'a [u32], &'a [u32]);

/// Feature assembly for a device other than the CPU (DiskGNN §4). The rows
/// that are not in the GPU cache (CPU-cache rows, rows read from disk, all
/// rows in memory mode) and every index the device needs are written
/// straight into one page-locked staging buffer, which goes to the device
/// in one non-blocking copy; the GPU cache's rows are gathered on the
/// device. On the device an index scatter places both in input order.
/// Public so that tests run this path on the CPU.
pub fn assemble_staged(src: &AssembleSources, l: &Loaded) -> Result<Tensor> {
    check_addresses(src, l)?;
    let t = &l.table;
    let (n, rb, device) = (t.num_inputs as usize, src.row_bytes, src.device);
    // The CPU cache's rows, held while they are copied.
    let cpu = match src.mode {
        FeatureMode::Packed if !t.cpu_pos.is_empty() => Some(
            src.cpu_rows
                .as_ref()
                .ok_or_else(|| missing("cache"))?
                .rows(),
        ),
        _ => None,
    };
    // The host tier: its rows and slots (memory mode: every input node,
    // already in input order, so no positions to place them by).
    let (host_rows, host_slot): (Option<&[u8]>, &[u32]) = match src.mode {
        FeatureMode::Memory => {
            let all = src.all_rows.as_ref().ok_or_else(|| missing("memory"))?;
            (Some(all.as_slice()), &t.input_nodes)
        }
        FeatureMode::Packed if !t.cpu_pos.is_empty() => {
            (cpu.as_ref().map(|r| r.as_slice()), &t.cpu_slot)
        }
        FeatureMode::Packed | FeatureMode::Naive => (None, &[]),
    };
    // GPU-cache rows: gathered on the device from its tensor; on the CPU
    // (where the tier is host rows) with the host tier's.
    let gpu = match (src.mode, &src.gpu_cache) {
        (FeatureMode::Packed, Some(cache)) => Some(cache),
        _ => None,
    };
    let host_gpu = gpu.is_none() && src.mode == FeatureMode::Packed && !t.gpu_pos.is_empty();
    let gpu_rows = if host_gpu {
        Some(
            src.gpu_rows
                .as_ref()
                .ok_or_else(|| missing("cache"))?
                .as_slice(),
        )
    } else {
        None
    };
    let g = if gpu.is_some() { t.gpu_pos.len() } else { 0 };
    let hosted = [
        (host_rows, &t.cpu_pos[..], host_slot),
        (gpu_rows, &t.gpu_pos[..], &t.gpu_slot[..]),
    ];
    let k: usize = hosted
        .iter()
        .filter(|h| h.0.is_some())
        .map(|h| h.2.len())
        .sum::<usize>()
        + l.disk.len();
    // Positions to scatter the rows by: none in memory mode.
    let placed = if src.mode == FeatureMode::Memory {
        0
    } else {
        k
    };
    // [k rows][`placed` host positions, g GPU slots, g GPU positions as int64]
    let rows_len = k * rb;
    let idx_at = rows_len.next_multiple_of(8);
    let parts = StagedParts {
        k,
        idx_at,
        placed,
        g,
    };
    let mut staged = Staging::new(idx_at + (placed + 2 * g) * 8, device)?;
    write_staged(staged.bytes_mut(), parts, rb, &hosted, l);
    drop(cpu);
    admit(src, l)?;
    let dev = staged.upload(device)?;
    let rows = dev
        .f_narrow(0, 0, rows_len as i64)?
        .f_view_dtype(src.kind)?
        .f_view([k as i64, src.dim])?;
    let x = if src.mode == FeatureMode::Memory {
        // Every row, already in input order.
        rows
    } else {
        place_rows(src, &dev, &rows, gpu, n, parts)?
    };
    Ok(x.f_to_kind(Kind::Float)?)
}

/// Writes the batch's host rows (the `hosted` tiers', then those read from
/// disk) and the indices that place them into the staging buffer `bytes`.
fn write_staged(
    bytes: &mut [u8],
    parts: StagedParts,
    rb: usize,
    hosted: &[HostTier; 2],
    l: &Loaded,
) {
    let StagedParts {
        idx_at, placed, g, ..
    } = parts;
    let t = &l.table;
    let (rows, idx) = bytes.split_at_mut(idx_at);
    let (host_idx, gpu_idx) = idx.split_at_mut(placed * 8);
    let mut positions = host_idx.chunks_exact_mut(8);
    let mut place = |p: u32| {
        if let Some(o) = positions.next() {
            o.copy_from_slice(&(p as i64).to_ne_bytes());
        }
    };
    let mut at = 0usize;
    for &(from, pos, slots) in hosted {
        let Some(from) = from else { continue };
        for (i, &s) in slots.iter().enumerate() {
            let f = s as usize * rb;
            rows[at..at + rb].copy_from_slice(&from[f..f + rb]);
            at += rb;
            if placed > 0 {
                place(pos[i]);
            }
        }
    }
    let data = l.buf.as_slice();
    for &(p, off) in &l.disk {
        rows[at..at + rb].copy_from_slice(&data[off..off + rb]);
        at += rb;
        place(p);
    }
    if g > 0 {
        let (slots, pos) = gpu_idx.split_at_mut(g * 8);
        put_indices(slots, t.gpu_slot.iter().map(|&v| v as i64));
        put_indices(pos, t.gpu_pos.iter().map(|&v| v as i64));
    }
}

/// The batch's matrix in input order on the device: the GPU cache's rows
/// gathered there by their slots, and the uploaded `rows`, each scattered
/// to its position.
fn place_rows(
    src: &AssembleSources,
    dev: &Tensor,
    rows: &Tensor,
    gpu: Option<&Tensor>,
    n: usize,
    parts: StagedParts,
) -> Result<Tensor> {
    let StagedParts {
        k,
        idx_at,
        placed,
        g,
    } = parts;
    // Every row is written below: no need to zero the matrix first.
    let mut out = Tensor::f_empty([n as i64, src.dim], (src.kind, src.device))?;
    if let Some(cache) = gpu {
        let slots = indices_at(dev, idx_at + placed * 8, g)?;
        let pos = indices_at(dev, idx_at + (placed + g) * 8, g)?;
        let _ = out.f_index_copy_(0, &pos, &cache.f_index_select(0, &slots)?)?;
    }
    if k > 0 {
        let _ = out.f_index_copy_(0, &indices_at(dev, idx_at, k)?, rows)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::CpuCache;
    use offgnn_shared::address_table::BatchTable;
    use offgnn_shared::dataset::Split;
    use offgnn_shared::io_engine::AlignedBuf;
    use std::sync::Arc;

    const DIM: usize = 2;
    const RB: usize = DIM * 4;

    /// Sources on the CPU with a GPU and a CPU cache of `rows` rows each,
    /// and every node's rows (memory mode) for `rows` nodes.
    fn sources(mode: FeatureMode, rows: usize) -> AssembleSources {
        let tier = |first: f32| {
            let values: Vec<f32> = (0..rows * DIM).map(|i| first + i as f32).collect();
            Some(Arc::new(
                values
                    .iter()
                    .flat_map(|v| v.to_ne_bytes())
                    .collect::<Vec<u8>>(),
            ))
        };
        AssembleSources {
            mode,
            device: Device::Cpu,
            kind: Kind::Float,
            dim: DIM as i64,
            row_bytes: RB,
            gpu_cache: None,
            gpu_rows: tier(100.0),
            cpu_rows: tier(200.0).map(|rows| {
                let rows = Arc::try_unwrap(rows).expect("one owner");
                Arc::new(CpuCache::new(Default::default(), rows, RB, false))
            }),
            all_rows: tier(300.0),
        }
    }

    /// A batch of three inputs: input 0 from the GPU cache's slot
    /// `gpu_slot`, input 1 from the CPU cache's slot 1, input 2 read from
    /// disk at byte `disk_at` of a one-row read.
    fn batch(gpu_slot: u32, disk_at: usize) -> Loaded {
        let mut buf = AlignedBuf::new(RB);
        buf.as_mut_slice().fill(0);
        Loaded {
            table: BatchTable {
                split: Some(Split::Train),
                epoch: 2,
                index: 7,
                num_inputs: 3,
                input_nodes: vec![0, 1, 2],
                gpu_pos: vec![0],
                gpu_slot: vec![gpu_slot],
                cpu_pos: vec![1],
                cpu_slot: vec![1],
                ..Default::default()
            },
            buf,
            disk: vec![(2, disk_at)],
            disk_bytes: RB as u64,
            disk_rows: 1,
            plan: None,
            pruned: false,
        }
    }

    /// Writes `row` as the batch's one row read from disk.
    fn put_disk_row(l: &mut Loaded, row: [f32; DIM]) {
        let bytes: Vec<u8> = row.iter().flat_map(|v| v.to_ne_bytes()).collect();
        l.buf.as_mut_slice()[..RB].copy_from_slice(&bytes);
    }

    fn refused(src: &AssembleSources, l: &Loaded) -> (String, String) {
        let host = assemble(src, l).map(|_| ()).unwrap_err().to_string();
        let staged = assemble_staged(src, l).map(|_| ()).unwrap_err().to_string();
        (host, staged)
    }

    #[test]
    fn a_table_that_matches_its_sources_assembles() {
        let src = sources(FeatureMode::Packed, 4);
        let (x, tiers) = assemble(&src, &batch(3, 0)).unwrap();
        assert_eq!(tiers, [1, 1, 1]);
        let got = Vec::<f32>::try_from(x.view([-1])).unwrap();
        assert_eq!(got, [106.0, 107.0, 202.0, 203.0, 0.0, 0.0]);
        let staged = assemble_staged(&src, &batch(3, 0)).unwrap();
        assert!(staged.equal(&Tensor::from_slice(&got).view([3, 2])));
    }

    /// The rows copied on rayon's threads are the serial copy's, packed
    /// and in memory mode; a row no tier gives is an error there, unless
    /// the batch was pruned.
    #[test]
    fn the_parallel_copy_gives_the_serial_copys_rows() {
        for mode in [FeatureMode::Packed, FeatureMode::Memory] {
            let src = sources(mode, 4);
            let mut l = batch(3, 0);
            put_disk_row(&mut l, [5.0f32, 6.0]);
            if mode == FeatureMode::Memory {
                l.disk.clear();
            }
            let (serial, tiers) = assemble(&src, &l).unwrap();
            let (parallel, same) = assemble_parallel(&src, &l).unwrap();
            assert_eq!(tiers, same);
            assert!(parallel.equal(&serial), "{mode:?}");
        }
        let src = sources(FeatureMode::Packed, 4);
        let mut l = batch(3, 0);
        l.disk.clear();
        let e = assemble_parallel(&src, &l).map(|_| ()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the address table of batch 7 gives input 2 of 3 no row"
        );
        // Pruned against the historical cache, the input it no longer
        // reads is zeros in both copies.
        l.pruned = true;
        let (serial, _) = assemble(&src, &l).unwrap();
        let (parallel, _) = assemble_parallel(&src, &l).unwrap();
        assert!(parallel.equal(&serial));
        let last = Vec::<f32>::try_from(serial.get(2)).unwrap();
        assert_eq!(last, [0.0, 0.0]);
    }

    /// A CPU cache that follows the batch order: after either assembly
    /// path, the slot a batch admits into holds the row it read from disk,
    /// and the cache's rows restore from its object.
    #[test]
    fn an_admitted_row_replaces_its_slot_on_both_paths_and_restores() {
        let dir = tempfile::tempdir().unwrap();
        let object = dir.path().join("cpu_cache.bin");
        let rows: Vec<u8> = (0..4 * DIM)
            .flat_map(|i| (200.0 + i as f32).to_ne_bytes())
            .collect();
        std::fs::write(&object, &rows).unwrap();
        for staged in [false, true] {
            let mut src = sources(FeatureMode::Packed, 4);
            let cache = Arc::new(CpuCache::new(object.clone(), rows.clone(), RB, true));
            src.cpu_rows = Some(cache.clone());
            let mut l = batch(3, 0);
            put_disk_row(&mut l, [7.0f32, 8.0]);
            (l.table.admit_pos, l.table.admit_slot) = (vec![2], vec![1]);
            // The batch itself reads slot 1 as it was.
            let x = if staged {
                assemble_staged(&src, &l).unwrap()
            } else {
                assemble(&src, &l).unwrap().0
            };
            let got = Vec::<f32>::try_from(x.view([-1])).unwrap();
            assert_eq!(got, [106.0, 107.0, 202.0, 203.0, 7.0, 8.0]);
            let now = cache.rows().as_slice()[RB..2 * RB].to_vec();
            assert_eq!(now, l.buf.as_slice()[..RB].to_vec(), "staged: {staged}");
            // The page holding the slot: here the whole tier.
            assert_eq!(cache.restore().unwrap(), 4 * RB as u64);
            assert_eq!(cache.rows().as_slice(), rows.as_slice());
            assert_eq!(cache.restore().unwrap(), 0);
        }
        // An admission into a slot past the tier is refused before a copy.
        let src = sources(FeatureMode::Packed, 4);
        let mut l = batch(3, 0);
        (l.table.admit_pos, l.table.admit_slot) = (vec![2], vec![4]);
        let (host, staged) = refused(&src, &l);
        assert!(
            host.ends_with("CPU-cache admission slot #0 is 4, but the tier's rows are 4"),
            "{host}"
        );
        assert_eq!(staged, host);
    }

    /// A cache slot past the tier, a disk row past the bytes read, a node
    /// past the features: an error naming the batch, the entry and the
    /// bound, on both assembly paths, not a panic.
    #[test]
    fn an_address_out_of_range_is_an_error_naming_the_batch() {
        let src = sources(FeatureMode::Packed, 4);
        let (host, staged) = refused(&src, &batch(4, 0));
        assert_eq!(
            host,
            "the address table of batch 7 (train, epoch 2) does not match the layout: GPU-cache slot #0 is 4, but the tier's rows are 4"
        );
        assert_eq!(staged, host);

        let (host, staged) = refused(&src, &batch(3, 4));
        assert!(
            host.ends_with("disk row #0 goes to input 2 of 3, from byte 4 of the 8 read"),
            "{host}"
        );
        assert_eq!(staged, host);

        let mut cpu = batch(3, 0);
        cpu.table.cpu_pos = vec![3];
        let (host, _) = refused(&src, &cpu);
        assert!(
            host.ends_with("CPU-cache position #0 is 3, but the inputs are 3"),
            "{host}"
        );

        let src = sources(FeatureMode::Memory, 2);
        let (host, staged) = refused(&src, &batch(0, 0));
        assert!(
            host.ends_with("input node #2 is 2, but the nodes are 2"),
            "{host}"
        );
        assert_eq!(staged, host);
    }
}
