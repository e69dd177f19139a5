//! Producers of data for the store.

pub mod gauges;
