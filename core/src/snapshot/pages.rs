//! Fresh memory faulted in before it is written, on a core that would otherwise wait. A
//! large snapshot's lists are new anonymous memory: each first write of a page is a fault
//! (1.5-2 µs on a VM), and on 1.5 M entries they were a fifth of the command (issue 29).
//! Everything here is a hint: where the kernel lacks `MADV_POPULATE_WRITE` (Linux 5.14) or
//! the machine has one core, the pages are faulted where they are written, as before.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The system's page size.
pub(crate) fn size() -> usize {
    #[cfg(unix)]
    {
        // SAFETY: sysconf has no preconditions.
        usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1)
    }
    #[cfg(not(unix))]
    4096
}

/// Faults in the whole pages of `addresses` for writing, without touching their bytes.
pub(crate) fn fault_in(addresses: Range<usize>) {
    #[cfg(target_os = "linux")]
    {
        let page = size();
        let (start, end) = (addresses.start.div_ceil(page) * page, addresses.end / page * page);
        if end > start {
            // SAFETY: populating reads and writes no byte of the range, whatever holds it
            // now; a range no longer mapped (a list that moved) only makes the call fail.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_POPULATE_WRITE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = addresses;
}

/// A list as the writer fills it: the addresses of its whole buffer, and how many bytes
/// from the start are written.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Span {
    pub(crate) room: Range<usize>,
    pub(crate) filled: usize,
}

impl Span {
    pub(crate) fn of<T>(v: &Vec<T>) -> Span {
        let start = v.as_ptr() as usize;
        let size = std::mem::size_of::<T>();
        Span { room: start..start + v.capacity() * size, filled: v.len() * size }
    }
}

/// How far ahead of each list's written end its pages are faulted in: well past what the
/// writer adds between two reports, little left unused at the end.
const AHEAD: usize = 1 << 20;

/// How far the writer has filled each list, and whether it is done.
struct Figures {
    filled: Vec<AtomicUsize>,
    done: AtomicBool,
}

/// What the writer tells the thread faulting in ahead of it.
pub(crate) struct Progress<'f> {
    figures: Option<&'f Figures>,
    helper: Option<std::thread::Thread>,
}

impl Progress<'_> {
    /// How far the lists are written now (the same lists, in the order `ahead` had them).
    pub(crate) fn report(&self, spans: &[Span]) {
        let (Some(figures), Some(helper)) = (self.figures, &self.helper) else { return };
        for (f, s) in figures.filled.iter().zip(spans) {
            f.store(s.filled, Ordering::Relaxed);
        }
        helper.unpark();
    }
}

/// Runs `work`, which fills the lists `spans` (their rooms reserved beforehand, so they do
/// not move) and reports its progress now and then, while another thread faults in each
/// list's room up to `AHEAD` bytes past its written end. Worth a thread only where the
/// rooms are large: `least` bytes in all.
pub(crate) fn ahead<R>(spans: &[Span], least: usize, work: impl FnOnce(&Progress<'_>) -> R) -> R {
    let room: usize = spans.iter().map(|s| s.room.len().saturating_sub(s.filled)).sum();
    if room < least || !cfg!(target_os = "linux") || std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return work(&Progress { figures: None, helper: None });
    }
    let figures = Figures { filled: spans.iter().map(|s| AtomicUsize::new(s.filled)).collect(), done: AtomicBool::new(false) };
    std::thread::scope(|scope| {
        let helper = scope.spawn(|| follow(spans, &figures));
        let progress = Progress { figures: Some(&figures), helper: Some(helper.thread().clone()) };
        work(&progress)
        // `progress` dropped here, also where `work` panics: the helper ends before the
        // scope waits for it.
    })
}

impl Drop for Progress<'_> {
    fn drop(&mut self) {
        if let (Some(figures), Some(helper)) = (self.figures, &self.helper) {
            figures.done.store(true, Ordering::Release);
            helper.unpark();
        }
    }
}

/// The helper's loop: each list's pages faulted in up to `AHEAD` past its written end,
/// then a wait for the next report.
fn follow(spans: &[Span], figures: &Figures) {
    let page = size();
    // Per list, the address up to which its pages are faulted in (page-aligned).
    let mut reached: Vec<usize> = spans.iter().map(|s| (s.room.start + s.filled).div_ceil(page) * page).collect();
    while !figures.done.load(Ordering::Acquire) {
        for ((s, f), at) in spans.iter().zip(&figures.filled).zip(&mut reached) {
            let want = ((s.room.start + f.load(Ordering::Relaxed) + AHEAD).min(s.room.end)) / page * page;
            if want > *at {
                fault_in(*at..want);
                *at = want;
            }
        }
        std::thread::park(); // until the next report
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Which of the pages of `len` bytes at `addr` (page-aligned) are resident.
    fn resident(addr: usize, len: usize) -> Vec<bool> {
        let mut v = vec![0u8; len.div_ceil(size())];
        // SAFETY: a range of this process's own mapping; `v` has a byte per page.
        let rc = unsafe { libc::mincore(addr as *mut libc::c_void, len, v.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore");
        v.iter().map(|b| b & 1 == 1).collect()
    }

    /// Whether this kernel populates (Linux 5.14 on); older ones fault pages as written.
    fn populates() -> bool {
        let page = size();
        let probe = vec![0u8; 2 * page];
        let aligned = (probe.as_ptr() as usize).div_ceil(page) * page;
        // SAFETY: a page inside `probe`, which lives until the end of the call.
        let ok = unsafe { libc::madvise(aligned as *mut libc::c_void, page, libc::MADV_POPULATE_WRITE) } == 0;
        if !ok {
            eprintln!("skipped: this kernel has no MADV_POPULATE_WRITE (Linux 5.14)");
        }
        ok
    }

    /// 64 MiB of room, its own fresh mapping, none of it touched yet; and its first
    /// page-aligned address.
    fn fresh() -> (Vec<u64>, usize) {
        let v: Vec<u64> = Vec::with_capacity(8 << 20);
        let start = (v.as_ptr() as usize).div_ceil(size()) * size();
        (v, start)
    }

    /// The huge page that may hold a range's end (transparent huge pages `always`).
    const HUGE: usize = 2 << 20;

    #[test]
    fn the_part_asked_for_is_faulted_in_and_the_rest_left_alone() {
        if !populates() {
            return;
        }
        let (_v, start) = fresh();
        let half = 16 << 20;
        fault_in(start..start + half);
        let pages = resident(start, 2 * half);
        assert!(pages[..half / size()].iter().all(|&r| r), "the part asked for is resident");
        assert!(pages[(half + HUGE) / size()..].iter().all(|&r| !r), "the rest is not");
    }

    #[test]
    fn a_list_s_pages_are_faulted_in_ahead_of_its_writer_and_no_further() {
        if !populates() || std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
            return;
        }
        let (mut v, start) = fresh();
        let page = size();
        let spans = [Span::of(&v)];
        let out = ahead(&spans, 0, |progress| {
            // Until this report, nothing of the room need be faulted in; after it, the
            // pages up to `AHEAD` past the written end, and none much further.
            let quarter = (8 << 20) / 4;
            v.extend(0..quarter as u64);
            progress.report(&[Span::of(&v)]);
            let end = start + quarter * 8 + AHEAD;
            let waited = std::time::Instant::now();
            while !resident(start, end - start - page).iter().all(|&r| r) {
                assert!(waited.elapsed().as_secs() < 30, "the helper never faulted the pages ahead in");
                std::thread::yield_now();
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            let pages = resident(start, 64 << 20);
            assert!(pages[(end + HUGE - start) / page..].iter().all(|&r| !r), "nothing past the next {AHEAD} bytes");
            v.len()
        });
        assert_eq!(out, (8 << 20) / 4);
    }

    #[test]
    fn a_writer_that_panics_ends_the_helper_and_the_panic_reaches_the_caller() {
        // Where the helper outlived a panicking writer, the scope would wait for it forever.
        let (sent, got) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (v, _) = fresh();
            let spans = [Span::of(&v)];
            let caught = std::panic::catch_unwind(|| {
                ahead(&spans, 0, |progress| {
                    progress.report(&spans);
                    panic!("the writer fails");
                })
            });
            let _ = sent.send(caught.is_err());
        });
        let caught = got.recv_timeout(std::time::Duration::from_secs(30)).expect("the call returned");
        assert!(caught, "the writer's panic reached the caller");
    }
}
