//! Device discovery as a program sees it (`verbs_probe`): on a machine
//! whose kernel lists no RDMA device in sysfs, discovery finds none, says
//! why under `OXMPI_VERBOSE=1`, and is not an error; with a device, it
//! names one of those sysfs lists. Invalid `OXMPI_VERBS_*` values are
//! MPI_ERR_ARG errors naming the variable.

use std::process::{Command, Output};

fn probe(env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_verbs_probe"));
    for var in [
        "OXMPI_VERBS_DEVICE",
        "OXMPI_VERBS_PORT",
        "OXMPI_VERBS_GID_INDEX",
    ] {
        c.env_remove(var);
    }
    c.env("OXMPI_VERBOSE", "1").envs(env.iter().copied());
    c.output().expect("verbs_probe runs")
}

/// The RDMA devices the kernel lists.
fn sysfs_devices() -> Vec<String> {
    std::fs::read_dir("/sys/class/infiniband")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn discovery_matches_what_the_kernel_lists() {
    let out = probe(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "verbs_probe failed: {stderr}");
    let devices = sysfs_devices();
    let found = stdout.starts_with("device ");
    if devices.is_empty() || !cfg!(feature = "rdma-core") {
        assert!(
            !found,
            "a device found where none exists or can be used: {stdout}"
        );
        assert!(
            stderr.contains("verbs: ") && stderr.contains("using the other methods"),
            "no verbose note of the missing device: {stderr:?}"
        );
        if cfg!(feature = "rdma-core") {
            assert!(stdout.contains("no RDMA device"), "{stdout}");
        }
    } else if found {
        let name = stdout.split_whitespace().nth(1).unwrap_or_default();
        assert!(
            devices.iter().any(|d| d == name),
            "{name} is not in {devices:?}"
        );
    }
}

#[test]
fn invalid_choices_are_argument_errors() {
    for (var, value) in [
        ("OXMPI_VERBS_PORT", "0"),
        ("OXMPI_VERBS_GID_INDEX", "x"),
        ("OXMPI_VERBS_DEVICE", "../etc"),
    ] {
        let out = probe(&[(var, value)]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{var}={value} accepted");
        assert!(
            stderr.contains("MPI_ERR_ARG") && stderr.contains(var),
            "{var}={value}: {stderr}"
        );
    }
}

#[cfg(feature = "rdma-core")]
#[test]
fn a_named_device_that_is_missing_is_an_argument_error() {
    let out = probe(&[("OXMPI_VERBS_DEVICE", "oxmpi_no_such_dev0")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("MPI_ERR_ARG") && stderr.contains("oxmpi_no_such_dev0"),
        "{stderr}"
    );
}
