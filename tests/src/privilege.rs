//! Tests that need root (network namespaces, a rank under another user):
//! as root they run; with passwordless sudo the test binary runs the one
//! test again under `sudo -n`; with neither they say why and pass without
//! doing anything — unless `OXMPI_REQUIRE_PRIVILEGED_TESTS=1` (set by
//! `ci/test.sh`) says they must run, and then they fail.

use crate::{run, Job};
use std::process::Command;
use std::time::Duration;

/// Environment variable: `1` makes a test that needs root fail where it
/// cannot have it, rather than pass having done nothing.
pub const REQUIRE_PRIVILEGED_ENV: &str = "OXMPI_REQUIRE_PRIVILEGED_TESTS";

/// Whether a test can run here, and how.
enum Privilege {
    Root,
    /// Passwordless sudo: the test runs itself again under it.
    Sudo,
    /// Neither, with the reason.
    Missing(String),
}

fn privilege() -> Privilege {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return Privilege::Root;
    }
    let mut c = Command::new("sudo");
    c.args(["-n", "true"]);
    match Job::spawn(c, Duration::from_secs(30)).and_then(Job::try_finish) {
        Ok(out) if out.status.success() => Privilege::Sudo,
        Ok(out) => Privilege::Missing(format!(
            "not root, and `sudo -n true` failed: {}",
            out.stderr.trim()
        )),
        Err(f) => Privilege::Missing(format!("not root, and `sudo -n true` {}", f.why)),
    }
}

/// Runs the test named `name` (of the test binary running) as root: here
/// if this process is root, else this test binary again under `sudo -n`,
/// which must pass. False when the caller must not go on: the test ran
/// under sudo, or it cannot run (said on standard error, with `needs`:
/// what it needs root for); the caller then returns. Panics where it
/// cannot run but [`REQUIRE_PRIVILEGED_ENV`] is `1`.
pub fn as_root(name: &str, needs: &str) -> bool {
    match privilege() {
        Privilege::Root => true,
        Privilege::Sudo => {
            let mut c = Command::new("sudo");
            c.arg("-n")
                .arg(std::env::current_exe().expect("the test binary's path"))
                .args([name, "--exact", "--nocapture", "--test-threads=1"])
                .env(REQUIRE_PRIVILEGED_ENV, "1");
            let out = run(c, Duration::from_secs(300));
            out.assert_success();
            assert!(
                out.stdout.contains("test result: ok. 1 passed"),
                "the test did not run under sudo:\n{}",
                out.stdout
            );
            false
        }
        Privilege::Missing(why) => {
            assert!(
                std::env::var(REQUIRE_PRIVILEGED_ENV).as_deref() != Ok("1"),
                "{name} must run ({REQUIRE_PRIVILEGED_ENV}=1) but cannot {needs}: {why}"
            );
            eprintln!("{name}: cannot {needs}, so it does nothing: {why}");
            false
        }
    }
}
