//! R-SAGE's first layer on the CPU without the batch's input matrix. The
//! layer reads the input rows only through each relation's mean over a
//! destination's in-neighbours (no root weight: MLPerf's
//! `SAGEConv(root_weight=False)`), and the rows take no gradient, so the
//! means are taken straight from where each row lies (the caches, the read
//! buffers): the hundreds of MB a batch's matrix would be are neither
//! written nor read again.

use rayon::prelude::*;
use tch::{Device, Kind, Tensor};

use super::Schema;
use super::blocks::RelationEdges;
use super::fetch::Fetched;
use crate::error::{Error, Result};
use crate::pipeline::{self, AssembleSources};

/// Whether every type's stored rows are float32 (the means read them in
/// place).
pub(super) fn rows_are_float32(assembles: &[Option<AssembleSources>]) -> bool {
    assembles
        .iter()
        .flatten()
        .all(|src| src.kind == Kind::Float)
}

/// Each relation's first-layer means of batch `f`, source type by source
/// type, from where that type's rows lie (`assembles`, each type's
/// sources); a type without features gives zero-width means.
pub(super) fn batch_means(
    f: &Fetched,
    assembles: &[Option<AssembleSources>],
    schema: &Schema,
) -> Result<Vec<Tensor>> {
    let layer = f
        .blocks
        .layers
        .first()
        .ok_or_else(|| Error::Internal("a typed batch without blocks".into()))?;
    let mut means: Vec<Option<Tensor>> = (0..layer.relations.len()).map(|_| None).collect();
    for (t, loaded) in f.loaded.iter().enumerate() {
        let from_t = (schema.relations.iter().enumerate())
            .filter(|(_, rel)| rel.0 == t)
            .map(|(r, _)| r);
        match (loaded, &assembles[t]) {
            (Some(loaded), Some(src)) => pipeline::with_host_rows(src, loaded, |rows| {
                // A pruned batch's edges count its kept rows only.
                let kept: Vec<&[u8]>;
                let rows = match &f.plan {
                    Some(p) => {
                        kept = p.inputs(t).iter().map(|&r| rows[r as usize]).collect();
                        &kept[..]
                    }
                    None => rows,
                };
                for r in from_t {
                    let e = &layer.relations[r];
                    means[r] = Some(neighbour_means(rows, src.dim as usize, e)?);
                }
                Ok(())
            })?,
            _ => {
                for r in from_t {
                    let nd = layer.num_dst[schema.relations[r].2];
                    means[r] = Some(Tensor::f_zeros([nd, 0], (Kind::Float, f.device))?);
                }
            }
        }
    }
    Ok(means
        .into_iter()
        .map(|m| m.expect("every relation's source is a type"))
        .collect())
}

/// Each destination row's mean over its in-neighbours' rows along `e`
/// (zeros without any), as `embedding_bag` in mean mode gives it: `rows`
/// holds the source type's input rows, each its `dim` float32 values where
/// they lie. Destinations are shared out over rayon's threads; each sums
/// its neighbours in edge order, the next edge's row prefetched.
pub fn neighbour_means(rows: &[&[u8]], dim: usize, e: &RelationEdges) -> Result<Tensor> {
    let src = Vec::<i64>::try_from(&e.src)?;
    let offsets = Vec::<i64>::try_from(&e.offsets)?;
    let nd = offsets.len().saturating_sub(1);
    if let Some(&bad) = src.iter().find(|&&s| s < 0 || s as usize >= rows.len()) {
        return Err(Error::Internal(format!(
            "an edge's source row {bad} is past the type's {} rows",
            rows.len()
        )));
    }
    if let Some(row) = rows.iter().find(|r| r.len() != 4 * dim) {
        return Err(Error::Internal(format!(
            "a row of {} bytes where {dim} float32 values were expected",
            row.len()
        )));
    }
    let means = Tensor::f_empty([nd as i64, dim as i64], (Kind::Float, Device::Cpu))?;
    if nd * dim == 0 {
        return Ok(means);
    }
    // SAFETY: `means` is a new contiguous float32 CPU tensor of `nd * dim`
    // values that nothing else refers to; the slice ends before it is
    // returned, and every value is written below.
    let out = unsafe { std::slice::from_raw_parts_mut(means.data_ptr().cast::<f32>(), nd * dim) };
    out.par_chunks_mut(dim)
        .enumerate()
        .with_min_len(16)
        .for_each(|(d, acc)| {
            acc.fill(0.0);
            let (first, end) = (offsets[d] as usize, offsets[d + 1] as usize);
            for e in first..end {
                // The next edge's row is a random one: its loads start
                // while this row is summed.
                if let Some(&next) = src.get(e + 1) {
                    let row = rows[next as usize];
                    offgnn_shared::prefetch::lines_to_l2(row, 0, row.len());
                }
                add_row(acc, rows[src[e] as usize]);
            }
            if end > first {
                let scale = 1.0 / (end - first) as f32;
                acc.iter_mut().for_each(|a| *a *= scale);
            }
        });
    Ok(means)
}

/// `acc += row`, the row's float32 values read in place where aligned.
fn add_row(acc: &mut [f32], row: &[u8]) {
    match bytemuck::try_cast_slice::<u8, f32>(row) {
        Ok(values) => acc.iter_mut().zip(values).for_each(|(a, v)| *a += v),
        Err(_) => acc.iter_mut().zip(row.chunks_exact(4)).for_each(|(a, v)| {
            *a += f32::from_ne_bytes(v.try_into().expect("chunks of 4 bytes"));
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn means_equal_an_embedding_bag_over_the_assembled_rows() {
        let (n, dim) = (7usize, 5usize);
        let values: Vec<f32> = (0..n * dim).map(|i| (i as f32 * 0.37).sin()).collect();
        let bytes: Vec<u8> = bytemuck::cast_slice(&values).to_vec();
        // Each row a slice of its own, as the tiers hold them; one of them
        // misaligned, as a plain byte buffer may hold it.
        let mut shifted = vec![0u8; 4 * dim + 1];
        shifted[1..].copy_from_slice(&bytes[3 * 4 * dim..4 * 4 * dim]);
        let rows: Vec<&[u8]> = (0..n)
            .map(|i| {
                if i == 3 {
                    &shifted[1..]
                } else {
                    &bytes[i * 4 * dim..(i + 1) * 4 * dim]
                }
            })
            .collect();
        // Four destinations: two neighbours, none, one, four (a repeat).
        let (src, dst, counts) = (
            [4i64, 0, 6, 3, 3, 1, 2],
            [0i64, 0, 2, 3, 3, 3, 3],
            [2i64, 0, 1, 4],
        );
        let e = RelationEdges::new(&src, &dst, &counts, Device::Cpu);
        let got = neighbour_means(&rows, dim, &e).unwrap();
        let x = Tensor::from_slice(&values).view([n as i64, dim as i64]);
        let (want, _, _, _) =
            Tensor::embedding_bag::<Tensor>(&x, &e.src, &e.offsets, false, 1, false, None, true);
        assert_eq!(got.size(), want.size());
        let diff = (&got - &want).abs().max().double_value(&[]);
        assert!(diff < 1e-6, "{diff}\n{got}\n{want}");
        assert_eq!(got.get(1).abs().sum(Kind::Float).double_value(&[]), 0.0);
    }
}
