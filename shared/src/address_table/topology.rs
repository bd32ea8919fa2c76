//! A record's topology frame: the batch's split, epoch, index, labels,
//! input nodes, blocks and (in a link-prediction batch) node pairs, as
//! LEB128 varints with sorted arrays delta-coded and local source ids coded
//! against the next new id, then zstd. It does not depend on the layout's
//! plan, so the packer measures it before planning.

use super::reader::Reader;
use super::{BatchTable, ZSTD_LEVEL};
use crate::dataset::Split;
use crate::error::{Error, Result};
use crate::samples::{Block, Pairs};

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// How an array's values are written (as LEB128 varints).
#[derive(Clone, Copy)]
pub(super) enum Coding {
    /// As they are.
    Plain,
    /// Each as its difference from the one before (sorted arrays: small).
    Delta,
    /// A block's source ids, which the sampler numbers in order of first
    /// appearance after the destinations (`0..num_dst`): an id above every
    /// one before is written as twice its distance from the next new id
    /// (mostly 0), any other as twice itself plus one. On sampled blocks
    /// this takes a quarter less than zigzagged differences, compressed.
    NewIds { num_dst: u32 },
}

fn put_u32s(out: &mut Vec<u8>, v: &[u32], coding: Coding) {
    put_varint(out, v.len() as u64);
    let mut prev = 0u32;
    let mut next = match coding {
        Coding::NewIds { num_dst } => num_dst,
        _ => 0,
    };
    for &x in v {
        put_varint(
            out,
            match coding {
                Coding::Plain => u64::from(x),
                Coding::Delta => u64::from(x.wrapping_sub(prev)),
                Coding::NewIds { .. } if x >= next => {
                    let d = u64::from(x - next) * 2;
                    next = x.saturating_add(1);
                    d
                }
                Coding::NewIds { .. } => u64::from(x) * 2 + 1,
            },
        );
        prev = x;
    }
}

/// The body of a topology frame: split, epoch, index, input count, then
/// labels, input nodes and blocks (input layer first); varints.
fn topology_body(t: &BatchTable, out: &mut Vec<u8>) {
    out.clear();
    put_varint(
        out,
        match t.split {
            None => 0,
            Some(Split::Train) => 1,
            Some(Split::Valid) => 2,
            Some(Split::Test) => 3,
        },
    );
    put_varint(out, u64::from(t.epoch));
    put_varint(out, u64::from(t.index));
    put_varint(out, u64::from(t.num_inputs));
    put_u32s(out, &t.labels, Coding::Plain);
    put_u32s(out, &t.input_nodes, Coding::Plain);
    put_varint(out, t.blocks.len() as u64);
    for b in &t.blocks {
        put_varint(out, u64::from(b.num_src));
        put_varint(out, u64::from(b.num_dst));
        put_u32s(out, &b.src, Coding::NewIds { num_dst: b.num_dst });
        put_u32s(out, &b.dst, Coding::Delta);
    }
    // A node batch ends at its blocks, as every batch did before pairs.
    if !t.pairs.is_empty() {
        for v in [&t.pairs.src, &t.pairs.dst, &t.pairs.label, &t.pairs.query] {
            put_u32s(out, v, Coding::Plain);
        }
    }
}

/// Compresses a batch's topology (its labels, input nodes and blocks,
/// which do not depend on the layout's plan) into `out`: the frame
/// [`encode_into`] writes. The packer measures it before planning, so
/// that the disk budget can hold the tables.
pub fn topology_frame(
    t: &BatchTable,
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> std::io::Result<()> {
    topology_body(t, scratch);
    out.clear();
    out.reserve(zstd::compress_bound(scratch.len()));
    zstd::bulk::Compressor::new(ZSTD_LEVEL)?.compress_to_buffer(scratch.as_slice(), out)?;
    Ok(())
}

fn decompress(origin: &str, frame: &[u8]) -> Result<Vec<u8>> {
    use std::io::Read;
    let fail = |what: String| Error::Store {
        kind: None,
        url: origin.to_string(),
        fault: format!("corrupt address table: topology {what}"),
    };
    let declared = zstd::zstd_safe::get_frame_content_size(frame)
        .ok()
        .flatten()
        .ok_or_else(|| fail("frame has no size".into()))?;
    let mut body = Vec::with_capacity(declared.min(1 << 20) as usize);
    zstd::stream::read::Decoder::with_buffer(frame)
        .and_then(|d| d.take(declared.saturating_add(1)).read_to_end(&mut body))
        .map_err(|e| fail(format!("does not decompress: {e}")))?;
    if body.len() as u64 != declared {
        return Err(fail(format!(
            "decompresses to {} bytes, its frame says {declared}",
            body.len()
        )));
    }
    Ok(body)
}

/// What a record's topology frame holds.
pub(super) struct Topology {
    pub(super) split: Option<Split>,
    pub(super) epoch: u32,
    pub(super) index: u32,
    pub(super) num_inputs: u32,
    pub(super) labels: Vec<u32>,
    pub(super) input_nodes: Vec<u32>,
    pub(super) blocks: Vec<Block>,
    pub(super) pairs: Pairs,
}

/// Decompresses and decodes the topology, checking every block's ids
/// against its own and the input counts.
pub(super) fn read_topology(origin: &str, frame: &[u8]) -> Result<Topology> {
    let body = decompress(origin, frame)?;
    let mut t = Reader {
        bytes: &body,
        at: 0,
        origin,
    };
    let split = match t.varint()? {
        0 => None,
        1 => Some(Split::Train),
        2 => Some(Split::Valid),
        3 => Some(Split::Test),
        _ => return Err(t.fail("unknown split")),
    };
    let epoch = t.u32v()?;
    let index = t.u32v()?;
    let num_inputs = t.u32v()?;
    let labels = t.u32s(Coding::Plain)?;
    let input_nodes = t.u32s(Coding::Plain)?;
    let layers = t.varint()?;
    let mut blocks = Vec::with_capacity(layers.min(64) as usize);
    for _ in 0..layers {
        let num_src = t.u32v()?;
        let num_dst = t.u32v()?;
        let src = t.u32s(Coding::NewIds { num_dst })?;
        // Delta-coded, so sorted by destination, as the trainer's segment
        // reductions need.
        let dst = t.u32s(Coding::Delta)?;
        if src.len() != dst.len()
            || num_dst > num_src
            || num_src > num_inputs
            || src.iter().any(|&s| s >= num_src)
            || dst.iter().any(|&d| d >= num_dst)
        {
            return Err(t.fail("block out of range"));
        }
        blocks.push(Block {
            num_src,
            num_dst,
            src,
            dst,
            relations: Vec::new(),
        });
    }
    let mut pairs = Pairs::default();
    if t.at != body.len() {
        // The batch's seeds are the last block's destinations.
        let seeds = blocks.last().map_or(num_inputs, |b| b.num_dst);
        pairs = read_pairs(&mut t, seeds)?;
    }
    if t.at != body.len() {
        return Err(t.fail("trailing bytes in the topology"));
    }
    Ok(Topology {
        split,
        epoch,
        index,
        num_inputs,
        labels,
        input_nodes,
        blocks,
        pairs,
    })
}

/// A link batch's pairs after its blocks, checked: endpoints among the
/// `seeds`, labels 0 or 1, queries numbered in order from 0.
fn read_pairs(t: &mut Reader, seeds: u32) -> Result<Pairs> {
    let pairs = Pairs {
        src: t.u32s(Coding::Plain)?,
        dst: t.u32s(Coding::Plain)?,
        label: t.u32s(Coding::Plain)?,
        query: t.u32s(Coding::Plain)?,
    };
    let n = pairs.len();
    if n == 0
        || [pairs.dst.len(), pairs.label.len(), pairs.query.len()] != [n; 3]
        || pairs.src.iter().chain(&pairs.dst).any(|&v| v >= seeds)
        || pairs.label.iter().any(|&l| l > 1)
        || pairs.query[0] != 0
        || pairs
            .query
            .windows(2)
            .any(|w| w[1] != w[0] && w[1] != w[0] + 1)
    {
        return Err(t.fail("node pairs out of range"));
    }
    Ok(pairs)
}
