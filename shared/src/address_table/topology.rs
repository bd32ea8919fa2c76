//! A record's topology frame: the batch's split, epoch, index, labels,
//! input nodes, blocks and (in a link-prediction batch) node pairs, as
//! LEB128 varints with sorted arrays delta-coded and local source ids coded
//! against the next new id, then zstd. It does not depend on the layout's
//! plan, so the packer measures it before planning.
//!
//! A typed layout's topology tables hold frames of the same body where
//! each block's relation offsets (`R + 1`, delta-coded) come before its
//! edges, and its destinations are delta-coded within each relation (a
//! typed block's edges are grouped by relation, sorted by destination
//! within each); no addresses: [`typed_topology_frame`],
//! [`decode_typed_topology`].

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
/// labels, input nodes and blocks (input layer first); varints. A typed
/// frame's blocks are followed by their relation offsets.
fn topology_body(t: &BatchTable, typed: bool, out: &mut Vec<u8>) {
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
        if typed {
            put_u32s(out, &b.relations, Coding::Delta);
        }
        put_u32s(out, &b.src, Coding::NewIds { num_dst: b.num_dst });
        if typed {
            for w in b.relations.windows(2) {
                let segment = b.dst.get(w[0] as usize..w[1] as usize).unwrap_or_default();
                put_u32s(out, segment, Coding::Delta);
            }
        } else {
            put_u32s(out, &b.dst, Coding::Delta);
        }
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
    topology_body(t, false, scratch);
    compress(scratch, out)
}

/// Compresses a typed batch's topology, its blocks' relation offsets
/// with it: a record of a typed layout's topology table.
pub fn typed_topology_frame(
    t: &BatchTable,
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> std::io::Result<()> {
    topology_body(t, true, scratch);
    compress(scratch, out)
}

/// Decodes a record of a typed layout's topology table into a table
/// without addresses, checking every block and its relation offsets
/// (`relations` relations each) and a link batch's pairs.
pub fn decode_typed_topology(origin: &str, frame: &[u8], relations: usize) -> Result<BatchTable> {
    let t = read_topology(origin, frame, Some(relations))?;
    if t.input_nodes.len() != t.num_inputs as usize || t.labels.len() > t.num_inputs as usize {
        return Err(Error::Store {
            kind: None,
            url: origin.to_string(),
            fault: "corrupt topology table: labels or input nodes do not match the input count"
                .into(),
        });
    }
    Ok(BatchTable {
        split: t.split,
        epoch: t.epoch,
        index: t.index,
        num_inputs: t.num_inputs,
        labels: t.labels,
        input_nodes: t.input_nodes,
        blocks: t.blocks,
        pairs: t.pairs,
        ..Default::default()
    })
}

fn compress(scratch: &[u8], out: &mut Vec<u8>) -> std::io::Result<()> {
    out.clear();
    out.reserve(zstd::compress_bound(scratch.len()));
    zstd::bulk::Compressor::new(ZSTD_LEVEL)?.compress_to_buffer(scratch, out)?;
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
/// against its own and the input counts; a typed frame's relation offsets
/// (`typed`: the relations' count) against its blocks.
pub(super) fn read_topology(origin: &str, frame: &[u8], typed: Option<usize>) -> Result<Topology> {
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
        let relations = match typed {
            Some(r) => read_offsets(&mut t, r)?,
            None => Vec::new(),
        };
        let src = t.u32s(Coding::NewIds { num_dst })?;
        // Delta-coded, so sorted by destination (in a typed block, within
        // each relation), as the trainer's segment reductions need.
        let dst = match typed {
            None => t.u32s(Coding::Delta)?,
            Some(_) => {
                let mut dst = Vec::with_capacity(src.len());
                for w in relations.windows(2) {
                    let segment = t.u32s(Coding::Delta)?;
                    if segment.len() != (w[1] - w[0]) as usize {
                        return Err(t.fail("a relation's edges do not match its offsets"));
                    }
                    dst.extend(segment);
                }
                dst
            }
        };
        if src.len() != dst.len()
            || (typed.is_some() && relations.last() != Some(&(src.len() as u32)))
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
            relations,
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

/// A typed block's relation offsets: `relations + 1` of them from 0,
/// non-decreasing (the edge count is checked against the last).
fn read_offsets(t: &mut Reader, relations: usize) -> Result<Vec<u32>> {
    let offsets = t.u32s(Coding::Delta)?;
    if offsets.len() != relations + 1 || offsets[0] != 0 {
        return Err(t.fail("relation offsets out of range"));
    }
    // Delta-coded from 0 without wrapping, so they never decrease.
    Ok(offsets)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A typed batch: two relations, destinations sorted within each but
    /// not across them.
    fn typed_batch() -> BatchTable {
        BatchTable {
            split: Some(Split::Train),
            epoch: 1,
            index: 4,
            num_inputs: 6,
            labels: vec![3, 0],
            input_nodes: vec![7, 2, 40, 41, 90, 3],
            blocks: vec![Block {
                num_src: 6,
                num_dst: 2,
                src: vec![2, 3, 4, 5, 2],
                dst: vec![0, 1, 1, 0, 1],
                relations: vec![0, 3, 5],
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_typed_frame_keeps_each_blocks_relations() {
        let t = typed_batch();
        let (mut scratch, mut frame) = (Vec::new(), Vec::new());
        typed_topology_frame(&t, &mut scratch, &mut frame).unwrap();
        let back = decode_typed_topology("t", &frame, 2).unwrap();
        assert_eq!(back, t);
        // Read for another relation count, the offsets do not fit.
        let err = decode_typed_topology("t", &frame, 3).unwrap_err();
        assert!(err.to_string().contains("relation offsets"), "{err}");
    }

    #[test]
    fn relation_offsets_that_do_not_cover_the_edges_are_refused() {
        let mut t = typed_batch();
        t.blocks[0].relations = vec![0, 3, 4];
        let (mut scratch, mut frame) = (Vec::new(), Vec::new());
        typed_topology_frame(&t, &mut scratch, &mut frame).unwrap();
        assert!(decode_typed_topology("t", &frame, 2).is_err());
    }
}
