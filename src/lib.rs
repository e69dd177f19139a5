//! vramscope: GPU memory of a transformer training loop, live, in the terminal.

pub mod event;
pub mod snapshot;
