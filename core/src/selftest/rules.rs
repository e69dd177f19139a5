//! The allocator model's rounding and segment rules (PyTorch's CUDA caching allocator,
//! /work/shared/DESIGN.md §3) on a built-in request stream: every expectation below is
//! worked out by hand from the rules, not by the model.

use crate::allocator::{AllocatorConfig, CachingAllocatorModel, ModelOp};

use super::check::Outcome;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// Where a request's block must land: in the `segment`-th segment made so far, `offset`
/// bytes in, `block` bytes long; `new_segment` when it needs one of that size.
struct Expect {
    rule: &'static str,
    new_segment: Option<u64>,
    segment: usize,
    offset: u64,
    block: u64,
}

enum Request {
    Malloc { key: u64, size: u64, expect: Expect },
    Free { key: u64 },
}

fn malloc(key: u64, size: u64, rule: &'static str, new_segment: Option<u64>, segment: usize, offset: u64, block: u64) -> Request {
    Request::Malloc { key, size, expect: Expect { rule, new_segment, segment, offset, block } }
}

/// The stream: rounding at 512 B, the small/large pool boundary at 1 MiB, 2 MiB and 20 MiB
/// segments below 10 MiB and 2 MiB rounding above, splitting (small: remainder ≥ 512 B;
/// large: remainder > 1 MiB), merging of freed neighbours and best-fit reuse.
fn stream() -> Vec<Request> {
    vec![
        malloc(1, 1, "under 512 B rounds to 512 B; a small request opens a 2 MiB segment", Some(2 * MIB), 0, 0, 512),
        malloc(2, 511, "the small pool splits while 512 B or more remain", None, 0, 512, 512),
        malloc(3, 513, "rounds up to a multiple of 512 B", None, 0, 1024, 1024),
        malloc(4, MIB, "1 MiB is still the small pool", None, 0, 2048, MIB),
        malloc(5, MIB + 1, "over 1 MiB is the large pool; under 10 MiB opens a 20 MiB segment", Some(20 * MIB), 1, 0, MIB + 512),
        malloc(6, 10 * MIB - 512, "the large pool splits when more than 1 MiB remains", None, 1, MIB + 512, 10 * MIB - 512),
        malloc(7, 10 * MIB, "10 MiB and over opens a segment rounded up to 2 MiB", Some(10 * MIB), 2, 0, 10 * MIB),
        malloc(8, 33 * MIB + 7, "the large pool does not split 1 MiB or less off: the block keeps it", Some(34 * MIB), 3, 0, 34 * MIB),
        Request::Free { key: 6 },
        malloc(9, 18 * MIB + 1, "a freed block merges with its free neighbour and is reused whole", None, 1, MIB + 512, 19 * MIB - 512),
        Request::Free { key: 2 },
        malloc(10, 300, "best fit: the 512 B hole, not the segment's larger tail", None, 0, 512, 512),
    ]
}

pub fn check() -> Outcome {
    check_model(CachingAllocatorModel::new(AllocatorConfig::default()))
}

fn check_model(mut model: CachingAllocatorModel) -> Outcome {
    let mut segments: Vec<(u64, u64)> = Vec::new();
    let mut ops = Vec::new();
    let requests = stream();
    for (i, r) in requests.iter().enumerate() {
        ops.clear();
        match r {
            Request::Free { key } => {
                if !model.free(*key, &mut ops) {
                    return Outcome::Fail(format!("request #{i}: the model did not know allocation {key}"));
                }
                if let Some(op) = ops.iter().find(|o| matches!(o, ModelOp::SegmentFree { .. })) {
                    return Outcome::Fail(format!("request #{i} (free of {key}): a freed block stays cached, but the model did {op:?}"));
                }
            }
            Request::Malloc { key, size, expect } => {
                model.malloc(*key, *size, 0, 0, &mut ops);
                let made: Vec<(u64, u64)> =
                    ops.iter().filter_map(|o| if let ModelOp::SegmentAlloc { addr, size } = *o { Some((addr, size)) } else { None }).collect();
                if made.iter().map(|&(_, s)| s).collect::<Vec<_>>() != expect.new_segment.into_iter().collect::<Vec<_>>() {
                    return Outcome::Fail(format!(
                        "request #{i} ({size} B, {}): expected {}, the model made {made:?} (address, size)",
                        expect.rule,
                        match expect.new_segment {
                            Some(s) => format!("one new {s} B segment"),
                            None => "no new segment".into(),
                        }
                    ));
                }
                segments.extend(made);
                let Some(&(base, _)) = segments.get(expect.segment) else {
                    return Outcome::Fail(format!("request #{i} ({size} B): segment #{} was never made", expect.segment));
                };
                let want = (base + expect.offset, expect.block);
                let got = ops.iter().find_map(|o| if let ModelOp::Alloc { addr, block_size, .. } = *o { Some((addr, block_size)) } else { None });
                if got != Some(want) {
                    return Outcome::Fail(format!(
                        "request #{i} ({size} B, {}): expected a {} B block at segment #{} + {}, the model gave {}",
                        expect.rule,
                        want.1,
                        expect.segment,
                        expect.offset,
                        match got {
                            Some((addr, block)) => format!("a {block} B block at {addr:#x} (segment #{} starts at {base:#x})", expect.segment),
                            None => "no block".into(),
                        }
                    ));
                }
            }
        }
    }
    let reserved: u64 = segments.iter().map(|&(_, s)| s).sum();
    let stats = model.stats();
    if stats.reserved_bytes != reserved {
        return Outcome::Fail(format!("the model reserves {} B, its segments add up to {reserved} B", stats.reserved_bytes));
    }
    Outcome::Pass(format!(
        "{} requests: rounding, pools, segment sizes, splits, merges and best fit as PyTorch's rules say; {} segments, {} KiB reserved",
        requests.len(),
        segments.len(),
        reserved / KIB
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_follows_the_rules() {
        match check() {
            Outcome::Pass(why) => assert!(why.starts_with("12 requests"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_model_under_other_rules_fails_at_the_first_request_they_change() {
        // With max_split_size 4 MiB a 10 MiB request may not split the cached 19 MiB block.
        let cfg = AllocatorConfig { max_split_size: Some(4 * MIB), ..AllocatorConfig::default() };
        let Outcome::Fail(why) = check_model(CachingAllocatorModel::new(cfg)) else { panic!("other rules passed") };
        assert!(
            why.starts_with("request #5 (10485248 B, the large pool splits when more than 1 MiB remains): expected a 10485248 B block at segment #1 + 1049088, the model gave a 19922432 B block"),
            "{why}"
        );
    }
}
