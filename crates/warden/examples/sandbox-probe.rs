//! The sandbox probe, a test helper that never ships (it is an example of the `warden` package,
//! built with its tests): run as an app in a sandbox, it tries to leave the sandbox in every way
//! the escape tests name, prints one line per attempt to stdout (the instance's log), then
//! serves as the demo app so that the instance becomes ready and the test can read the lines
//! with `warden logs`.
//!
//! A line reads `probe <what>: blocked (<why>)` when the sandbox held, `probe <what>: ESCAPED
//! (<how>)` when it did not, and `probe <what>: ok` for what must keep working.

#![allow(unsafe_code)]

use std::path::PathBuf;

/// Flags of the probe.
#[derive(Debug, clap::Parser)]
struct ProbeArgs {
    /// A TCP port on the host's loopback that must be unreachable
    #[arg(long)]
    host_port: Option<u16>,
    /// Paths on the host that must be neither readable nor writable (repeat)
    #[arg(long = "forbidden")]
    forbidden: Vec<PathBuf>,
    /// A host process id that must be invisible
    #[arg(long)]
    host_pid: Option<u32>,
    /// MiB to reserve and touch in a child process; must fail, or the child be killed, under
    /// the memory limit
    #[arg(long)]
    alloc_mb: Option<usize>,
    /// How many processes to try to run at once; must fail under the process limit
    #[arg(long)]
    processes: Option<usize>,
    /// Only reserve and touch this many MiB, then exit 0 (the child of --alloc-mb); exits 2 if
    /// the reservation is refused
    #[arg(long, hide = true)]
    fill_mb: Option<usize>,
    /// An address that must be reachable, HOST:PORT (repeat; network "bridged")
    #[arg(long = "reach")]
    reach: Vec<std::net::SocketAddr>,
    /// An address that must not be reachable, HOST:PORT (repeat)
    #[arg(long = "unreachable")]
    unreachable: Vec<std::net::SocketAddr>,
    /// A port to listen on at every address of the sandbox, so that others can try to reach it
    #[arg(long)]
    listen_any: Option<u16>,
    /// The sandbox must see no network interface but loopback (its own network namespace)
    #[arg(long)]
    only_loopback: bool,
    /// The host's name, which the sandbox must not have (its own uts namespace)
    #[arg(long)]
    host_name: Option<String>,
}

fn report(what: &str, escaped: Option<String>, why: impl std::fmt::Display) {
    match escaped {
        Some(how) => println!("probe {what}: ESCAPED ({how})"),
        None => println!("probe {what}: blocked ({why})"),
    }
}

/// Reserves and touches `mb` MiB in a child process, so that the out-of-memory killer (a cgroup
/// limit) ends the child and not the probe, which must go on to serve.
fn alloc(mb: usize) {
    use std::os::unix::process::ExitStatusExt;
    let me = std::env::args().next().unwrap_or_default();
    let status = std::process::Command::new(&me)
        .args(["--fill-mb", &mb.to_string()])
        .status();
    match status {
        Ok(s) if s.success() => report("memory-limit", Some(format!("touched {mb} MiB")), ""),
        Ok(s) if s.code() == Some(2) => report("memory-limit", None, "the reservation was refused"),
        Ok(s) if s.signal() == Some(nix::sys::signal::Signal::SIGKILL as i32) => {
            report("memory-limit", None, "killed by the kernel at the limit")
        }
        Ok(s) => println!("probe memory-limit: FAILED (the filler ended with {s})"),
        Err(e) => println!("probe memory-limit: FAILED (cannot run {me}: {e})"),
    }
}

/// Tries to have `n` processes running at once; they are stopped again before returning.
fn spawn_many(n: usize) {
    let mut children = Vec::new();
    let mut refused = None;
    for _ in 0..n {
        match std::process::Command::new("sleep").arg("30").spawn() {
            Ok(c) => children.push(c),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let started = children.len();
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    match refused {
        Some(e) => report(
            "process-limit",
            None,
            format!("refused after {started} processes: {e}"),
        ),
        None => report("process-limit", Some(format!("ran {n} processes")), ""),
    }
}

/// Tries to set up an io_uring, which the sandbox denies unless the app opted in.
fn io_uring() {
    let mut params = [0u8; 120];
    // SAFETY: io_uring_setup(2) reads and writes the 120-byte `io_uring_params` we own; a
    // descriptor it returns is closed at once.
    let fd =
        unsafe { nix::libc::syscall(nix::libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    if fd >= 0 {
        // SAFETY: the kernel just returned this descriptor to us.
        unsafe { nix::libc::close(fd as i32) };
        println!("probe io_uring: allowed");
        return;
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(nix::libc::EPERM) {
        println!("probe io_uring: denied ({e})");
    } else {
        println!("probe io_uring: unavailable ({e})");
    }
}

/// Reports every descriptor beyond stdin, stdout and stderr (none may be left over from
/// whoever started warden), and a stdin that is not /dev/null (such as the sandbox's control
/// socket, which the app must never hold).
fn inherited_descriptors() {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        println!("probe inherited-fds: unknown (no /proc/self/fd)");
        return;
    };
    let mut extra = Vec::new();
    for e in entries.flatten() {
        let Ok(fd) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let target = std::fs::read_link(e.path()).unwrap_or_default();
        // The listing's own descriptor is a directory under /proc.
        if fd > 2 && !target.starts_with("/proc") {
            extra.push(format!("{fd} -> {}", target.display()));
        }
    }
    let stdin = std::fs::read_link("/proc/self/fd/0").unwrap_or_default();
    if stdin != std::path::Path::new("/dev/null") {
        extra.push(format!("stdin -> {}", stdin.display()));
    }
    let escaped = (!extra.is_empty()).then(|| extra.join(", "));
    report(
        "inherited-fds",
        escaped,
        "only 0, 1 and 2 are open, and 0 is /dev/null",
    );
}

/// mount(2) called as system call `nr` with a file-system type it cannot read: the errno it
/// got, or `None` if it succeeded.
fn unreadable_mount(nr: nix::libc::c_long) -> Option<std::io::Error> {
    // SAFETY: mount(2) only reads the strings its pointers name; the type's pointer (dangling,
    // address 1) is unreadable on purpose, so the call fails with EFAULT if it reaches the
    // kernel's mount at all.
    let rc = unsafe {
        nix::libc::syscall(
            nr,
            c"none".as_ptr(),
            c"/tmp".as_ptr(),
            std::ptr::dangling::<nix::libc::c_char>(),
            0 as nix::libc::c_ulong,
            std::ptr::null::<nix::libc::c_void>(),
        )
    };
    (rc != 0).then(std::io::Error::last_os_error)
}

/// Whether the seccomp filter itself refuses mount(2), told apart from the kernel's refusal of
/// an app without capabilities, which is EPERM too: a mount(2) whose file-system type cannot be
/// read fails in the kernel with EFAULT before any permission check, while the filter answers
/// EPERM before the kernel looks at anything.
fn seccomp_mount() {
    let past = |how: &str| report("seccomp-mount", Some(how.into()), "");
    match unreadable_mount(nix::libc::SYS_mount) {
        None => past("mount(2) succeeded"),
        Some(e) => match e.raw_os_error() {
            Some(nix::libc::EPERM) => report("seccomp-mount", None, "the filter answers EPERM"),
            Some(nix::libc::EFAULT) => {
                past("mount(2) reached the kernel, which read its arguments (EFAULT)")
            }
            _ => println!("probe seccomp-mount: FAILED (unexpected {e})"),
        },
    }
}

/// Whether the filter refuses mount(2) made through x86_64's x32 table (its number with
/// `__X32_SYSCALL_BIT` set), which a filter comparing numbers exactly lets pass. The filter
/// answers EPERM; past it, a kernel without x32 answers ENOSYS and one with it EFAULT.
#[cfg(target_arch = "x86_64")]
fn seccomp_x32() {
    const X32_SYSCALL_BIT: nix::libc::c_long = 0x4000_0000;
    let past = |how: &str| report("seccomp-x32", Some(how.into()), "");
    match unreadable_mount(X32_SYSCALL_BIT | nix::libc::SYS_mount) {
        None => past("the x32 mount(2) succeeded"),
        Some(e) => match e.raw_os_error() {
            Some(nix::libc::EPERM) => report("seccomp-x32", None, "the filter answers EPERM"),
            Some(nix::libc::ENOSYS) => {
                past("the x32 call passed the filter to a kernel without x32 (ENOSYS)")
            }
            Some(nix::libc::EFAULT) => past("the x32 mount(2) reached the kernel (EFAULT)"),
            _ => println!("probe seccomp-x32: FAILED (unexpected {e})"),
        },
    }
}

/// The filler of [`alloc`]: exits 0 once every page is touched, 2 if the reservation fails.
fn fill(mb: usize) -> ! {
    let mut v: Vec<u8> = Vec::new();
    if v.try_reserve_exact(mb * 1024 * 1024).is_err() {
        std::process::exit(2);
    }
    // One write per page makes each one resident.
    v.resize(mb * 1024 * 1024, 1);
    std::hint::black_box(&v);
    std::process::exit(0)
}

/// Runs every probe; never fails, only reports.
fn run(args: &ProbeArgs) {
    if let Some(mb) = args.fill_mb {
        fill(mb);
    }
    if let Some(port) = args.host_port {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        match std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2)) {
            Ok(_) => report("host-listener", Some(format!("connected to {addr}")), ""),
            Err(e) => report("host-listener", None, e),
        }
    }
    if let Ok(addr) = std::env::var("WARDEN_NETWORK_ADDR") {
        println!("probe address: {addr}");
    }
    if let Some(port) = args.listen_any {
        match std::net::TcpListener::bind(("0.0.0.0", port)) {
            Ok(l) => {
                println!("probe listen-any {port}: ok");
                std::thread::spawn(move || for _ in l.incoming() {});
            }
            Err(e) => println!("probe listen-any {port}: FAILED ({e})"),
        }
    }
    let timeout = std::time::Duration::from_secs(2);
    for addr in &args.reach {
        match std::net::TcpStream::connect_timeout(addr, timeout) {
            Ok(_) => println!("probe reach {addr}: ok"),
            Err(e) => println!("probe reach {addr}: FAILED ({e})"),
        }
    }
    for addr in &args.unreachable {
        match std::net::TcpStream::connect_timeout(addr, timeout) {
            Ok(_) => report(&format!("unreachable {addr}"), Some("connected".into()), ""),
            Err(e) => report(&format!("unreachable {addr}"), None, e),
        }
    }
    for path in &args.forbidden {
        let what = format!("read {}", path.display());
        match std::fs::read_dir(path).map(|d| d.count()) {
            Ok(n) => report(&what, Some(format!("listed {n} entries")), ""),
            Err(e) => match std::fs::read(path) {
                Ok(b) => report(&what, Some(format!("read {} bytes", b.len())), ""),
                Err(_) => report(&what, None, e),
            },
        }
        let file = path.join("probe-was-here");
        let what = format!("write {}", file.display());
        match std::fs::write(&file, b"x") {
            Ok(()) => report(&what, Some("created a file".into()), ""),
            Err(e) => report(&what, None, e),
        }
    }
    for dir in ["/", "/etc", "/usr", "/proc/sys/kernel"] {
        let file = PathBuf::from(dir).join("probe-was-here");
        let what = format!("write {}", file.display());
        match std::fs::write(&file, b"x") {
            Ok(()) => report(&what, Some("created a file".into()), ""),
            Err(e) => report(&what, None, e),
        }
    }
    match std::env::var("WARDEN_DATA_DIR") {
        Ok(d) => match std::fs::write(PathBuf::from(&d).join("probe-ok"), b"x") {
            Ok(()) => println!("probe write data dir: ok"),
            Err(e) => println!("probe write data dir: FAILED ({e})"),
        },
        Err(_) => println!("probe write data dir: FAILED (WARDEN_DATA_DIR unset)"),
    }
    if let Some(pid) = args.host_pid {
        let visible: Vec<u32> = std::fs::read_dir("/proc")
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        // Inside, only init and the app exist (pids 1 and 2); the host's pid numbers mean
        // nothing here unless the namespace is the host's.
        let escaped = (visible.len() > 3 || (pid > 2 && visible.contains(&pid))).then(|| {
            format!(
                "sees {} processes, host pid {pid} among them: {}",
                visible.len(),
                visible.contains(&pid)
            )
        });
        report("host-processes", escaped, format!("sees pids {visible:?}"));
    }
    inherited_descriptors();
    io_uring();
    // Pid 1 is the sandbox's init; its command line must not tell the host's paths.
    match std::fs::read("/proc/1/cmdline") {
        Ok(c) => {
            let text = String::from_utf8_lossy(&c).replace('\0', " ");
            let escaped = text.contains('/').then(|| text.trim().to_owned());
            report("pid1-cmdline", escaped, text.trim());
        }
        Err(e) => println!("probe pid1-cmdline: unknown ({e})"),
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    let (cap_eff, nnp) = (field("CapEff:"), field("NoNewPrivs:"));
    // Each on its own: no-new-privileges is a step of the sandbox of its own, not a side
    // effect of installing the seccomp filter.
    for (what, name, want) in [
        ("no-new-privs", "NoNewPrivs:", "1"),
        ("seccomp-mode", "Seccomp:", "2"),
    ] {
        let value = field(name);
        if !value.is_empty() {
            let escaped = (value != want).then(|| format!("{name} {value}"));
            report(what, escaped, format!("{name} {value}"));
        }
    }
    if cap_eff.is_empty() {
        println!("probe capabilities: unknown (no /proc/self/status)");
    } else {
        let escaped = (!cap_eff.trim_start_matches('0').is_empty() || nnp != "1")
            .then(|| format!("CapEff {cap_eff}, NoNewPrivs {nnp}"));
        report(
            "capabilities",
            escaped,
            format!("CapEff {cap_eff}, NoNewPrivs {nnp}"),
        );
    }
    // The sets exec could give capabilities back from, and the bounding set that caps them
    // all: empty in the sandbox, whatever CapEff says.
    if !cap_eff.is_empty() {
        let sets: Vec<String> = ["CapPrm:", "CapInh:", "CapBnd:", "CapAmb:"]
            .iter()
            .map(|name| format!("{name} {}", field(name)))
            .collect();
        let full = sets.iter().any(|s| {
            !s.rsplit(' ')
                .next()
                .unwrap_or("")
                .trim_start_matches('0')
                .is_empty()
        });
        report(
            "capability-sets",
            full.then(|| sets.join(", ")),
            sets.join(", "),
        );
    }
    if args.only_loopback {
        // The effect of a network namespace of its own: the host's interfaces are not there.
        match nix::ifaddrs::getifaddrs() {
            Ok(addrs) => {
                let mut names: Vec<String> = addrs.map(|a| a.interface_name).collect();
                names.sort();
                names.dedup();
                let escaped = (names != ["lo"]).then(|| format!("sees {}", names.join(", ")));
                report("interfaces", escaped, "only lo");
            }
            Err(e) => println!("probe interfaces: FAILED ({e})"),
        }
    }
    if let Some(host) = &args.host_name {
        // The effect of a uts namespace of its own: the name the sandbox was given, not the
        // host's.
        let mine = nix::sys::utsname::uname()
            .map(|u| u.nodename().to_string_lossy().into_owned())
            .unwrap_or_default();
        let escaped = (mine == *host).then(|| format!("has the host's name {mine}"));
        report("hostname", escaped, format!("its own name {mine}"));
    }
    // Needs CAP_SYS_ADMIN over the sandbox's own uts namespace, which the sandbox's creator
    // had and the app must not.
    // Writes the name it already has: a success is the escape, without renaming anything.
    let current = nix::unistd::gethostname().unwrap_or_default();
    match nix::unistd::sethostname(&current) {
        Ok(()) => report("sethostname", Some("may set the host name".into()), ""),
        Err(e) => report("sethostname", None, e),
    }
    match nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER) {
        Ok(()) => report("new-user-namespace", Some("unshare succeeded".into()), ""),
        Err(e) => report("new-user-namespace", None, e),
    }
    match nix::mount::mount(
        Some("tmpfs"),
        "/tmp",
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    ) {
        Ok(()) => report("mount", Some("mounted a tmpfs".into()), ""),
        Err(e) => report("mount", None, e),
    }
    seccomp_mount();
    #[cfg(target_arch = "x86_64")]
    seccomp_x32();
    if let Some(n) = args.processes {
        spawn_many(n);
    }
    if let Some(mb) = args.alloc_mb {
        alloc(mb);
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
}

fn main() -> std::process::ExitCode {
    let args = <ProbeArgs as clap::Parser>::parse();
    run(&args);
    let Some(port) = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse::<u16>().ok())
    else {
        eprintln!("PORT is not set; the probe is started by the warden agent");
        return std::process::ExitCode::FAILURE;
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(warden_demo_app::serve(
        port,
        warden_demo_app::Identity::from_env(),
    )) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("the demo app failed: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
