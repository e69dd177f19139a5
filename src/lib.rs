//! vramscope: GPU memory of a transformer training loop, live, in the terminal.

pub mod allocator;
pub mod event;
pub mod snapshot;
