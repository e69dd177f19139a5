//! vramscope: GPU memory of a transformer training loop, live, in the terminal.

pub mod allocator;
pub mod capture;
pub mod event;
pub mod report;
pub mod snapshot;
pub mod store;
pub mod train;
