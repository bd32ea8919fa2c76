//! `offgnn._offgnn`: the trainer's loader ([`trainer::loader`]) as a
//! Python class. Tensors cross as DLPack capsules, without a copy: each
//! capsule owns a handle on its libtorch tensor, dropped when Python's
//! tensor is. `python/offgnn/` wraps it into `offgnn.Loader`.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use dlpark::ffi::{DLDataType, DLDevice, DLManagedTensor};
use dlpark::metadata::Dynamic;
use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tch::{Device, Kind, Tensor};
use trainer::distributed::Launch;
use trainer::error::Error;
use trainer::loader::{EdgeLabels, LoaderBatch, LoaderOptions, Next, Opened, TypedLoaderBatch};

/// How long a wait for the next batch lasts before Python's signals are
/// checked again (a Ctrl-C is seen within it).
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// An error as a Python exception with the trainer's one-line message:
/// bad arguments as `ValueError`, a statement over the memory given as
/// `MemoryError`, the rest as `RuntimeError`.
fn py_err(e: Error) -> PyErr {
    let line = e.to_string();
    match e {
        Error::OverMemory(_) => PyMemoryError::new_err(line),
        Error::InvalidArgument(_) => PyValueError::new_err(line),
        _ => PyRuntimeError::new_err(line),
    }
}

/// A tensor as a DLPack capsule that owns it (a shallow handle: the
/// storage stays libtorch's until Python's tensor lets it go).
fn capsule(py: Python<'_>, t: Tensor) -> PyResult<Bound<'_, PyAny>> {
    let dtype = match t.kind() {
        Kind::Float => DLDataType::F32,
        Kind::Int64 => DLDataType::I64,
        k => return Err(PyRuntimeError::new_err(format!("no DLPack type for {k:?}"))),
    };
    let device = match t.device() {
        Device::Cpu => DLDevice::CPU,
        Device::Cuda(i) => DLDevice::cuda(i as i32),
        d => {
            return Err(PyRuntimeError::new_err(format!(
                "no DLPack device for {d:?}"
            )));
        }
    };
    let data = t.data_ptr();
    let prepared = Dynamic::new(t.size(), t.stride())
        .prepare_as::<DLManagedTensor>()
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    let mut init = prepared.initialize(Box::new(t));
    init.set_data(data).set_dtype(dtype).set_device(device);
    // SAFETY: the descriptor's pointer, shape, strides, type and device are
    // the tensor's own, and the tensor (its storage) lives in the managed
    // tensor's context until the deleter drops it.
    let managed = unsafe { init.finish() };
    managed.into_pyobject(py)
}

/// A link batch's pairs into `d`, under `LinkNeighborLoader`'s names.
fn set_link(py: Python<'_>, d: &Bound<'_, PyDict>, l: EdgeLabels) -> PyResult<()> {
    d.set_item("edge_label_index", capsule(py, l.edge_label_index)?)?;
    d.set_item("edge_label", capsule(py, l.edge_label)?)?;
    d.set_item("edge_label_query", capsule(py, l.edge_label_query)?)
}

/// A batch as a dict of capsules and counts (python/offgnn/loader.py makes
/// it a `Data`): a node batch's `y`, or a link batch's pairs.
fn batch_dict(py: Python<'_>, b: LoaderBatch) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("x", capsule(py, b.x)?)?;
    d.set_item("edge_index", capsule(py, b.edge_index)?)?;
    match b.link {
        Some(l) => set_link(py, &d, l)?,
        None => d.set_item("y", capsule(py, b.y)?)?,
    }
    d.set_item("n_id", capsule(py, b.n_id)?)?;
    d.set_item("batch_size", b.batch_size)?;
    d.set_item("num_sampled_nodes", b.num_sampled_nodes)?;
    d.set_item("num_sampled_edges", b.num_sampled_edges)?;
    let blocks = PyList::empty(py);
    for (edges, num_src, num_dst) in b.blocks {
        blocks.append((capsule(py, edges)?, (num_src, num_dst)))?;
    }
    d.set_item("blocks", blocks)?;
    Ok(d)
}

/// A typed batch as a dict (python/offgnn/loader.py makes it a
/// `HeteroData`): per node type and per relation, as `batch_dict` has them;
/// a link batch's pairs on their relation, under `link`.
fn typed_dict(py: Python<'_>, b: TypedLoaderBatch) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("target", b.target)?;
    d.set_item("batch_size", b.batch_size)?;
    match b.link {
        Some((r, l)) => {
            let link = PyDict::new(py);
            link.set_item("key", b.relations[r].key.clone())?;
            set_link(py, &link, l)?;
            d.set_item("link", link)?;
        }
        None => d.set_item("y", capsule(py, b.y)?)?,
    }
    let types = PyList::empty(py);
    for t in b.types {
        let n = PyDict::new(py);
        n.set_item("name", t.name)?;
        n.set_item("x", capsule(py, t.x)?)?;
        n.set_item("n_id", capsule(py, t.n_id)?)?;
        n.set_item("num_sampled_nodes", t.num_sampled_nodes)?;
        types.append(n)?;
    }
    d.set_item("types", types)?;
    let relations = PyList::empty(py);
    for r in b.relations {
        let e = PyDict::new(py);
        e.set_item("key", r.key)?;
        e.set_item("edge_index", capsule(py, r.edge_index)?)?;
        e.set_item("num_sampled_edges", r.num_sampled_edges)?;
        relations.append(e)?;
    }
    d.set_item("relations", relations)?;
    let blocks = PyList::empty(py);
    for (edges, num_src, num_dst) in b.blocks {
        let edges = edges
            .into_iter()
            .map(|e| capsule(py, e))
            .collect::<PyResult<Vec<_>>>()?;
        blocks.append((edges, num_src, num_dst))?;
    }
    d.set_item("blocks", blocks)?;
    Ok(d)
}

/// What a layout's batches predict.
fn task(link: bool) -> &'static str {
    if link { "link" } else { "node" }
}

/// The loader: a packed layout opened, read in passes.
#[pyclass(name = "Loader", module = "offgnn._offgnn")]
struct PyLoader {
    /// `None` once closed.
    inner: Mutex<Option<Opened>>,
}

impl PyLoader {
    /// The open loader, or a refusal once it is closed.
    fn with<T>(&self, f: impl FnOnce(&mut Opened) -> PyResult<T>) -> PyResult<T> {
        // A panic with the lock held already ended the process's use of it.
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match guard.as_mut() {
            Some(loader) => f(loader),
            None => Err(PyValueError::new_err("the loader is closed")),
        }
    }
}

fn split_of(name: &str) -> PyResult<offgnn_manifests::Split> {
    offgnn_manifests::Split::from_name(name).ok_or_else(|| {
        PyValueError::new_err(format!(
            "split {name:?}: expected \"train\", \"valid\" or \"test\""
        ))
    })
}

#[pymethods]
impl PyLoader {
    #[new]
    #[pyo3(signature = (manifest, device, local_dir, memory, prefetch, seed, world, rank))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        manifest: String,
        device: &str,
        local_dir: Option<PathBuf>,
        memory: Option<&str>,
        prefetch: usize,
        seed: u64,
        world: Option<u32>,
        rank: Option<u32>,
    ) -> PyResult<Self> {
        let mut device = trainer::device::parse_device(device).map_err(|e| {
            // The trainer's line names its flag; here it is an argument.
            let line = e.to_string();
            PyValueError::new_err(match line.strip_prefix("--device ") {
                Some(rest) => format!("device={rest} (device=\"cpu\" reads onto the CPU)"),
                None => line,
            })
        })?;
        let memory = memory
            .map(offgnn_shared::sizes::parse_bytes)
            .transpose()
            .map_err(|e| PyValueError::new_err(format!("memory: {e}")))?;
        // Under torchrun or srun: this rank's share, on its local GPU, as
        // the trainer deals it.
        let ranks = match (world, rank) {
            (Some(w), Some(r)) => (w, r),
            (None, None) => {
                let launch = Launch::from_env(|k| std::env::var(k).ok()).map_err(py_err)?;
                launch.map_or((1, 0), |l| {
                    device = l.device(device);
                    (l.world, l.rank)
                })
            }
            _ => {
                return Err(PyValueError::new_err(
                    "give both world and rank, or neither",
                ));
            }
        };
        let opts = LoaderOptions {
            manifest,
            local_dir,
            device,
            memory,
            prefetch,
            seed,
            ranks,
        };
        let loader = py.detach(|| trainer::loader::open(opts)).map_err(py_err)?;
        Ok(PyLoader {
            inner: Mutex::new(Some(loader)),
        })
    }

    /// Batches `split` reads in `epoch`.
    fn num_batches(&self, split: &str, epoch: u32) -> PyResult<usize> {
        let split = split_of(split)?;
        self.with(|l| {
            Ok(match l {
                Opened::Nodes(l) => l.batches(split, epoch).len(),
                Opened::Typed(l) => l.batches(split, epoch).1.len(),
            })
        })
    }

    fn sampled_epochs(&self) -> PyResult<usize> {
        self.with(|l| {
            Ok(match l {
                Opened::Nodes(l) => l.sampled_epochs(),
                Opened::Typed(l) => l.sampled_epochs(),
            })
        })
    }

    /// The layout's classes and nodes, its feature widths (one, or per
    /// node type with the seeds' type), its task (a typed link layout's
    /// relation too), and the loader's stated peak host memory (None for a
    /// typed layout packed before the packer recorded its largest batch).
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.with(|l| {
            let d = PyDict::new(py);
            match l {
                Opened::Nodes(l) => {
                    let m = l.manifest();
                    d.set_item("feature_dim", m.dataset.feature_dim)?;
                    d.set_item("num_classes", m.dataset.num_classes)?;
                    d.set_item("num_nodes", m.dataset.num_nodes)?;
                    d.set_item("memory_bytes", l.memory.total_bytes)?;
                    d.set_item("task", task(m.samples.link.is_some()))?;
                }
                Opened::Typed(l) => {
                    let m = l.manifest();
                    let dims = PyDict::new(py);
                    for t in &m.node_types {
                        dims.set_item(&t.name, t.feature_dim.unwrap_or(0))?;
                    }
                    d.set_item("feature_dim", dims)?;
                    d.set_item("num_classes", m.dataset.num_classes)?;
                    d.set_item("num_nodes", m.dataset.num_nodes)?;
                    d.set_item("target", &m.dataset.target_type)?;
                    d.set_item("memory_bytes", l.memory.as_ref().map(|m| m.total_bytes))?;
                    let link = &m.dataset.link_relation;
                    d.set_item("task", task(!link.is_empty()))?;
                    let key = (!link.is_empty()).then(|| link.split(':').collect::<Vec<_>>());
                    d.set_item("link_edge_type", key)?;
                }
            }
            Ok(d)
        })
    }

    /// Starts a pass over `split`'s batches of `epoch`; returns how many.
    fn start(&self, py: Python<'_>, split: &str, epoch: u32) -> PyResult<usize> {
        let split = split_of(split)?;
        py.detach(|| {
            self.with(|l| {
                match l {
                    Opened::Nodes(l) => l.start(split, epoch),
                    Opened::Typed(l) => l.start(split, epoch),
                }
                .map_err(py_err)
            })
        })
    }

    /// The pass's next batch, or None at its end (or once closed). Waits
    /// with the GIL released, checking for signals (a KeyboardInterrupt
    /// stops the pass).
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        loop {
            let next = py.detach(|| {
                let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
                match guard.as_mut() {
                    None => Ok(Got::Done),
                    Some(Opened::Nodes(l)) => l.next(SIGNAL_CHECK).map(Got::nodes),
                    Some(Opened::Typed(l)) => l.next(SIGNAL_CHECK).map(Got::typed),
                }
            });
            match next.map_err(py_err)? {
                Got::Nodes(b) => return batch_dict(py, *b).map(Some),
                Got::Typed(b) => return typed_dict(py, *b).map(Some),
                Got::Done => return Ok(None),
                Got::Waiting => {
                    if let Err(e) = py.check_signals() {
                        self.stop(py)?;
                        return Err(e);
                    }
                }
            }
        }
    }

    /// The trainer's pipeline alone over `split`'s batches of `epoch`, no
    /// batch handed over (a benchmark's reference): (batches, seconds).
    fn pipeline_pass(&self, py: Python<'_>, split: &str, epoch: u32) -> PyResult<(usize, f64)> {
        let split = split_of(split)?;
        py.detach(|| {
            self.with(|l| match l {
                Opened::Nodes(l) => l.drain(split, epoch).map_err(py_err),
                Opened::Typed(_) => Err(PyValueError::new_err(
                    "pipeline_pass is for homogeneous layouts",
                )),
            })
        })
    }

    /// Ends the pass in progress: its threads are joined on return.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            match guard.as_mut() {
                None => Ok(()),
                Some(Opened::Nodes(l)) => l.stop(),
                Some(Opened::Typed(l)) => l.stop(),
            }
            .map_err(py_err)
        })
    }

    /// Ends the pass in progress and lets the layout go: the I/O engine's
    /// threads, the caches. Later calls are refused.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            let taken = self.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
            match taken {
                None => Ok(()),
                Some(Opened::Nodes(mut l)) => l.stop(),
                Some(Opened::Typed(mut l)) => l.stop(),
            }
            .map_err(py_err)
        })
    }
}

/// A batch of either kind, or why there is none.
enum Got {
    Nodes(Box<LoaderBatch>),
    Typed(Box<TypedLoaderBatch>),
    Waiting,
    Done,
}

impl Got {
    fn nodes(n: Next<LoaderBatch>) -> Got {
        match n {
            Next::Batch(b) => Got::Nodes(b),
            Next::Waiting => Got::Waiting,
            Next::Done => Got::Done,
        }
    }

    fn typed(n: Next<TypedLoaderBatch>) -> Got {
        match n {
            Next::Batch(b) => Got::Typed(b),
            Next::Waiting => Got::Waiting,
            Next::Done => Got::Done,
        }
    }
}

#[pymodule]
fn _offgnn(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLoader>()?;
    Ok(())
}
