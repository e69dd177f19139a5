//! vramscope: GPU memory of PyTorch training, live, in the terminal. This crate is the app:
//! the screens, their keys and drawing, and the metrics endpoint, on top of
//! `vramscope_core` (stream, store, snapshots, allocator model, reports). The training
//! engine (engine/) and the Python hook's native core (hook/) build on the core alone.

pub mod app;
pub mod metrics;
pub mod render;
