//! Any bytes as a recording or a job's stream: the decoders return records or an error,
//! never panic and never allocate past the stream's bounds; whatever they accept, the
//! writer writes again and the reader reads back to the same records.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramscope_core::record::reader::Recording;
use vramscope_core::stream::chunk::{header, ChunkReader, ChunkWriter};
use vramscope_core::stream::codec::Record;

fuzz_target!(|data: &[u8]| {
    // As a socket or pipe delivers it: chunk by chunk until the first error.
    let mut records = Vec::new();
    if let Ok(mut r) = ChunkReader::new(data) {
        while let Ok(Some(chunk)) = r.next_chunk() {
            records.extend(chunk);
        }
    }
    // As a file: indexed, then each whole chunk decoded on its own.
    if let Ok(rec) = Recording::from_bytes(std::path::Path::new("fuzz.vsrec"), data.to_vec()) {
        for i in 0..rec.chunk_count() {
            let _ = rec.decode(i);
        }
    }
    // What decoded writes and reads back the same.
    let mut w = ChunkWriter::new(1, u64::MAX);
    let mut bytes = header().to_vec();
    let mut ended = false;
    for r in &records {
        match r {
            Record::Item { stamp_ns, rank, item } => {
                for c in w.push(*stamp_ns, *rank, item).expect("a decoded item encodes") {
                    bytes.extend(c);
                }
            }
            Record::End => ended = true,
        }
    }
    bytes.extend(if ended { w.end() } else { w.flush() }.unwrap_or_default());
    let mut again = Vec::new();
    let mut r = ChunkReader::new(&bytes[..]).expect("our header");
    while let Some(chunk) = r.next_chunk().expect("what we wrote reads back") {
        again.extend(chunk);
    }
    assert_eq!(contents(&records), contents(&again), "write(read(x)) reads back as read(x)");
});

/// What a stream holds, however its batches are cut: every event, mark, retag and name in
/// order, and every other item.
fn contents(v: &[Record]) -> [Vec<String>; 5] {
    use vramscope_core::stream::Incoming;
    let mut out: [Vec<String>; 5] = Default::default();
    for r in v {
        let Record::Item { stamp_ns, rank, item } = r else { continue };
        match item {
            Incoming::Batch(b) => {
                out[0].extend(b.events.iter().map(|e| format!("{rank} {e:?}")));
                out[1].extend(b.marks.iter().map(|m| format!("{rank} {m:?}")));
                out[2].extend(b.retags.iter().map(|t| format!("{rank} {t:?}")));
                out[3].extend(b.scopes.iter().map(|s| format!("{rank} {s:?}")));
            }
            other => out[4].push(format!("{stamp_ns} {rank} {other:?}")),
        }
    }
    out
}
