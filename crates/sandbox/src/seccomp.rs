//! The seccomp filter of sandboxed apps: a deny list in the spirit of Docker's default profile.
//!
//! Ordinary servers never need these calls; each one is a way out of the sandbox or into the
//! kernel's less-trodden paths (namespaces, mounts, module loading, tracing other processes,
//! BPF, keyrings, clocks, reboot). Denied calls fail with EPERM rather than killing the app,
//! so a library that merely probes for a feature keeps working. `clone3` fails with ENOSYS so
//! that libc falls back to `clone`, whose flags a filter can inspect. io_uring is denied unless
//! the app asks for it: it reaches much of the kernel behind the filter's back.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

/// Calls denied outright.
const DENIED: &[i64] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_mount_setattr,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_syslog,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_pidfd_getfd,
    libc::SYS_lookup_dcookie,
    libc::SYS_vhangup,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_uselib,
];

/// io_uring, denied unless the app opts in.
const IO_URING: &[i64] = &[
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
];

/// Namespace flags `clone` may not carry: a new user namespace would hand the app a fresh set
/// of capabilities.
const CLONE_NS_FLAGS: u64 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP) as u64;

/// Why the filters could not be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FilterError {
    /// seccompiler does not know this machine's architecture.
    #[error("seccomp: unsupported architecture {arch}: {source}")]
    Arch {
        /// The architecture.
        arch: &'static str,
        /// Why.
        source: seccompiler::BackendError,
    },
    /// A rule or filter was refused.
    #[error("seccomp: {0}")]
    Build(#[from] seccompiler::BackendError),
}

/// The filters to install, in order: the deny list (EPERM), `clone3` (ENOSYS), and on x86_64
/// the x32 calls (EPERM, [`no_x32`]).
/// `io_uring` lets the app use io_uring.
pub(crate) fn filters(io_uring: bool) -> Result<Vec<BpfProgram>, FilterError> {
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(|source| FilterError::Arch {
            arch: std::env::consts::ARCH,
            source,
        })?;
    let denied = DENIED.iter().chain(IO_URING.iter().filter(|_| !io_uring));
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = denied.map(|&nr| (nr, Vec::new())).collect();
    // clone(flags, ...): deny when any namespace flag is set. On x86_64 and aarch64 the flags
    // are the first argument.
    let ns_rules = (0..u64::BITS)
        .map(|b| 1u64 << b)
        .filter(|bit| CLONE_NS_FLAGS & bit != 0)
        .map(|bit| {
            SeccompCondition::new(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(bit), bit)
                .and_then(|c| SeccompRule::new(vec![c]))
        })
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_clone, ns_rules);
    let deny = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )?;
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )?;
    let mut programs = [deny, clone3]
        .into_iter()
        .map(|f| BpfProgram::try_from(f).map_err(FilterError::from))
        .collect::<Result<Vec<_>, _>>()?;
    #[cfg(target_arch = "x86_64")]
    programs.push(no_x32());
    Ok(programs)
}

/// x86_64's x32 calls: a number with `__X32_SYSCALL_BIT` set is the same call through the x32
/// table, under the same audit architecture. seccompiler's filters compare numbers exactly and
/// never look at that bit, so on a kernel built with x32 support `mount | 0x4000_0000` would
/// pass the deny list. Every such number gets EPERM here; no x86_64 program makes one.
#[cfg(target_arch = "x86_64")]
fn no_x32() -> BpfProgram {
    use seccompiler::sock_filter;
    // linux/bpf_common.h (BPF_LD 0x00 | BPF_W 0x00 | BPF_ABS 0x20, ...) and linux/audit.h.
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
    const BPF_JMP_JGE_K: u16 = 0x05 | 0x30;
    const BPF_RET_K: u16 = 0x06;
    const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    // struct seccomp_data: `int nr` at offset 0, `__u32 arch` at 4.
    const NR: u32 = 0;
    const ARCH: u32 = 4;
    let op = |code, k, jt, jf| sock_filter { code, jt, jf, k };
    vec![
        op(BPF_LD_W_ABS, ARCH, 0, 0),
        // Another architecture (i386 through int 0x80): the deny list's filter ends it.
        op(BPF_JMP_JEQ_K, AUDIT_ARCH_X86_64, 0, 3),
        op(BPF_LD_W_ABS, NR, 0, 0),
        op(BPF_JMP_JGE_K, X32_SYSCALL_BIT, 0, 1),
        op(
            BPF_RET_K,
            libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
            0,
            0,
        ),
        op(BPF_RET_K, libc::SECCOMP_RET_ALLOW, 0, 0),
    ]
}

/// Installs `filter` on the calling thread with seccomp(2) itself, not through seccompiler's
/// `apply_filter`, which sets no-new-privileges on the way: the sandbox sets that flag in a step
/// of its own (`init::privileges`), and each guard must stand, and be tested, on its own. The
/// kernel takes a filter from a caller without no-new-privileges if it has CAP_SYS_ADMIN in its
/// user namespace, as root of the sandbox's namespace does until it execs the app.
pub(crate) fn install(filter: &[seccompiler::sock_filter]) -> std::io::Result<()> {
    /// `struct sock_fprog` of linux/filter.h.
    #[repr(C)]
    struct Fprog {
        len: libc::c_ushort,
        filter: *const seccompiler::sock_filter,
    }
    let len = u16::try_from(filter.len())
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("a filter of {} instructions", filter.len()),
            )
        })?;
    let prog = Fprog {
        len,
        filter: filter.as_ptr(),
    };
    // SAFETY: seccomp(2) copies the program that `prog` points to, which outlives the call, and
    // keeps no pointer to it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0 as libc::c_ulong,
            &prog as *const Fprog,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_compile_for_this_machine() {
        let f = filters(false).expect("filters build");
        assert_eq!(f.len(), if cfg!(target_arch = "x86_64") { 3 } else { 2 });
        assert!(f.iter().all(|p| !p.is_empty()));
    }
}
