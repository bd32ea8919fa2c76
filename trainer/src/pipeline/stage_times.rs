//! How long each stage was busy: seconds on the host and, on CUDA, on the
//! device, from events recorded around each batch's work on the stage's
//! own stream; and the side streams the stages run on.

use tch::Device;

use super::ready::Ready;
use crate::cuda::{Event, Stream};
use crate::error::Result;

/// Busy seconds of each stage over a run of batches.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct StageTimes {
    pub load: f64,
    pub assemble: f64,
    pub graph: f64,
    pub model: f64,
    /// On CUDA: the device's time in each stage's work, from CUDA events.
    /// The host's times above are then what queueing the work took (and,
    /// for the model step, waiting on the device).
    pub device: Option<DeviceTimes>,
}

/// Seconds of device time per stage, from CUDA events recorded around each
/// batch's work on the stage's stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DeviceTimes {
    pub assemble: f64,
    pub graph: f64,
    pub model: f64,
}

impl std::ops::Add for DeviceTimes {
    type Output = DeviceTimes;
    fn add(self, o: DeviceTimes) -> DeviceTimes {
        DeviceTimes {
            assemble: self.assemble + o.assemble,
            graph: self.graph + o.graph,
            model: self.model + o.model,
        }
    }
}

/// A batch's work in one stage on the device: events before and after it.
pub(super) type Span = Option<(Event, Event)>;

/// Runs `f`; on CUDA, records timing events around the work it queued on
/// the calling thread's current stream.
pub(super) fn timed<T>(device: Device, f: impl FnOnce() -> Result<T>) -> Result<(T, Span)> {
    if !device.is_cuda() {
        return Ok((f()?, None));
    }
    let start = Event::record(device, true)?;
    let out = f()?;
    Ok((out, Some((start, Event::record(device, true)?))))
}

/// The device time of each stage's spans; waits for the last of them.
#[derive(Default)]
pub(super) struct DeviceSpans {
    assemble: Vec<(Event, Event)>,
    graph: Vec<(Event, Event)>,
    pub(super) model: Vec<(Event, Event)>,
}

impl DeviceSpans {
    /// Before the model step uses a batch: its stream waits (on the
    /// device) for the batch's assembly and graph work, which the pipeline
    /// queued on those stages' own streams, and the caching allocator
    /// learns that the batch's tensors are used on it too. The block
    /// tensors, labels and pairs are views of one upload, so one record
    /// covers them (a pair's, where the labels are empty).
    pub(super) fn receive(&mut self, r: &Ready, assembled: Span, graphed: Span) -> Result<()> {
        for (span, to) in [(assembled, &mut self.assemble), (graphed, &mut self.graph)] {
            if let Some(span) = span {
                span.1.wait_on_device()?;
                to.push(span);
            }
        }
        if r.x.device().is_cuda() {
            crate::cuda::record_stream(&r.x)?;
            crate::cuda::record_stream(&r.labels)?;
            if let Some(p) = &r.pairs {
                crate::cuda::record_stream(&p.src)?;
            }
        }
        Ok(())
    }

    pub(super) fn times(self) -> Result<Option<DeviceTimes>> {
        if self.model.is_empty() {
            return Ok(None);
        }
        let total = |spans: Vec<(Event, Event)>| -> Result<f64> {
            spans.iter().map(|(a, b)| a.seconds_to(b)).sum()
        };
        Ok(Some(DeviceTimes {
            assemble: total(self.assemble)?,
            graph: total(self.graph)?,
            model: total(self.model)?,
        }))
    }
}

/// Makes a stream from libtorch's pool current on this thread (CUDA): the
/// stage's copies and gathers then overlap the model step, which runs on
/// the default stream.
pub(super) fn side_stream(device: Device) -> Result<Option<Stream>> {
    if !device.is_cuda() {
        return Ok(None);
    }
    let stream = Stream::from_pool(device)?;
    stream.make_current()?;
    Ok(Some(stream))
}
