//! The edge list: where the edges live (a `[2, E]` `.npy` or a CSV of
//! `src,dst` lines), how `metadata.yaml` names them, and the stream that
//! checks every id as the edges go past.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use super::checks::{require_integer, resolve};
use super::metadata::{EdgeMeta, Metadata};
use crate::error::{Error, Result};
use crate::npy::{DType, MappedU64, NpyFile};

/// Where the edges live.
#[derive(Debug)]
pub enum EdgeSource {
    /// `[2, E]` integer array: row 0 sources, row 1 destinations.
    Numpy(NpyFile),
    /// One `src,dst` pair per line, no header.
    Csv(PathBuf),
}

/// The edge list of a dataset, or of one relation of a typed dataset, with
/// the node counts its ids must respect.
#[derive(Debug)]
pub struct EdgeList {
    pub source: EdgeSource,
    /// The bound of source ids: the graph's nodes, or a relation's source
    /// type's.
    pub num_nodes: u64,
    /// The bound of destination ids: `num_nodes` but in a relation between
    /// two types.
    pub num_dst_nodes: u64,
    /// A relation's endpoint types, named in the errors on ids out of range.
    pub endpoint_types: Option<[String; 2]>,
}

/// The one edge type of `metadata.yaml`, its file opened and its shape
/// checked (the ids are checked as they stream, in [`EdgeList::for_each_chunk`]).
pub(super) fn open_edges(root: &Path, meta_path: &Path, meta: &Metadata) -> Result<EdgeSource> {
    let bad = |fault: String| Error::dataset(meta_path, fault);
    let [edge] = meta.graph.edges.as_slice() else {
        return Err(bad(format!(
            "graph.edges has {} entries; a graph of one node type has one edge type",
            meta.graph.edges.len()
        )));
    };
    if edge.edge_type.is_some() {
        return Err(bad(
            "graph.edges is typed but graph.nodes is not: give the nodes their types".into(),
        ));
    }
    open_edge_file(root, meta_path, edge)
}

/// One entry of `graph.edges`: its file opened and its shape checked.
pub(super) fn open_edge_file(root: &Path, meta_path: &Path, edge: &EdgeMeta) -> Result<EdgeSource> {
    let edge_path = resolve(root, meta_path, &edge.path)?;
    if !edge_path.exists() {
        return Err(Error::dataset(
            meta_path,
            format!(
                "graph.edges names {}, which does not exist",
                edge_path.display()
            ),
        ));
    }
    let source = match edge.format.as_str() {
        "numpy" => {
            let f = NpyFile::open(&edge_path)?;
            if f.shape().len() != 2 || f.shape()[0] != 2 {
                return Err(Error::npy(
                    &edge_path,
                    format!("edges must have shape [2, E], found {:?}", f.shape()),
                ));
            }
            require_integer(&f)?;
            EdgeSource::Numpy(f)
        }
        "csv" => {
            fs::metadata(&edge_path).map_err(|e| Error::io(&edge_path, e))?;
            EdgeSource::Csv(edge_path)
        }
        other => {
            return Err(Error::dataset(
                meta_path,
                format!("edge format '{other}' is not supported (numpy or csv)"),
            ));
        }
    };
    Ok(source)
}

impl EdgeList {
    /// Number of edges, when known without a scan (numpy).
    pub fn len_hint(&self) -> Option<u64> {
        match &self.source {
            EdgeSource::Numpy(f) => Some(f.shape()[1]),
            EdgeSource::Csv(_) => None,
        }
    }

    /// At least the number of edges, known without a scan: a NumPy file's
    /// shape, or a CSV's size over its smallest line (`0,1\n`, 4 bytes).
    pub fn max_edges(&self) -> u64 {
        match &self.source {
            EdgeSource::Numpy(f) => f.shape()[1],
            EdgeSource::Csv(path) => fs::metadata(path).map_or(0, |m| m.len() / 4),
        }
    }

    pub fn path(&self) -> &Path {
        match &self.source {
            EdgeSource::Numpy(f) => f.path(),
            EdgeSource::Csv(p) => p,
        }
    }

    /// `ids` (edge `base` on, the `what` side: "source" or "destination")
    /// below their side's node count; the first that is not named with its
    /// edge, or as a negative value of the file.
    fn check_ids(&self, path: &Path, ids: &[u64], base: u64, what: &str) -> Result<()> {
        let (bound, of_type) = match what {
            "source" => (self.num_nodes, self.endpoint_types.as_ref().map(|t| &t[0])),
            _ => (
                self.num_dst_nodes,
                self.endpoint_types.as_ref().map(|t| &t[1]),
            ),
        };
        // One comparison an id: the branch is taken once, at a bad id.
        if ids.iter().fold(false, |bad, &v| bad | (v >= bound)) {
            let (i, &v) = ids
                .iter()
                .enumerate()
                .find(|(_, v)| **v >= bound)
                .expect("an id out of range");
            if let EdgeSource::Numpy(file) = &self.source
                && file.dtype() == DType::I64
                && (v as i64) < 0
            {
                let side = if what == "source" { 0 } else { file.shape()[1] };
                return Err(Error::npy(
                    path,
                    format!(
                        "negative value {} at element {}",
                        v as i64,
                        side + base + i as u64
                    ),
                ));
            }
            let nodes = match of_type {
                Some(t) => format!("{bound} nodes of type '{t}'"),
                None => format!("{bound} nodes"),
            };
            return Err(Error::npy(
                path,
                format!(
                    "{what} id {v} of edge {} is out of range for {nodes}",
                    base + i as u64
                ),
            ));
        }
        Ok(())
    }

    /// Streams the edges in chunks of at most `chunk` pairs, checking every
    /// id against the node count. Memory stays at `O(chunk)`. `f`'s errors
    /// are the caller's own type, which this module's convert into.
    pub fn for_each_chunk<E: From<Error>>(
        &self,
        chunk: usize,
        mut f: impl FnMut(&[u64], &[u64]) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        self.for_each_chunk_vec(chunk, |src, dst| f(src, dst))
    }

    /// As [`EdgeList::for_each_chunk`] for a NumPy file of 64-bit ids,
    /// each chunk's two sides mapped from the file rather than read into
    /// vectors: no copy, no fresh pages, and no thread to read ahead.
    /// `None` where the file is not such a file (the caller reads it).
    pub fn for_each_chunk_mapped<E: From<Error>>(
        &self,
        chunk: usize,
        mut f: impl FnMut(&[u64], &[u64]) -> std::result::Result<(), E>,
    ) -> Option<std::result::Result<(), E>> {
        let EdgeSource::Numpy(file) = &self.source else {
            return None;
        };
        if !file.maps_u64() {
            return None;
        }
        let e = file.shape()[1];
        let chunk = chunk.max(1);
        let sides = |start: u64| -> Result<Option<(MappedU64, MappedU64)>> {
            let n = chunk.min((e - start) as usize);
            Ok(file.map_u64(start, n)?.zip(file.map_u64(e + start, n)?))
        };
        let mut start = 0u64;
        let mut each = || -> std::result::Result<(), E> {
            while start < e {
                let (src, dst) = sides(start)?.ok_or_else(|| {
                    Error::npy(file.path(), "an edge chunk could not be mapped aligned")
                })?;
                let (src, dst) = (src.as_slice(), dst.as_slice());
                let (checked_src, checked_dst) = rayon::join(
                    || self.check_ids(file.path(), src, start, "source"),
                    || self.check_ids(file.path(), dst, start, "destination"),
                );
                checked_src.and(checked_dst)?;
                f(src, dst)?;
                start += src.len() as u64;
            }
            Ok(())
        };
        Some(each())
    }

    /// As [`EdgeList::for_each_chunk`], handing `f` the vectors the chunk
    /// was read into: `f` may swap them for others and keep them, so that
    /// a reader thread passes chunks on without copying them.
    pub fn for_each_chunk_vec<E: From<Error>>(
        &self,
        chunk: usize,
        mut f: impl FnMut(&mut Vec<u64>, &mut Vec<u64>) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let chunk = chunk.max(1);
        match &self.source {
            EdgeSource::Numpy(file) => {
                let e = file.shape()[1];
                let mut start = 0u64;
                let (mut raw, mut src, mut dst) = (Vec::new(), Vec::new(), Vec::new());
                // Edge files' usual dtypes are read straight into the ids; a
                // negative i64 comes out past every bound, and `check_ids` names it.
                let direct = matches!(file.dtype(), DType::I64 | DType::U64);
                while start < e {
                    let n = chunk.min((e - start) as usize);
                    if direct {
                        file.read_u64_direct(start, n, &mut src)?;
                        file.read_u64_direct(e + start, n, &mut dst)?;
                    } else {
                        file.read_u64_into(start, n, &mut raw, &mut src)?;
                        file.read_u64_into(e + start, n, &mut raw, &mut dst)?;
                    }
                    self.check_ids(file.path(), &src, start, "source")?;
                    self.check_ids(file.path(), &dst, start, "destination")?;
                    f(&mut src, &mut dst)?;
                    start += n as u64;
                }
                Ok(())
            }
            EdgeSource::Csv(path) => {
                let file = fs::File::open(path).map_err(|e| Error::io(path, e))?;
                let reader = BufReader::with_capacity(1 << 20, file);
                let (mut src, mut dst) = (Vec::with_capacity(chunk), Vec::with_capacity(chunk));
                let mut base = 0u64;
                for (lineno, line) in reader.lines().enumerate() {
                    let line = line.map_err(|e| Error::io(path, e))?;
                    let line = line.trim();
                    if line.is_empty() {
                        continue;
                    }
                    let parse = |s: Option<&str>| -> Result<u64> {
                        let s = s.map(str::trim).unwrap_or("");
                        s.parse::<u64>().map_err(|_| {
                            Error::dataset(
                                path,
                                format!(
                                    "line {}: expected 'src,dst' with non-negative integer ids, found '{line}'",
                                    lineno + 1
                                ),
                            )
                        })
                    };
                    // GraphBolt reads edge CSV without a header: a first line
                    // of names is refused as such, not as a bad edge.
                    if lineno == 0 && line.chars().any(|c| c.is_ascii_alphabetic()) {
                        return Err(Error::dataset(
                            path,
                            format!(
                                "line 1 '{line}' is a header; GraphBolt's edge CSV has none (one 'src,dst' pair of integer ids per line): remove it"
                            ),
                        )
                        .into());
                    }
                    let mut parts = line.split(',');
                    let (s, d) = (parse(parts.next())?, parse(parts.next())?);
                    if parts.next().is_some() {
                        return Err(Error::dataset(
                            path,
                            format!("line {}: more than two columns", lineno + 1),
                        )
                        .into());
                    }
                    src.push(s);
                    dst.push(d);
                    if src.len() == chunk {
                        self.check_ids(path, &src, base, "source")?;
                        self.check_ids(path, &dst, base, "destination")?;
                        let len = src.len() as u64;
                        f(&mut src, &mut dst)?;
                        base += len;
                        src.clear();
                        dst.clear();
                    }
                }
                if !src.is_empty() {
                    self.check_ids(path, &src, base, "source")?;
                    self.check_ids(path, &dst, base, "destination")?;
                    f(&mut src, &mut dst)?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::npy::NpyWriter;

    fn edge_file(path: &Path, dtype: DType, src: &[u64], dst: &[u64]) -> EdgeList {
        let mut w = NpyWriter::create(path, dtype, &[2, src.len() as u64]).unwrap();
        let mut bytes = Vec::new();
        for &v in src.iter().chain(dst) {
            match dtype {
                DType::I32 => bytes.extend_from_slice(&(v as i32).to_le_bytes()),
                _ => bytes.extend_from_slice(&(v as i64).to_le_bytes()),
            }
        }
        w.write_bytes(&bytes).unwrap();
        w.finish().unwrap();
        EdgeList {
            source: EdgeSource::Numpy(NpyFile::open(path).unwrap()),
            num_nodes: 1000,
            num_dst_nodes: 1000,
            endpoint_types: None,
        }
    }

    /// Each chunk's two sides.
    type Chunks = Vec<(Vec<u64>, Vec<u64>)>;

    fn chunks(edges: &EdgeList, mapped: bool, chunk: usize) -> Option<Result<Chunks>> {
        let mut got = Vec::new();
        let mut keep = |s: &[u64], d: &[u64]| -> Result<()> {
            got.push((s.to_vec(), d.to_vec()));
            Ok(())
        };
        let streamed = if mapped {
            edges.for_each_chunk_mapped(chunk, &mut keep)?
        } else {
            edges.for_each_chunk(chunk, &mut keep)
        };
        Some(streamed.map(|()| got))
    }

    #[test]
    fn mapped_chunks_are_the_chunks_read_and_ids_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        // Chunks of 700 ids cross the file's pages at odd places.
        let src: Vec<u64> = (0..2500).map(|i| i * 7 % 1000).collect();
        let dst: Vec<u64> = (0..2500).map(|i| i * 13 % 1000).collect();
        let edges = edge_file(&dir.path().join("e.npy"), DType::I64, &src, &dst);
        let read = chunks(&edges, false, 700).unwrap().unwrap();
        assert_eq!(read.len(), 4);
        assert_eq!(chunks(&edges, true, 700).unwrap().unwrap(), read);

        let narrow = edge_file(&dir.path().join("n.npy"), DType::I32, &src, &dst);
        assert!(
            chunks(&narrow, true, 700).is_none(),
            "int32 is read, not mapped"
        );

        let mut bad = dst.clone();
        bad[1900] = 1000;
        let edges = edge_file(&dir.path().join("b.npy"), DType::I64, &src, &bad);
        let e = chunks(&edges, true, 700).unwrap().unwrap_err().to_string();
        assert!(e.contains("destination id 1000 of edge 1900"), "{e}");
    }
}
