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
}
