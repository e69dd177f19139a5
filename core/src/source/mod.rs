//! What the screens and headless consumers are fed from: running jobs (vramscope's engine
//! process, a user's job with the hook), recordings, and the device or host gauges.

pub mod feed;
pub mod gauges;
pub mod job;
pub mod launch;
