//! Host gauges from /proc: this process's RSS, system memory, CPU use. The fallback when
//! NVML cannot start, and what a CPU-only run has to watch.

use std::fs;
use std::time::Instant;

use super::watched::Watched;
use super::reader::{GaugeError, GaugeReader};
use super::sample::{Gauges, HostSample, SourceKind};

fn read(path: &str) -> Result<String, GaugeError> {
    fs::read_to_string(path).map_err(|e| GaugeError::Proc {
        path: path.to_string(),
        detail: e.to_string(),
    })
}

fn malformed(path: &str, what: &str) -> GaugeError {
    GaugeError::Proc {
        path: path.to_string(),
        detail: format!("no {what}"),
    }
}

/// Value of a `Key:   123 kB` line, in bytes.
fn kb_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        let kb: u64 = rest.split_whitespace().next()?.parse().ok()?;
        Some(kb * 1024)
    })
}

/// VmRSS from /proc/<pid>/status text, bytes.
pub fn parse_rss(status: &str) -> Option<u64> {
    kb_field(status, "VmRSS")
}

/// (total, used) from /proc/meminfo text, bytes; used = MemTotal - MemAvailable.
pub fn parse_meminfo(meminfo: &str) -> Option<(u64, u64)> {
    let total = kb_field(meminfo, "MemTotal")?;
    let avail = kb_field(meminfo, "MemAvailable")?;
    Some((total, total.saturating_sub(avail)))
}

/// Aggregate CPU ticks from /proc/stat text: (busy, total, number of cpus).
/// Idle and iowait count as not busy.
pub fn parse_cpu_ticks(stat: &str) -> Option<(u64, u64, u32)> {
    let mut lines = stat.lines();
    let first = lines.next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u64> = first
        .split_whitespace()
        .map(|t| t.parse().ok())
        .collect::<Option<_>>()?;
    if ticks.len() < 4 {
        return None;
    }
    // guest and guest_nice (fields 9, 10) are already inside user and nice.
    let total: u64 = ticks.iter().take(8).sum();
    let idle = ticks[3] + ticks.get(4).copied().unwrap_or(0);
    let cpus = lines.take_while(|l| l.starts_with("cpu")).count() as u32;
    Some((total - idle, total, cpus.max(1)))
}

/// utime + stime ticks from /proc/<pid>/stat or /proc/<pid>/task/<tid>/stat text.
pub fn parse_task_ticks(stat: &str) -> Option<u64> {
    // The command name is in parentheses and may hold spaces; fields follow the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // After ')': state(3) ... utime is field 14, stime 15 (1-based over the whole line).
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Clock ticks per second for /proc tick counts.
pub fn clock_ticks_per_sec() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// Name of a process from /proc/<pid>/comm; `None` if it is not visible from here.
pub fn process_name(pid: u32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

struct CpuMark {
    busy: u64,
    total: u64,
    self_ticks: u64,
    at: Instant,
}

pub struct HostReader {
    prev: CpuMark,
    ticks_per_sec: u64,
    /// The job's processes: their RSS and CPU are what the gauges call the job's.
    job: Watched,
    /// The processes `prev` counted (a change restarts the job's CPU figure).
    prev_pids: Vec<u32>,
}

const MEMINFO: &str = "/proc/meminfo";
const STAT: &str = "/proc/stat";

/// RSS and CPU ticks of `pids` together; a process that has ended counts nothing.
fn job_figures(pids: &[u32]) -> (u64, u64) {
    pids.iter().fold((0, 0), |(rss, ticks), pid| {
        let r = std::fs::read_to_string(format!("/proc/{pid}/status")).ok().and_then(|s| parse_rss(&s)).unwrap_or(0);
        let t = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().and_then(|s| parse_task_ticks(&s)).unwrap_or(0);
        (rss + r, ticks + t)
    })
}

impl HostReader {
    /// Takes the first CPU mark now, so the first sample already has a CPU figure.
    pub fn open(job: Watched) -> Result<HostReader, GaugeError> {
        let pids = job.pids();
        Ok(HostReader { prev: Self::mark(&pids)?, ticks_per_sec: clock_ticks_per_sec(), job, prev_pids: pids })
    }

    fn mark(pids: &[u32]) -> Result<CpuMark, GaugeError> {
        let (busy, total, _) =
            parse_cpu_ticks(&read(STAT)?).ok_or_else(|| malformed(STAT, "cpu line"))?;
        Ok(CpuMark { busy, total, self_ticks: job_figures(pids).1, at: Instant::now() })
    }
}

impl GaugeReader for HostReader {
    fn kind(&self) -> SourceKind {
        SourceKind::Host
    }

    fn sample(&mut self) -> Result<Gauges, GaugeError> {
        let pids = self.job.pids();
        let (rss_bytes, self_ticks) = job_figures(&pids);
        let (mem_total, mem_used) = parse_meminfo(&read(MEMINFO)?)
            .ok_or_else(|| malformed(MEMINFO, "MemTotal/MemAvailable"))?;
        let stat = read(STAT)?;
        let (busy, total, cpu_count) =
            parse_cpu_ticks(&stat).ok_or_else(|| malformed(STAT, "cpu line"))?;
        let now = CpuMark {
            busy,
            total,
            self_ticks,
            at: Instant::now(),
        };
        let dt_total = now.total.saturating_sub(self.prev.total);
        let cpu_percent = (dt_total > 0)
            .then(|| 100.0 * now.busy.saturating_sub(self.prev.busy) as f32 / dt_total as f32);
        let wall = now.at.duration_since(self.prev.at).as_secs_f32();
        // Other processes than the last sample's: no rate between the two.
        let same = std::mem::replace(&mut self.prev_pids, pids.clone()) == pids;
        let self_cpu_percent = (wall > 0.0 && same).then(|| {
            let secs = now.self_ticks.saturating_sub(self.prev.self_ticks) as f32
                / self.ticks_per_sec as f32;
            100.0 * secs / wall
        });
        self.prev = now;
        Ok(Gauges::Host(HostSample {
            rss_bytes,
            mem_total,
            mem_used,
            cpu_percent,
            self_cpu_percent,
            cpu_count,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_texts() {
        let status = "Name:\tx\nVmPeak:\t  9000 kB\nVmRSS:\t  2048 kB\nRssAnon:\t 1 kB\n";
        assert_eq!(parse_rss(status), Some(2048 * 1024));
        let meminfo = "MemTotal:  1000 kB\nMemFree: 100 kB\nMemAvailable:  400 kB\n";
        assert_eq!(parse_meminfo(meminfo), Some((1000 * 1024, 600 * 1024)));
        let stat = "cpu  10 0 5 80 5 0 0 0 0 0\ncpu0 5 0 2 40 3 0 0 0 0 0\ncpu1 5 0 3 40 2 0 0 0 0 0\nintr 1\n";
        assert_eq!(parse_cpu_ticks(stat), Some((15, 100, 2)));
        // A command name with spaces and a ')' must not shift the fields.
        let task = "42 (a b) c) S 1 2 3 4 5 6 7 8 9 10 17 4 0 0 20 0";
        assert_eq!(parse_task_ticks(task), Some(21));
        assert_eq!(parse_rss("VmRSSX: 1 kB\n"), None);
    }

    /// Watching a job, the RSS and CPU are the job's processes', not vramscope's.
    #[test]
    fn a_jobs_figures_are_its_processes() {
        let mut job = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = job.id();
        let rss_of = |pid: u32| parse_rss(&std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap()).unwrap();
        let mut reader = HostReader::open(Watched::of(&[pid])).unwrap();
        // Just spawned, the child may still be exec'ing and loading its libraries, its RSS
        // growing: sample once it sleeps with an RSS that held still for 100 ms.
        let status = || std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let mut last = 0;
        for _ in 0..200 {
            let now = rss_of(pid);
            if now == last && status().contains("State:\tS") {
                break;
            }
            last = now;
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let Gauges::Host(h) = reader.sample().unwrap() else { unreachable!("host") };
        assert_eq!(h.rss_bytes, rss_of(pid), "the job's RSS");
        assert!(h.rss_bytes < rss_of(std::process::id()), "`sleep` is smaller than this test binary");
        job.kill().unwrap();
        job.wait().unwrap();
        let Gauges::Host(h) = reader.sample().unwrap() else { unreachable!("host") };
        assert_eq!(h.rss_bytes, 0, "a job that ended holds nothing");
    }

    /// The gauge reads what the kernel says this process holds (statm, read just before
    /// and after it), and it rises when the process touches a large block. How much it
    /// rises depends on the kernel and on what else runs (reclaim, huge pages), so only
    /// "clearly" is asserted, not a tight band.
    #[test]
    fn rss_follows_a_real_allocation() {
        // RSS is the whole process's, and tests running beside this one allocate and free
        // too: the measurement runs alone, in a process of its own (this test, again).
        if std::env::var_os("VRAMSCOPE_RSS_PROBE").is_none() {
            let name = "source::gauges::host::tests::rss_follows_a_real_allocation";
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", name, "--test-threads", "1"])
                .env("VRAMSCOPE_RSS_PROBE", "1")
                .output()
                .unwrap();
            let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success() && said.contains("1 passed"), "{said}");
            return;
        }
        const MIB: u64 = 1 << 20;
        // SAFETY: sysconf reads a constant of the system.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
        let statm = || {
            let text = std::fs::read_to_string("/proc/self/statm").unwrap();
            text.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()).unwrap() * page
        };
        let mut reader = HostReader::open(Watched::default()).unwrap();
        let mut rss = || match reader.sample().unwrap_or_else(|e| panic!("{e}")) {
            Gauges::Host(h) => h.rss_bytes,
            Gauges::Devices(_) => unreachable!("the host reader reads the host"),
        };
        let mut bracketed = || {
            let (lo, got, hi) = (statm(), rss(), statm());
            let slack = 8 * MIB;
            assert!(lo.min(hi).saturating_sub(slack) <= got && got <= lo.max(hi) + slack, "gauge {got} B, statm {lo} then {hi} B");
            got
        };
        let before = bracketed();
        let mut block = vec![0u8; 200 * MIB as usize];
        // Touch every page so the kernel backs it.
        for i in (0..block.len()).step_by(4096) {
            block[i] = 1;
        }
        let after = bracketed();
        std::hint::black_box(&block);
        let grew = after.saturating_sub(before);
        assert!(grew >= 100 * MIB, "touching 200 MiB moved the gauge by {} MiB only", grew / MIB);
    }

    #[test]
    fn system_memory_and_cpu_are_plausible() {
        let mut reader = HostReader::open(Watched::default()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let Gauges::Host(h) = reader.sample().unwrap() else {
            unreachable!()
        };
        assert!(h.mem_total > 0 && h.mem_used <= h.mem_total);
        assert!(h.rss_bytes > 0 && h.rss_bytes < h.mem_total);
        assert!(h.cpu_count >= 1);
        let cpu = h.self_cpu_percent.unwrap();
        assert!(
            (0.0..=100.0 * h.cpu_count as f32 + 1.0).contains(&cpu),
            "{cpu}"
        );
    }
}
