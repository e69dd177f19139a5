//! vramscope's core: everything that is not terminal UI. The event protocol and its stream,
//! the PyTorch snapshot reader and writer, the model of the CUDA caching allocator, the
//! store the screens read, recordings, reports and the producer side that runs inside a
//! training job. The app (screens), the engine (libtorch) and the hook (a `.so` in the
//! user's job) all build on it; it links no terminal or image library.

pub mod allocator;
pub mod channel;
pub mod event;
pub mod fixtures;
pub mod format;
pub mod input;
pub mod producer;
pub mod profiler;
pub mod record;
pub mod report;
pub mod selftest;
pub mod snapshot;
pub mod source;
pub mod step_config;
pub mod store;
pub mod stream;
