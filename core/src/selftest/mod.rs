//! `vramscope selftest`: named checks that what vramscope shows is what the allocator did.
//! The engine gathers the evidence (engine/src/selftest.rs); every comparison lives here,
//! so it is tested without libtorch and without a GPU.

pub mod accounting;
pub mod check;
pub mod cuda;
pub mod evidence;
pub mod peaks;
pub mod rules;
pub mod run;

pub use check::{Check, Outcome, Results, Status};
pub use evidence::Evidence;
