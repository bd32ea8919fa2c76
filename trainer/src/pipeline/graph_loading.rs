//! Stage 3, graph loading (DiskGNN §5.3): a batch's blocks and labels (or,
//! in a link-prediction batch, its node pairs) as int64 tensors on the
//! device, from one staging buffer.

use offgnn_shared::address_table::BatchTable;
use tch::{Device, Tensor};

use super::staging_buffer::{Staging, indices_at, put_indices};
use crate::error::Result;
use crate::link::PairTensors;
use crate::model::BlockTensors;

/// In-degree of each of `num_dst` destinations and where each one's edges
/// start (`num_dst + 1` entries), for edges sorted by destination (as a
/// decoded table's are). Counted here on the host: on CUDA, `bincount`
/// must learn its output's size from the device, a sync per block.
fn degrees(dst: &[u32], num_dst: usize) -> (Vec<i64>, Vec<i64>) {
    debug_assert!(dst.is_sorted(), "block edges sorted by destination");
    let mut counts = vec![0i64; num_dst];
    for &d in dst {
        counts[d as usize] += 1;
    }
    let mut offsets = Vec::with_capacity(num_dst + 1);
    offsets.push(0);
    let mut at = 0;
    for &c in &counts {
        at += c;
        offsets.push(at);
    }
    (counts, offsets)
}

/// A batch's graph on the device: what the model step needs beside the
/// input rows.
pub struct Graph {
    pub blocks: Vec<BlockTensors>,
    pub labels: Tensor,
    /// A link-prediction batch's pairs (its labels are then empty).
    pub pairs: Option<PairTensors>,
    /// The global id of each input row, on the host.
    pub n_id: Vec<u32>,
}

/// Stage 3: the batch's blocks and labels as tensors on the device. Every
/// index (each block's edges, degrees and offsets, then the labels, then
/// the pairs' endpoints, labels and queries) is written as int64 into one
/// staging buffer that goes to the device in one copy (non-blocking on
/// CUDA, from page-locked memory); the tensors are views of it.
pub fn graph(t: &BatchTable, device: Device) -> Result<Graph> {
    let degrees: Vec<(Vec<i64>, Vec<i64>)> = t
        .blocks
        .iter()
        .map(|b| degrees(&b.dst, b.num_dst as usize))
        .collect();
    let parts = t
        .blocks
        .iter()
        .zip(&degrees)
        .map(|(b, (c, o))| 2 * b.src.len() + c.len() + o.len())
        .sum::<usize>()
        + t.labels.len()
        + 4 * t.pairs.len();
    let mut staged = Staging::new(parts * 8, device)?;
    {
        let mut out = staged.bytes_mut();
        let mut put = |v: &mut dyn Iterator<Item = i64>, len: usize| {
            let (head, rest) = std::mem::take(&mut out).split_at_mut(len * 8);
            put_indices(head, v);
            out = rest;
        };
        for (b, (counts, offsets)) in t.blocks.iter().zip(&degrees) {
            put(&mut b.src.iter().map(|&x| x as i64), b.src.len());
            put(&mut b.dst.iter().map(|&x| x as i64), b.dst.len());
            put(&mut counts.iter().copied(), counts.len());
            put(&mut offsets.iter().copied(), offsets.len());
        }
        put(&mut t.labels.iter().map(|&x| x as i64), t.labels.len());
        let p = &t.pairs;
        for v in [&p.src, &p.dst, &p.label, &p.query] {
            put(&mut v.iter().map(|&x| x as i64), v.len());
        }
    }
    let dev = staged.upload(device)?;
    let mut at = 0usize;
    let mut next = |len: usize| -> Result<Tensor> {
        let v = indices_at(&dev, at * 8, len)?;
        at += len;
        Ok(v)
    };
    let mut blocks = Vec::with_capacity(t.blocks.len());
    for (b, (counts, offsets)) in t.blocks.iter().zip(&degrees) {
        blocks.push(BlockTensors {
            src: next(b.src.len())?,
            dst: next(b.dst.len())?,
            num_src: b.num_src as i64,
            num_dst: b.num_dst as i64,
            counts: next(counts.len())?,
            offsets: next(offsets.len())?,
        });
    }
    let labels = next(t.labels.len())?;
    let pairs = if t.pairs.is_empty() {
        None
    } else {
        let n = t.pairs.len();
        Some(PairTensors {
            src: next(n)?,
            dst: next(n)?,
            label: next(n)?,
            query: next(n)?,
            num_queries: t.pairs.query.last().map_or(0, |&q| i64::from(q) + 1),
        })
    };
    Ok(Graph {
        blocks,
        labels,
        pairs,
        n_id: t.input_nodes.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::degrees;
    use tch::{Kind, Tensor};

    #[test]
    fn host_degrees_equal_torch_bincount_and_cumsum() {
        let dst: Vec<u32> = vec![0, 0, 2, 2, 2, 3, 6, 6];
        let (counts, offsets) = degrees(&dst, 8);
        let t: Vec<i64> = dst.iter().map(|&d| d as i64).collect();
        let want = Tensor::from_slice(&t).bincount(None::<Tensor>, 8);
        assert_eq!(counts, Vec::<i64>::try_from(&want).unwrap());
        let cum = Vec::<i64>::try_from(&want.cumsum(0, Kind::Int64)).unwrap();
        assert_eq!(offsets[0], 0);
        assert_eq!(&offsets[1..], cum.as_slice());
        assert_eq!(offsets.len(), 9);
        // No edges: every destination has degree 0.
        assert_eq!(degrees(&[], 3), (vec![0; 3], vec![0; 4]));
    }
}
