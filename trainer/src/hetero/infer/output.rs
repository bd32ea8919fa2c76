//! The last layer's rows as Parquet parts under `--out`, a group's in parts
//! of bounded size ([`part_bytes`]): `RUN/TYPE/part-GGGGGG-KKKK.parquet`, each
//! row a node's type-local id and the
//! columns asked for (the target type's class, probabilities and logits;
//! every type's embedding).

use std::sync::Arc;

use arrow::array::{ArrayRef, FixedSizeListArray, Float32Array, Int64Array, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use offgnn_shared::commit::RunId;
use offgnn_shared::store::Store;
use tch::{Kind, Tensor};

use crate::error::{Error, Result};
use crate::inference::Outputs;

/// Whether `name` (relative to `--out`) is a part a typed run writes.
pub(super) fn is_part(name: &str) -> bool {
    let mut parts = name.split('/');
    let (Some(run), Some(_type), Some(file), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
    RunId::is_run_id(run)
        && file
            .strip_prefix("part-")
            .and_then(|f| f.strip_suffix(".parquet"))
            .and_then(|f| f.split_once('-'))
            .is_some_and(|(g, k)| digits(g, 6) && digits(k, 4))
}

/// Values of the output a part holds at most: a sixty-fourth of `memory`, at
/// most 64 MiB.
pub(super) fn part_bytes(memory: u64) -> u64 {
    (memory / 64).clamp(16 << 10, 64 << 20)
}

/// Writes `p`'s rows in parts of at most [`part_bytes`] of values; returns
/// each part's name and rows.
pub(super) fn write_parts(
    out: &Store,
    run: &RunId,
    (outputs, memory): (Outputs, u64),
    p: &Part<'_>,
) -> Result<Vec<(String, u64)>> {
    let width = p.embedding.size()[1] + 2 * p.logits.map_or(0, |l| l.size()[1]);
    let rows = p.keep.len() as i64;
    let step = (part_bytes(memory) as i64 / (4 * width + 16)).max(1);
    let mut written = Vec::new();
    for (k, at) in (0..rows).step_by(step as usize).enumerate() {
        let n = step.min(rows - at);
        let logits = p.logits.map(|l| l.narrow(0, at, n));
        let piece = Part {
            type_name: p.type_name,
            group: p.group,
            first: p.first + at as u64,
            keep: p.keep[at as usize..(at + n) as usize].to_vec(),
            embedding: &p.embedding.narrow(0, at, n),
            logits: logits.as_ref(),
        };
        written.extend(write_part(out, run, outputs, &piece, k)?);
    }
    Ok(written)
}

/// One group's rows of the last layer, for one type.
pub(super) struct Part<'a> {
    pub type_name: &'a str,
    pub group: usize,
    /// The group's first type-local id.
    pub first: u64,
    /// Which of the group's rows are written.
    pub keep: Vec<bool>,
    /// The type's last layer's rows.
    pub embedding: &'a Tensor,
    /// The target type's logits.
    pub logits: Option<&'a Tensor>,
}

/// Writes `p` under `run` in `out` (nothing when no row is kept); returns
/// its name and rows.
fn write_part(
    out: &Store,
    run: &RunId,
    outputs: Outputs,
    p: &Part<'_>,
    k: usize,
) -> Result<Option<(String, u64)>> {
    let keep: Vec<i64> = (0..p.keep.len() as i64)
        .filter(|&i| p.keep[i as usize])
        .collect();
    if keep.is_empty() {
        return Ok(None);
    }
    let index = Tensor::from_slice(&keep);
    let ids: Vec<u64> = keep.iter().map(|&i| p.first + i as u64).collect();
    let mut fields = vec![Field::new("node_id", DataType::UInt64, false)];
    let mut columns: Vec<ArrayRef> = vec![Arc::new(UInt64Array::from(ids))];
    if let Some(logits) = p.logits {
        let logits = logits.index_select(0, &index);
        let class = Vec::<i64>::try_from(logits.argmax(1, false)).map_err(Error::from)?;
        fields.push(Field::new("class", DataType::Int64, false));
        columns.push(Arc::new(Int64Array::from(class)));
        if outputs.probabilities {
            let prob = logits.softmax(1, Kind::Float);
            push_list(&mut fields, &mut columns, "probabilities", &prob)?;
        }
        if outputs.logits {
            push_list(&mut fields, &mut columns, "logits", &logits)?;
        }
    }
    if outputs.embedding() {
        let h = p.embedding.index_select(0, &index);
        push_list(&mut fields, &mut columns, "embedding", &h)?;
    }
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), columns)
        .map_err(|e| Error::InvalidArgument(format!("output rows: {e}")))?;
    let mut bytes = Vec::new();
    let lists = schema
        .fields()
        .iter()
        .filter(|f| matches!(f.data_type(), DataType::FixedSizeList(..)))
        .map(|f| f.name().as_str());
    let props = crate::inference::output::part_properties(lists);
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut bytes, schema, Some(props))
        .map_err(|cause| Error::Parquet { cause })?;
    w.write(&batch).map_err(|cause| Error::Parquet { cause })?;
    w.close().map_err(|cause| Error::Parquet { cause })?;
    let name = format!("{run}/{}/part-{:06}-{k:04}.parquet", p.type_name, p.group);
    out.put(&name, bytes)?;
    Ok(Some((name, keep.len() as u64)))
}

/// Appends `t`'s rows as a column of fixed-size float32 lists.
fn push_list(
    fields: &mut Vec<Field>,
    columns: &mut Vec<ArrayRef>,
    name: &str,
    t: &Tensor,
) -> Result<()> {
    let width = t.size()[1] as i32;
    let values =
        Vec::<f32>::try_from(t.to_kind(Kind::Float).flatten(0, -1)).map_err(Error::from)?;
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let list = FixedSizeListArray::try_new(
        item.clone(),
        width,
        Arc::new(Float32Array::from(values)),
        None,
    )
    .map_err(|e| Error::InvalidArgument(format!("output column {name}: {e}")))?;
    fields.push(Field::new(
        name,
        DataType::FixedSizeList(item, width),
        false,
    ));
    columns.push(Arc::new(list));
    Ok(())
}

/// The columns written for `outputs`, for the target type and the others.
pub(super) fn columns(outputs: Outputs) -> (Vec<String>, Vec<String>) {
    let mut target = vec!["node_id".to_string()];
    if outputs.class() {
        target.push("class".into());
    }
    if outputs.probabilities {
        target.push("probabilities".into());
    }
    if outputs.logits {
        target.push("logits".into());
    }
    let mut others = vec!["node_id".to_string()];
    if outputs.embedding() {
        target.push("embedding".into());
        others.push("embedding".into());
    }
    (target, others)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_typed_parts_are_parts() {
        let run = RunId::new();
        assert!(is_part(&format!("{run}/paper/part-000003-0001.parquet")));
        assert!(!is_part(&format!("{run}/paper/part-000003.parquet")));
        assert!(!is_part(&format!("{run}/part-000003-0000.parquet")));
        assert!(!is_part(&format!("{run}/paper/notes.txt")));
        assert!(!is_part("not-a-run/paper/part-000003.parquet"));
    }
}
