//! vramscope: GPU memory of a transformer training loop, live, in the terminal.

pub mod allocator;
pub mod app;
pub mod capture;
pub mod event;
pub mod record;
pub mod render;
pub mod report;
pub mod snapshot;
pub mod source;
pub mod store;
pub mod train;

