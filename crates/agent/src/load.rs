//! The node's load as placement reads it (seed 003 §3.3.2): memory in use and the 1-minute load
//! average per core, from /proc.

use warden_core::HostLoad;

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
    let memory_used = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| memory_used(&s))
        .unwrap_or(0.0);
    HostLoad {
        memory_used,
        load_per_core: load1 / cores,
        instances: 0,
    }
}

/// 1 - MemAvailable / MemTotal from the text of /proc/meminfo.
fn memory_used(meminfo: &str) -> Option<f64> {
    let field = |name: &str| -> Option<f64> {
        meminfo
            .lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let total = field("MemTotal:")?;
    let available = field("MemAvailable:")?;
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
    fn a_sample_is_within_range() {
        let l = sample();
        assert!((0.0..=1.0).contains(&l.memory_used), "{l:?}");
        assert!(l.load_per_core >= 0.0, "{l:?}");
    }
}
