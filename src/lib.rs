//! vramscope: GPU memory of PyTorch training, live, in the terminal. This crate is the light
//! side (screens, store, snapshots, allocator model, reports) and the job side that does not
//! need libtorch (producer); the training engine is its own crate and process (engine/).

pub mod allocator;
pub mod app;
pub mod channel;
pub mod event;
pub mod input;
pub mod metrics;
pub mod producer;
pub mod record;
pub mod render;
pub mod report;
pub mod snapshot;
pub mod source;
pub mod step_config;
pub mod store;
pub mod stream;
