//! One budget over every node type. The GPU and CPU caches are filled as
//! one ranking of all types' rows would fill them: the rows most training
//! batches read first, whatever their type, each costing its own row's
//! bytes; the GPU cache takes the most read, the CPU cache the next. The
//! disk budget holds the topology tables first, then each type's smallest
//! layout (its caches and address tables, and a bound on the rows its
//! batches read once each, page-rounded), and splits what is left over the
//! types in proportion to their feature files (each type's disk caches and
//! packed chunks get the same multiple of its file).

use std::collections::BTreeMap;

use offgnn_shared::dataset::Split;
use offgnn_shared::report::human_bytes;

use super::TypeView;
use crate::error::{Error, Result};
use crate::plan::{BatchInfo, align};

/// One type's budgets, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Share {
    pub gpu: u64,
    pub cpu: u64,
    pub disk: u64,
}

/// What the split reads of each type with features: its view, its loaded
/// batches, and its row's and feature file's bytes as the layout stores
/// them.
pub(crate) type TypeInputs<'a> = (&'a [TypeView], &'a [Vec<BatchInfo>], &'a [u64], &'a [u64]);

/// Every type's budgets, by position among the types with features.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Shares {
    pub gpu: Vec<u64>,
    pub cpu: Vec<u64>,
    pub disk: Vec<u64>,
}

impl Shares {
    /// Splits the caches' bytes and the disk budget over the types:
    /// `lists` holds each type's loaded batches, `row_bytes` and `stored`
    /// its row's and feature file's bytes as the layout stores them.
    pub(crate) fn split(
        (views, lists, row_bytes, stored): TypeInputs<'_>,
        (gpu, cpu): (u64, u64),
        disk_budget: u64,
        topology_bytes: u64,
    ) -> Result<Shares> {
        let levels = read_levels(views, lists, row_bytes);
        let mut fill = Fill::new(&levels, views.len());
        let gpu = fill.take(gpu);
        let cpu = fill.take(cpu);
        let fixed: Vec<u64> = (0..views.len())
            .map(|t| {
                let tables: u64 = lists[t].iter().map(|b| b.table_bytes).sum();
                align(gpu[t])
                    + align(cpu[t])
                    + tables
                    + rows_once(&views[t], &lists[t], row_bytes[t])
            })
            .collect();
        let held = topology_bytes + fixed.iter().sum::<u64>();
        let Some(rest) = disk_budget.checked_sub(held) else {
            return Err(Error::InvalidArgument(format!(
                "the disk budget of {} holds less than the topology tables ({}) and the node types' smallest layouts ({}: caches, address tables, and the rows their batches read, once each); raise --disk-budget to at least {held}, or lower --gpu-cache and --cpu-cache",
                human_bytes(disk_budget),
                human_bytes(topology_bytes),
                human_bytes(held - topology_bytes)
            )));
        };
        let total: u128 = stored.iter().map(|&s| u128::from(s)).sum::<u128>().max(1);
        let disk = fixed
            .iter()
            .zip(stored)
            .map(|(&f, &s)| f + (u128::from(rest) * u128::from(s) / total) as u64)
            .collect();
        Ok(Shares { gpu, cpu, disk })
    }

    pub(crate) fn of(&self, t: usize) -> Share {
        Share {
            gpu: self.gpu[t],
            cpu: self.cpu[t],
            disk: self.disk[t],
        }
    }
}

/// A bound on the disk bytes a type's smallest layout holds besides its
/// caches and tables: the rows its training batches read, once each, and
/// the validation and test segments' own copies of theirs, each rounded
/// up to pages with a page for each segment's footer and alignment.
fn rows_once(view: &TypeView, list: &[BatchInfo], row_bytes: u64) -> u64 {
    let mut total = 0;
    for split in Split::ALL {
        let mut seen = vec![false; view.rows as usize];
        let mut distinct = 0u64;
        for b in list.iter().filter(|b| b.split == split) {
            for &v in &b.inputs {
                if !std::mem::replace(&mut seen[v as usize], true) {
                    distinct += 1;
                }
            }
        }
        if distinct > 0 {
            total += align(distinct * row_bytes) + 2 * crate::plan::PAGE;
        }
    }
    total
}

/// For each read count, most first, the bytes of each type's rows that
/// the training batches read that many times.
fn read_levels(
    views: &[TypeView],
    lists: &[Vec<BatchInfo>],
    row_bytes: &[u64],
) -> Vec<(u32, Vec<u64>)> {
    let mut levels: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for (t, (view, list)) in views.iter().zip(lists).enumerate() {
        let mut counts = vec![0u32; view.rows as usize];
        for b in list.iter().filter(|b| b.split == Split::Train) {
            for &v in &b.inputs {
                counts[v as usize] += 1;
            }
        }
        for c in counts.into_iter().filter(|&c| c > 0) {
            levels.entry(c).or_insert_with(|| vec![0; views.len()])[t] += row_bytes[t];
        }
    }
    levels.into_iter().rev().collect()
}

/// Takes bytes from the levels, most read first; a level that a budget
/// cuts is shared in proportion to each type's bytes in it.
struct Fill {
    levels: Vec<Vec<u64>>,
    at: usize,
    types: usize,
}

impl Fill {
    fn new(levels: &[(u32, Vec<u64>)], types: usize) -> Fill {
        Fill {
            levels: levels.iter().map(|(_, bytes)| bytes.clone()).collect(),
            at: 0,
            types,
        }
    }

    fn take(&mut self, mut budget: u64) -> Vec<u64> {
        let mut taken = vec![0u64; self.types];
        while budget > 0 && self.at < self.levels.len() {
            let level = &mut self.levels[self.at];
            let total: u64 = level.iter().sum();
            if total <= budget {
                for (t, b) in level.iter_mut().enumerate() {
                    taken[t] += std::mem::take(b);
                }
                budget -= total;
                self.at += 1;
            } else {
                for (t, b) in level.iter_mut().enumerate() {
                    let part = (u128::from(*b) * u128::from(budget) / u128::from(total)) as u64;
                    taken[t] += part;
                    *b -= part;
                }
                budget = 0;
            }
        }
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(index: usize, rows: u32) -> TypeView {
        TypeView {
            index,
            name: format!("t{index}"),
            offset: 0,
            rows,
            target: index == 0,
        }
    }

    fn batch(inputs: &[u32]) -> BatchInfo {
        BatchInfo {
            split: Split::Train,
            epoch: 0,
            index: 0,
            cold: Vec::new(),
            inputs: inputs.to_vec(),
            table_bytes: 100,
        }
    }

    #[test]
    fn the_caches_take_the_most_read_rows_of_every_type_at_their_own_widths() {
        // Type 0 (64-B rows): row 0 read 3 times, row 1 once. Type 1
        // (16-B rows): row 0 read twice, row 1 once.
        let views = [view(0, 4), view(1, 4)];
        let lists = vec![
            vec![batch(&[0, 1]), batch(&[0]), batch(&[0])],
            vec![batch(&[0, 1]), batch(&[0]), batch(&[])],
        ];
        let shares = Shares::split(
            (&views, &lists, &[64, 16], &[4096, 1024]),
            (64 + 16, 64),
            1 << 20,
            1000,
        )
        .unwrap();
        // The GPU cache: type 0's row 0 (3 reads), type 1's row 0 (2).
        assert_eq!(shares.gpu, [64, 16]);
        // The CPU cache: the rows read once, 64 + 16 bytes, cut in
        // proportion to their bytes.
        assert_eq!(shares.cpu, [51, 12]);
        // Disk: each type's caches (a page each), tables and rows read (2
        // distinct: a page, and two more), then the rest in proportion to
        // the feature files (4:1).
        let fixed = [5 * 4096 + 300, 5 * 4096 + 300];
        let rest = (1 << 20) - 1000 - fixed[0] - fixed[1];
        assert_eq!(shares.disk, [fixed[0] + rest * 4 / 5, fixed[1] + rest / 5]);
        assert!(shares.disk.iter().sum::<u64>() + 1000 <= 1 << 20);
    }

    #[test]
    fn a_budget_below_the_fixed_bytes_is_one_line() {
        let views = [view(0, 2)];
        let lists = vec![vec![batch(&[0])]];
        let err = Shares::split((&views, &lists, &[64], &[128]), (0, 0), 500, 450)
            .unwrap_err()
            .to_string();
        assert!(err.contains("raise --disk-budget"), "{err}");
    }
}
