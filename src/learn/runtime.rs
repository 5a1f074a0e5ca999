//! Process and thread tuning for CPU training: denormal flushing and glibc's allocator.
//!
//! Owns: the MXCSR bits of the calling thread and glibc's `mallopt` settings.
//! Must not: build models or touch data; it changes how arithmetic and allocation behave, never
//! what is computed (beyond values below 1.2e-38).

/// Sets flush-to-zero and denormals-are-zero (MXCSR bits 15 and 6) for the **calling thread**
/// on x86_64; a no-op elsewhere.
///
/// Denormal floats can slow CPU arithmetic by orders of magnitude per operation. Call it at the
/// start of a training thread; rayon's (gemm's) worker threads keep their own (default)
/// setting, so it covers all the work only with `RAYON_NUM_THREADS=1`. Results then differ
/// from IEEE arithmetic only for values below 1.2e-38, which become zero.
///
/// Measured (`benches/train_step.rs`, MLP 784-200-10 on MNIST, AMD EPYC): the subnormals of
/// that training were Adam's first moments, which [`Adam`](super::Adam) now flushes itself; candle's matrix
/// products showed no penalty even on all-subnormal inputs. So this is optional there; CPUs
/// with costlier denormal assists (many Intel parts) may still gain from it.
pub fn flush_denormals_to_zero() {
    #[cfg(target_arch = "x86_64")]
    {
        let mut csr: u32 = 0;
        // SAFETY: stmxcsr/ldmxcsr only read and write the 4 bytes given and the MXCSR register;
        // the value written is the current one with the FTZ and DAZ bits set, which all x86_64
        // CPUs support (SSE2 is baseline, DAZ is on every SSE2 CPU made since 2001).
        unsafe {
            core::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack, preserves_flags));
            csr |= (1 << 15) | (1 << 6);
            core::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, preserves_flags));
        }
    }
}

/// Makes glibc keep freed memory for reuse instead of returning it to the kernel; a no-op
/// (returning false) off glibc. Returns whether both settings took.
///
/// candle allocates a fresh buffer for every tensor op; above glibc's mmap threshold each one
/// is a new mapping that the kernel must zero and fault in page by page, then unmap. Raising the
/// threshold to its maximum (32 MiB) and never trimming the heap made CNN gradients 1.6× faster
/// (`benches/train_step.rs`, `FEDERICO_BENCH_MALLOPT=1`) at the cost of a resident set that stays
/// at its peak. Process-wide: call it once, at the start of `main`, before spawning threads.
pub fn retain_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn mallopt(param: i32, value: i32) -> i32;
        }
        const M_TRIM_THRESHOLD: i32 = -1;
        const M_MMAP_THRESHOLD: i32 = -3;
        // SAFETY: mallopt only changes glibc's allocator parameters (under its own lock); the
        // values are in range (the mmap threshold's maximum is 32 MiB on 64-bit targets).
        unsafe {
            mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1 && mallopt(M_TRIM_THRESHOLD, i32::MAX) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Whether [`flush_denormals_to_zero`] is in effect on the calling thread (always false off
/// x86_64).
pub fn denormals_flushed() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let mut csr: u32 = 0;
        // SAFETY: stmxcsr only stores the MXCSR register into the 4 bytes given.
        unsafe {
            core::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack, preserves_flags));
        }
        csr & ((1 << 15) | (1 << 6)) == (1 << 15) | (1 << 6)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushing_denormals_affects_only_the_calling_thread() {
        let tiny = std::hint::black_box(1e-39f32);
        assert!(tiny * std::hint::black_box(1.0f32) != 0.0 || !cfg!(target_arch = "x86_64"));
        std::thread::spawn(move || {
            flush_denormals_to_zero();
            if cfg!(target_arch = "x86_64") {
                assert!(denormals_flushed());
                assert_eq!(tiny * std::hint::black_box(1.0f32), 0.0);
            }
        })
        .join()
        .unwrap();
        assert!(!denormals_flushed());
    }
}
