//! The node's load as placement reads it (seed 003 §3.3.2): memory in use and available, CPU
//! busy share since the previous sample, and the 1-minute load average per core, from /proc.

use warden_core::HostLoad;

/// CPU time counters of /proc/stat's first line: (busy, total) in clock ticks.
pub(crate) type CpuTimes = (u64, u64);

/// The machine's CPU times now, if /proc/stat reads.
pub(crate) fn cpu_times() -> Option<CpuTimes> {
    parse_cpu(&std::fs::read_to_string("/proc/stat").ok()?)
}

fn parse_cpu(stat: &str) -> Option<CpuTimes> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user already).
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3)? + fields.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

/// Busy share between two samples, 0 when no time passed.
pub(crate) fn busy_share(before: CpuTimes, now: CpuTimes) -> f64 {
    let total = now.1.saturating_sub(before.1);
    if total == 0 {
        return 0.0;
    }
    (now.0.saturating_sub(before.0) as f64 / total as f64).clamp(0.0, 1.0)
}

/// Samples memory and load now. Missing /proc files read as zero load rather than failing: a
/// node that cannot say how loaded it is should still run instances.
pub(crate) fn sample() -> HostLoad {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1) as f64;
    let load1 = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    HostLoad {
        memory_used: memory_used(&meminfo).unwrap_or(0.0),
        memory_available_bytes: meminfo_kib(&meminfo, "MemAvailable:")
            .map_or(0, |k| k as u64 * 1024),
        cpu_busy: 0.0,
        load_per_core: load1 / cores,
        instances: 0,
    }
}

/// The fractions a load file gives (`memory_used`, `cpu_busy`, `load_per_core`; any left out
/// stays as measured). An unreadable file leaves the measured load and says so.
pub(crate) fn override_from(path: &std::path::Path, load: &mut HostLoad) {
    #[derive(serde::Deserialize)]
    struct Fractions {
        memory_used: Option<f64>,
        cpu_busy: Option<f64>,
        load_per_core: Option<f64>,
    }
    let read = std::fs::read(path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice::<Fractions>(&b).map_err(|e| e.to_string()));
    match read {
        Ok(f) => {
            let clamp = |v: f64| v.clamp(0.0, 1.0);
            if let Some(v) = f.memory_used {
                load.memory_used = clamp(v);
            }
            if let Some(v) = f.cpu_busy {
                load.cpu_busy = clamp(v);
            }
            if let Some(v) = f.load_per_core {
                load.load_per_core = clamp(v);
            }
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "the load file does not read; publishing the measured load");
        }
    }
}

fn meminfo_kib(meminfo: &str, name: &str) -> Option<f64> {
    meminfo
        .lines()
        .find(|l| l.starts_with(name))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// 1 - MemAvailable / MemTotal from the text of /proc/meminfo.
fn memory_used(meminfo: &str) -> Option<f64> {
    let total = meminfo_kib(meminfo, "MemTotal:")?;
    let available = meminfo_kib(meminfo, "MemAvailable:")?;
    (total > 0.0).then(|| (1.0 - available / total).clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_fraction_comes_from_total_and_available() {
        let text = "MemTotal:       8000 kB\nMemFree:  1000 kB\nMemAvailable:   2000 kB\n";
        assert_eq!(memory_used(text), Some(0.75));
        assert_eq!(memory_used("MemTotal: 0 kB\nMemAvailable: 0 kB\n"), None);
        assert_eq!(memory_used("nonsense"), None);
    }

    #[test]
    fn cpu_busy_share_comes_from_the_counters_between_two_samples() {
        let a = parse_cpu("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3\n").unwrap();
        assert_eq!(a, (200, 1000));
        let b = parse_cpu("cpu  400 0 100 900 100 0 0 0 0 0\n").unwrap();
        assert_eq!(busy_share(a, b), 0.6);
        assert_eq!(busy_share(b, b), 0.0);
        assert_eq!(parse_cpu("nothing"), None);
    }

    #[test]
    fn a_sample_is_within_range() {
        let l = sample();
        assert!((0.0..=1.0).contains(&l.memory_used), "{l:?}");
        assert!(l.load_per_core >= 0.0, "{l:?}");
    }
}
