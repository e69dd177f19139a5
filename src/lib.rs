//! vramscope: GPU memory of PyTorch training, live, in the terminal. This crate is the app:
//! the screens (one folder each: state, keys and drawing side by side), the chrome they
//! share, timeline images and the metrics endpoint, on top of `vramscope_core` (stream,
//! store, snapshots, allocator model, reports). The training engine (engine/) and the
//! Python hook's native core (hook/) build on the core alone. docs/data-flow.md has the
//! picture.

pub mod chrome;
pub mod draw;
pub mod export;
pub mod attach_pid;
pub mod builtin;
pub mod headless;
pub mod job_env;
pub mod keys;
pub mod metrics;
pub mod py;
pub mod screens;
pub mod terminal;
pub mod theme;
pub mod writeup;
