//! vramscope's training engine as a library: the capture shim's FFI, the CS336 transformer
//! and its optimizer in tch, and the training loop that hosts a producer session. The
//! `vramscope-engine` binary serves it; the capture-overhead bench measures it in-process.

pub mod capture;
pub mod model;
pub mod optim;
pub mod scaler;
pub mod selftest;
pub mod worker;
