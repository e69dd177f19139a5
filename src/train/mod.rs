//! The workload: CS336's transformer, its optimizer, and the step loop that drives them.

pub mod config;
pub mod engine;
pub mod model;
pub mod optim;
pub mod scope;
