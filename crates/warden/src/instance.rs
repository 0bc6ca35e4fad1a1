//! `warden-instance`: the image of an instance's own processes, installed beside `warden`.
//!
//! The agent runs it for every instance: `warden-instance sandbox-init` builds a sandbox (its
//! init processes stay for the instance's life) and `warden-instance demo-app` is the demo app.
//! It is a binary of its own, not a command of `warden`, because of what every process it
//! starts keeps: the loader relocates a position-independent executable's `.data.rel.ro` and
//! `.got` into private pages, about 650 KiB for the whole of `warden` and a small part of that
//! for this image, which links only these two roles (docs/BENCHMARKS.md, "Idle instances").
//! It allocates with the C library's allocator, as `warden`'s roles other than `up` do, and
//! parses its one argument without clap.
#![deny(unsafe_code)]

use std::process::ExitCode;

/// What the agent may ask of this image.
enum Role {
    DemoApp,
    SandboxInit,
    Version,
}

/// The role of a command line, exactly as the agent writes it (`warden-instance ROLE`).
fn role(args: &[std::ffi::OsString]) -> Option<Role> {
    match args {
        [_, c] if c == "demo-app" => Some(Role::DemoApp),
        [_, c] if c == "sandbox-init" => Some(Role::SandboxInit),
        [_, c] if c == "--version" => Some(Role::Version),
        _ => None,
    }
}

fn main() -> ExitCode {
    // Before anything is opened: what the caller left open must never reach the app.
    warden_sandbox::spawn::close_inherited_descriptors();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let code = match role(&args) {
        Some(Role::SandboxInit) => sandbox_init(),
        Some(Role::DemoApp) => demo_app(),
        Some(Role::Version) => {
            println!("warden-instance {}", env!("CARGO_PKG_VERSION"));
            0
        }
        None => {
            eprintln!(
                "usage: warden-instance demo-app | sandbox-init\n\
                 The warden agent runs this for each instance; to run warden, use `warden`."
            );
            2
        }
    };
    ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX))
}

/// Builds the sandbox of the instance whose directory is the working directory, and runs its
/// app in it. It forks, so no thread may exist before it: no runtime is started here.
fn sandbox_init() -> i32 {
    match std::env::current_dir() {
        Ok(dir) => warden_sandbox::init::main(&dir),
        Err(e) => {
            eprintln!("warden-sandbox: cannot find the instance directory: {e}");
            125
        }
    }
}

/// Serves the demo app on 127.0.0.1:$PORT until it is stopped.
fn demo_app() -> i32 {
    let port = match std::env::var("PORT").map(|p| p.parse::<u16>()) {
        Ok(Ok(port)) => port,
        Ok(Err(_)) => {
            eprintln!("error: PORT is not a port number");
            return 1;
        }
        Err(_) => {
            eprintln!("error: PORT is not set; the demo app is started by the warden agent");
            return 1;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return 1;
        }
    };
    let served = runtime.block_on(warden_demo_app::serve(
        port,
        warden_demo_app::Identity::from_env(),
    ));
    match served {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{role, Role};

    fn v(args: &[&str]) -> Vec<std::ffi::OsString> {
        args.iter().map(Into::into).collect()
    }

    #[test]
    fn only_the_agents_exact_command_lines_have_a_role() {
        assert!(matches!(
            role(&v(&["warden", "sandbox-init"])),
            Some(Role::SandboxInit)
        ));
        assert!(matches!(
            role(&v(&["/x/warden-instance", "demo-app"])),
            Some(Role::DemoApp)
        ));
        for args in [
            &["warden-instance", "demo-app", "--help"][..],
            &["warden-instance", "up"],
            &["warden-instance"],
        ] {
            assert!(role(&v(args)).is_none(), "{args:?}");
        }
    }
}
