//! `vramscope watch`: every device's memory, load and processes, like nvtop.

pub mod render;
pub mod run;
pub mod state;
