//! The errors of planning a layout: sizes and budgets the user gave that
//! cannot be read, and budgets no layout can meet. The packer's crate-wide
//! error enum wraps these.

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A parameter that cannot be read or is out of its valid range; the
    /// message names the text or value.
    #[error("{0}")]
    InvalidArgument(String),
    /// Even one segment for all batches (every distinct cold row stored
    /// once) needs more than the disk budget.
    #[error(
        "disk budget {budget} bytes is below the {minimum} bytes that the distinct cold rows need (one copy each); raise --disk-budget to at least {minimum}"
    )]
    BudgetTooSmall { budget: u64, minimum: u64 },
    /// The whole layout's least size is over the disk budget, with what it
    /// counts: it can exceed the feature file, as the evaluation segments
    /// and the caches hold copies of rows the training rows hold too, and
    /// the address tables hold every batch's topology and addresses.
    #[error(
        "disk budget {budget} bytes is below the {minimum} bytes the smallest layout takes: the training batches' distinct cold rows once each ({train}), the validation and test segments' own copies of their rows ({eval}), the GPU and CPU caches ({caches}), each rounded up to 4 KiB pages, and the address tables with every batch's compressed topology ({tables}); raise --disk-budget to at least {minimum}, or shrink --gpu-cache and --cpu-cache"
    )]
    LayoutTooSmall {
        budget: u64,
        minimum: u64,
        train: u64,
        eval: u64,
        caches: u64,
        tables: u64,
    },
    /// A signal arrived while the layout was being planned.
    #[error(transparent)]
    Stopped(#[from] offgnn_shared::Error),
}
