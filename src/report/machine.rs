//! The machine a run was computed on, as far as it decides the numbers: recorded in each seed's
//! `timing.json` and named under the quality suite's table.
//! Owns: [`Machine`] and reading it from the operating system (`/proc/cpuinfo` and the level-1
//! data cache in `/sys/devices/system/cpu/cpu0/cache`).
//! Must not: change any computation; where the OS says nothing, the fields stay empty.
//!
//! Why it matters: candle multiplies matrices with the `gemm` crate (0.19), which splits the inner
//! dimension of a product into blocks sized from the L1 data cache's associativity, read from
//! sysfs: 64 × (ways rounded up to a power of two), at least 512. A product whose inner dimension
//! is above 512 (a 784-pixel input layer, a convolution's weight gradient over a batch) then adds
//! its terms in a different order on a 12-way L1 (blocks of 1024) than on an 8-way one (blocks
//! of 512). Same data, same seeds, different last bits; a chaotic run (FedAvg on label groups)
//! drifts from there by whole points. `docs/quality.md` shows it.

use serde::{Deserialize, Serialize};

/// What decided a run's floating-point results, besides the code and the data.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    /// The CPU's model name, as the OS reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    /// The target architecture and whether the CPU has AVX2 with FMA (the kernels `gemm` picks
    /// on x86-64), e.g. `x86_64 avx2+fma`.
    #[serde(default)]
    pub arch: String,
    /// Level-1 data cache size in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l1d_bytes: Option<u64>,
    /// Level-1 data cache associativity (ways).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l1d_ways: Option<u32>,
}

impl Machine {
    /// This machine.
    pub fn this() -> Machine {
        let (l1d_bytes, l1d_ways) = l1d().unwrap_or((None, None));
        Machine {
            cpu: cpu_model(),
            arch: arch(),
            l1d_bytes,
            l1d_ways,
        }
    }

    /// One line for a table, e.g. `AMD EPYC (x86_64 avx2+fma), L1d 48 KiB 12-way`.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "{} ({})",
            self.cpu.as_deref().unwrap_or("unknown CPU"),
            if self.arch.is_empty() {
                "unknown architecture"
            } else {
                &self.arch
            }
        );
        match (self.l1d_bytes, self.l1d_ways) {
            (Some(b), Some(w)) => s += &format!(", L1d {} KiB {w}-way", b / 1024),
            (Some(b), None) => s += &format!(", L1d {} KiB", b / 1024),
            (None, Some(w)) => s += &format!(", L1d {w}-way"),
            (None, None) => s += ", L1d not reported",
        }
        s
    }
}

fn arch() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let fma = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma");
        format!(
            "{} {}",
            std::env::consts::ARCH,
            if fma { "avx2+fma" } else { "no avx2+fma" }
        )
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::env::consts::ARCH.to_string()
    }
}

fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    model_name(&text)
}

/// The first `model name` line of `/proc/cpuinfo` text.
fn model_name(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|l| {
        let (key, value) = l.split_once(':')?;
        (key.trim() == "model name" && !value.trim().is_empty()).then(|| value.trim().to_string())
    })
}

/// CPU 0's level-1 data cache: (bytes, ways).
fn l1d() -> Option<(Option<u64>, Option<u32>)> {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let read = |name: &str| {
            std::fs::read_to_string(entry.path().join(name))
                .ok()
                .map(|s| s.trim().to_string())
        };
        if read("level").as_deref() == Some("1") && read("type").as_deref() == Some("Data") {
            let bytes = read("size").and_then(|s| cache_size(&s));
            let ways = read("ways_of_associativity").and_then(|s| s.parse().ok());
            return Some((bytes, ways));
        }
    }
    None
}

/// A sysfs cache size (`48K`, `1M`, `512`) in bytes.
fn cache_size(s: &str) -> Option<u64> {
    let (digits, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, ""),
    };
    let n: u64 = digits.parse().ok()?;
    let scale = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    Some(n * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sysfs_sizes() {
        assert_eq!(cache_size("48K"), Some(48 * 1024));
        assert_eq!(cache_size("1M"), Some(1 << 20));
        assert_eq!(cache_size("512"), Some(512));
        assert_eq!(cache_size("12Q"), None);
        assert_eq!(cache_size(""), None);
    }

    #[test]
    fn reads_the_model_name() {
        let text = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\n\
                    processor\t: 1\nmodel name\t: AMD EPYC 9R14\n";
        assert_eq!(model_name(text).as_deref(), Some("AMD EPYC 9R14"));
        assert_eq!(model_name("processor : 0\n"), None);
    }

    #[test]
    fn describes_what_it_knows() {
        let m = Machine {
            cpu: Some("AMD EPYC".into()),
            arch: "x86_64 avx2+fma".into(),
            l1d_bytes: Some(48 * 1024),
            l1d_ways: Some(12),
        };
        assert_eq!(
            m.describe(),
            "AMD EPYC (x86_64 avx2+fma), L1d 48 KiB 12-way"
        );
        assert_eq!(
            Machine::default().describe(),
            "unknown CPU (unknown architecture), L1d not reported"
        );
        // A timing.json written before the machine was recorded reads as unknown.
        let old: Machine = serde_json::from_str("{}").unwrap();
        assert_eq!(old, Machine::default());
    }
}
