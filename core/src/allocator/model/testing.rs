//! What the model's tests share: a model from a conf string, requests that return what
//! the model did, and its segments' block sizes.

use super::ops::ModelOp;
use super::state::CachingAllocatorModel;
use crate::allocator::config::AllocatorConfig;

pub(super) const MIB: u64 = 1 << 20;

pub(super) fn model(conf: &str) -> CachingAllocatorModel {
    CachingAllocatorModel::new(AllocatorConfig::parse_conf(conf).unwrap())
}

pub(super) fn alloc(m: &mut CachingAllocatorModel, key: u64, size: u64, stream: i64) -> Vec<ModelOp> {
    let mut ops = Vec::new();
    m.malloc(key, size, stream, 7, &mut ops);
    ops
}

pub(super) fn free(m: &mut CachingAllocatorModel, key: u64) -> Vec<ModelOp> {
    let mut ops = Vec::new();
    assert!(m.free(key, &mut ops));
    ops
}

pub(super) fn block_sizes(m: &CachingAllocatorModel) -> Vec<Vec<(u64, bool)>> {
    m.segments(0)
        .iter()
        .map(|s| {
            s.blocks
                .iter()
                .map(|b| (b.size, b.state.is_active()))
                .collect()
        })
        .collect()
}
