//! Producers of data for the store.

pub mod feed;
pub mod gauges;
