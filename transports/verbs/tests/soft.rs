//! The soft provider's RC semantics, in one process: queue pairs on two
//! soft NICs (each as another process would have), connected through the
//! provider interface as the transport will connect them.

mod common;

use common::{all_access, post, register, remote, sge, wait, Memory};
use oxmpi_adi::ErrorClass;
use oxmpi_verbs::provider::{
    connect_rc, AccessFlags, CompletionQueue, ConnectParams, Gid, MemoryRegion, Mtu, Nic,
    PostError, QpAddress, QpCaps, QpInit, QpState, QueuePair, RecvWr, RemoteAddr, RtrAttr, SendOp,
    SendWr, SharedReceiveQueue, WcOpcode, WcStatus,
};
use oxmpi_verbs::soft::{SoftCq, SoftMr, SoftNic, SoftPd, SoftQp, SoftSrq};
use std::io::{Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE;

/// One end: a NIC, its domain, completion queues and one queue pair.
/// Fields drop in order: the queue pair before what it uses.
struct End {
    qp: SoftQp,
    scq: SoftCq,
    rcq: SoftCq,
    srq: Option<SoftSrq>,
    pd: SoftPd,
    nic: SoftNic,
}

const CAPS: QpCaps = QpCaps {
    max_send_wr: 256,
    max_recv_wr: 256,
    max_inline_data: 64,
};

fn end(with_srq: bool) -> End {
    let nic = SoftNic::open().expect("soft NIC");
    let pd = nic.alloc_pd().unwrap();
    let scq = nic.create_cq(256, None).unwrap();
    let rcq = nic.create_cq(256, None).unwrap();
    let srq = with_srq.then(|| nic.create_srq(&pd, 256).unwrap());
    let qp = nic
        .create_qp(
            &pd,
            &QpInit {
                send_cq: &scq,
                recv_cq: &rcq,
                srq: srq.as_ref(),
                caps: CAPS,
            },
        )
        .unwrap();
    assert_eq!(qp.state(), QpState::Reset);
    End {
        qp,
        scq,
        rcq,
        srq,
        pd,
        nic,
    }
}

fn connect(a: &End, pa: &ConnectParams, b: &End, pb: &ConnectParams) {
    connect_rc(&a.nic, &a.qp, &b.qp.address(), pa).unwrap();
    connect_rc(&b.nic, &b.qp, &a.qp.address(), pb).unwrap();
    assert_eq!(a.qp.state(), QpState::Rts);
    assert_eq!(b.qp.state(), QpState::Rts);
}

fn pair() -> (End, End) {
    let (a, b) = (end(false), end(false));
    let p = ConnectParams::default();
    connect(&a, &p, &b, &p);
    (a, b)
}

/// Asserts that nothing more completes on `cq` within 50 ms.
fn quiet(cq: &SoftCq) {
    std::thread::sleep(Duration::from_millis(50));
    let mut out = Vec::new();
    cq.poll(16, &mut out).unwrap();
    assert!(out.is_empty(), "unexpected completions {out:?}");
}

#[test]
fn sends_arrive_in_order_into_posted_receives() {
    let (a, b) = pair();
    let src = Memory::new(64 * 100);
    let dst = Memory::new(64 * 100);
    let smr = register(&a.nic, &a.pd, &src, AccessFlags::NONE);
    let dmr = register(&b.nic, &b.pd, &dst, ALL);
    for i in 0..100u64 {
        b.qp.post_recv(&RecvWr {
            wr_id: 1000 + i,
            sge: sge(&dmr, &dst, 64 * i, 64),
        })
        .unwrap();
    }
    let mut payload = Vec::new();
    for i in 0..100u64 {
        payload.extend(std::iter::repeat_n(i as u8, 64));
    }
    src.fill(&payload);
    let inline_msgs: Vec<Vec<u8>> = (0..100u8).map(|i| vec![i; usize::from(i % 64)]).collect();
    for i in 0..100u64 {
        // Odd messages go inline, even ones from registered memory.
        let op = if i % 2 == 1 {
            SendOp::SendInline(&inline_msgs[i as usize])
        } else {
            SendOp::Send(sge(&smr, &src, 64 * i, 64))
        };
        post(&a.qp, i, op);
    }
    let sent = wait(&a.scq, 100);
    let got = wait(&b.rcq, 100);
    for (i, (s, r)) in sent.iter().zip(&got).enumerate() {
        assert_eq!(
            (s.wr_id, s.status, s.opcode),
            (i as u64, WcStatus::Success, WcOpcode::Send)
        );
        assert_eq!(
            (r.wr_id, r.status, r.opcode),
            (1000 + i as u64, WcStatus::Success, WcOpcode::Recv)
        );
        assert_eq!(r.qp_num, b.qp.qp_num());
        let expected_len = if i % 2 == 1 { i % 64 } else { 64 };
        assert_eq!(r.byte_len as usize, expected_len, "message {i}");
        let at = 64 * i;
        assert!(
            dst.bytes()[at..at + expected_len]
                .iter()
                .all(|&x| x == i as u8),
            "message {i}"
        );
    }
    quiet(&a.scq);
}

#[test]
fn inline_data_above_the_limit_is_refused_at_post() {
    let (a, _b) = pair();
    let big = vec![0u8; 65];
    let e =
        a.qp.post_send(&SendWr {
            wr_id: 1,
            signaled: true,
            op: SendOp::SendInline(&big),
        })
        .unwrap_err();
    assert!(
        matches!(e, PostError::Invalid(ref e) if e.class() == ErrorClass::Arg),
        "{e:?}"
    );
}

#[test]
fn rdma_write_then_read_back() {
    let (a, b) = pair();
    let local = Memory::new(8192);
    let back = Memory::new(8192);
    let target = Memory::new(8192);
    let lmr = register(&a.nic, &a.pd, &local, ALL);
    let bmr = register(&a.nic, &a.pd, &back, ALL);
    let tmr = register(&b.nic, &b.pd, &target, all_access());
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    local.fill(&data);
    post(
        &a.qp,
        1,
        SendOp::RdmaWrite {
            local: sge(&lmr, &local, 0, 4096),
            remote: remote(&tmr, 1000),
        },
    );
    post(
        &a.qp,
        2,
        SendOp::RdmaWriteInline {
            data: b"inline!",
            remote: remote(&tmr, 8000),
        },
    );
    post(
        &a.qp,
        3,
        SendOp::RdmaRead {
            local: sge(&bmr, &back, 0, 4096),
            remote: remote(&tmr, 1000),
        },
    );
    let wcs = wait(&a.scq, 3);
    assert_eq!(
        wcs.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        [
            (1, WcStatus::Success, WcOpcode::RdmaWrite),
            (2, WcStatus::Success, WcOpcode::RdmaWrite),
            (3, WcStatus::Success, WcOpcode::RdmaRead)
        ]
    );
    assert_eq!(wcs[2].byte_len, 4096);
    assert_eq!(&target.bytes()[1000..5096], &data[..]);
    assert_eq!(&target.bytes()[8000..8007], b"inline!");
    assert_eq!(&back.bytes()[..4096], &data[..]);
    // One-sided: the target posted nothing and polled nothing.
    quiet(&b.rcq);
    quiet(&b.scq);
}

#[test]
fn unsignaled_requests_complete_silently_but_in_order() {
    let (a, b) = pair();
    let target = Memory::new(80);
    let tmr = register(&b.nic, &b.pd, &target, all_access());
    for i in 0..10u64 {
        a.qp.post_send(&SendWr {
            wr_id: i,
            signaled: i == 9,
            op: SendOp::RdmaWriteInline {
                data: &[i as u8; 8],
                remote: remote(&tmr, 8 * i),
            },
        })
        .unwrap();
    }
    let wcs = wait(&a.scq, 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (9, WcStatus::Success));
    // When the last one completed, every earlier one was done.
    for i in 0..10 {
        assert_eq!(target.bytes()[8 * i], i as u8);
    }
    quiet(&a.scq);
}

#[test]
fn atomics_are_exact_under_several_queue_pairs() {
    const PAIRS: usize = 4;
    const OPS: u64 = 500;
    let target_end = Arc::new(end(false));
    let word = Memory::new(16);
    let tmr = register(&target_end.nic, &target_end.pd, &word, all_access());
    let target = remote(&tmr, 0);
    let cas_target = remote(&tmr, 8);
    // Each requester has its own NIC and a queue pair to its own queue pair
    // on the target's NIC.
    let mut target_qps = Vec::new();
    let mut requesters = Vec::new();
    for _ in 0..PAIRS {
        let r = end(false);
        let t = target_end
            .nic
            .create_qp(
                &target_end.pd,
                &QpInit {
                    send_cq: &target_end.scq,
                    recv_cq: &target_end.rcq,
                    srq: None,
                    caps: CAPS,
                },
            )
            .unwrap();
        let p = ConnectParams::default();
        connect_rc(&r.nic, &r.qp, &t.address(), &p).unwrap();
        connect_rc(&target_end.nic, &t, &r.qp.address(), &p).unwrap();
        target_qps.push(t);
        requesters.push(r);
    }
    let results: Vec<(Vec<u64>, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = requesters
            .iter()
            .map(|r| {
                s.spawn(move || {
                    let out = Memory::new(8);
                    let omr = register(&r.nic, &r.pd, &out, ALL);
                    let mut fetched = Vec::new();
                    for i in 0..OPS {
                        post(
                            &r.qp,
                            i,
                            SendOp::FetchAdd {
                                local: sge(&omr, &out, 0, 8),
                                remote: target,
                                add: 1,
                            },
                        );
                        let wc = wait(&r.scq, 1);
                        assert_eq!(
                            (wc[0].status, wc[0].opcode, wc[0].byte_len),
                            (WcStatus::Success, WcOpcode::FetchAdd, 8)
                        );
                        fetched.push(out.word(0));
                    }
                    // Increment the second word by compare-and-swap loops.
                    let mut swaps = 0;
                    let mut guess = 0u64;
                    while swaps < OPS {
                        post(
                            &r.qp,
                            0,
                            SendOp::CompareSwap {
                                local: sge(&omr, &out, 0, 8),
                                remote: cas_target,
                                compare: guess,
                                swap: guess + 1,
                            },
                        );
                        assert_eq!(wait(&r.scq, 1)[0].status, WcStatus::Success);
                        let original = out.word(0);
                        if original == guess {
                            swaps += 1;
                            guess += 1;
                        } else {
                            guess = original;
                        }
                    }
                    (fetched, swaps)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let total = PAIRS as u64 * OPS;
    assert_eq!(word.word(0), total, "fetch-and-add lost updates");
    assert_eq!(word.word(1), total, "compare-and-swap lost updates");
    // Every fetched value is distinct: each add saw the word exactly once.
    let mut all: Vec<u64> = results
        .iter()
        .flat_map(|(f, _)| f.iter().copied())
        .collect();
    all.sort_unstable();
    assert_eq!(all, (0..total).collect::<Vec<_>>());
    drop(target_qps);
}

#[test]
fn misaligned_atomic_is_a_remote_invalid_request() {
    let (a, b) = pair();
    let out = Memory::new(8);
    let target = Memory::new(16);
    let omr = register(&a.nic, &a.pd, &out, ALL);
    let tmr = register(&b.nic, &b.pd, &target, all_access());
    post(
        &a.qp,
        1,
        SendOp::FetchAdd {
            local: sge(&omr, &out, 0, 8),
            remote: remote(&tmr, 4),
            add: 1,
        },
    );
    assert_eq!(wait(&a.scq, 1)[0].status, WcStatus::RemInvReqErr);
    assert_eq!(target.word(0), 0);
}

/// Posts a bad request then a good one, and checks REM_ACCESS_ERR, then
/// WR_FLUSH_ERR, the error state on both sides, and that nothing landed.
fn check_access_error(a: &End, b: &End, bad: SendOp<'_>, target: &Memory, good_rkey: &SoftMr) {
    let before = target.bytes();
    post(&a.qp, 1, bad);
    post(
        &a.qp,
        2,
        SendOp::RdmaWriteInline {
            data: b"after",
            remote: remote(good_rkey, 0),
        },
    );
    let wcs = wait(&a.scq, 2);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::RemAccessErr));
    assert_eq!((wcs[1].wr_id, wcs[1].status), (2, WcStatus::WrFlushErr));
    assert_eq!(a.qp.state(), QpState::Error);
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.qp.state() != QpState::Error {
        assert!(
            Instant::now() < deadline,
            "the responder never went to the error state"
        );
        std::thread::yield_now();
    }
    assert_eq!(
        target.bytes(),
        before,
        "a request after the error was executed"
    );
    // Later posts complete at once with a flush error.
    post(&a.qp, 3, SendOp::SendInline(b"x"));
    assert_eq!(wait(&a.scq, 1)[0].status, WcStatus::WrFlushErr);
}

#[test]
fn bad_rkey_is_a_remote_access_error_then_flushes() {
    let (a, b) = pair();
    let target = Memory::new(64);
    let tmr = register(&b.nic, &b.pd, &target, all_access());
    let bad = RemoteAddr {
        addr: tmr.addr(),
        rkey: tmr.rkey() ^ 0x5a5a,
    };
    check_access_error(
        &a,
        &b,
        SendOp::RdmaWriteInline {
            data: b"12345678",
            remote: bad,
        },
        &target,
        &tmr,
    );
}

#[test]
fn out_of_bounds_is_a_remote_access_error() {
    let (a, b) = pair();
    let target = Memory::new(64);
    let tmr = register(&b.nic, &b.pd, &target, all_access());
    // Starts inside, ends one byte past the end.
    check_access_error(
        &a,
        &b,
        SendOp::RdmaWriteInline {
            data: b"12345678",
            remote: remote(&tmr, 57),
        },
        &target,
        &tmr,
    );
    let (a, b) = pair();
    let tmr2 = register(&b.nic, &b.pd, &target, all_access());
    let out = Memory::new(64);
    let omr = register(&a.nic, &a.pd, &out, ALL);
    // A READ whose end wraps around the address space.
    let wrap = RemoteAddr {
        addr: u64::MAX - 4,
        rkey: tmr2.rkey(),
    };
    check_access_error(
        &a,
        &b,
        SendOp::RdmaRead {
            local: sge(&omr, &out, 0, 16),
            remote: wrap,
        },
        &target,
        &tmr2,
    );
}

#[test]
fn missing_access_rights_are_remote_access_errors() {
    // The region lacks REMOTE_WRITE.
    let (a, b) = pair();
    let target = Memory::new(64);
    let read_only = register(&b.nic, &b.pd, &target, ALL | AccessFlags::REMOTE_READ);
    let writable = register(&b.nic, &b.pd, &target, all_access());
    check_access_error(
        &a,
        &b,
        SendOp::RdmaWriteInline {
            data: b"x",
            remote: remote(&read_only, 0),
        },
        &target,
        &writable,
    );
    // The region lacks REMOTE_ATOMIC.
    let (a, b) = pair();
    let out = Memory::new(8);
    let omr = register(&a.nic, &a.pd, &out, ALL);
    let no_atomic = register(
        &b.nic,
        &b.pd,
        &target,
        ALL | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
    );
    let writable = register(&b.nic, &b.pd, &target, all_access());
    check_access_error(
        &a,
        &b,
        SendOp::FetchAdd {
            local: sge(&omr, &out, 0, 8),
            remote: remote(&no_atomic, 0),
            add: 1,
        },
        &target,
        &writable,
    );
    // The responder's queue pair does not allow remote reads.
    let (a, b) = (end(false), end(false));
    let p = ConnectParams::default();
    let no_read = ConnectParams {
        access: AccessFlags::REMOTE_WRITE,
        ..p
    };
    connect(&a, &p, &b, &no_read);
    let writable = register(&b.nic, &b.pd, &target, all_access());
    let out = Memory::new(64);
    let omr = register(&a.nic, &a.pd, &out, ALL);
    check_access_error(
        &a,
        &b,
        SendOp::RdmaRead {
            local: sge(&omr, &out, 0, 8),
            remote: remote(&writable, 0),
        },
        &target,
        &writable,
    );
}

#[test]
fn a_registration_without_local_write_cannot_allow_remote_write() {
    let nic = SoftNic::open().unwrap();
    let pd = nic.alloc_pd().unwrap();
    let mem = Memory::new(8);
    // SAFETY: `mem` outlives the call; the registration is refused anyway.
    let r = unsafe { nic.register(&pd, mem.addr() as *mut u8, 8, AccessFlags::REMOTE_WRITE) };
    assert_eq!(r.err().map(|e| e.class()), Some(ErrorClass::Arg));
}

#[test]
fn local_protection_errors_complete_after_earlier_work() {
    let (a, b) = pair();
    let target = Memory::new(64);
    let tmr = register(&b.nic, &b.pd, &target, all_access());
    let local = Memory::new(64);
    let lmr = register(&a.nic, &a.pd, &local, AccessFlags::NONE);
    post(
        &a.qp,
        1,
        SendOp::RdmaWriteInline {
            data: b"first",
            remote: remote(&tmr, 0),
        },
    );
    // READ into memory registered without LOCAL_WRITE.
    post(
        &a.qp,
        2,
        SendOp::RdmaRead {
            local: sge(&lmr, &local, 0, 8),
            remote: remote(&tmr, 0),
        },
    );
    let wcs = wait(&a.scq, 2);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::Success));
    assert_eq!((wcs[1].wr_id, wcs[1].status), (2, WcStatus::LocProtErr));
    assert_eq!(a.qp.state(), QpState::Error);
}

#[test]
fn deregistration_revokes_access() {
    let (a, b) = pair();
    let target = Memory::new(64);
    let tmr = register(&b.nic, &b.pd, &target, all_access());
    let old = remote(&tmr, 0);
    post(
        &a.qp,
        1,
        SendOp::RdmaWriteInline {
            data: b"ok",
            remote: old,
        },
    );
    assert_eq!(wait(&a.scq, 1)[0].status, WcStatus::Success);
    drop(tmr);
    post(
        &a.qp,
        2,
        SendOp::RdmaWriteInline {
            data: b"no",
            remote: old,
        },
    );
    assert_eq!(wait(&a.scq, 1)[0].status, WcStatus::RemAccessErr);
    assert_eq!(&target.bytes()[..2], b"ok");
}

#[test]
fn rnr_without_retries_fails_at_once() {
    let (a, b) = (end(false), end(false));
    let p = ConnectParams {
        rnr_retry: 0,
        ..ConnectParams::default()
    };
    connect(&a, &p, &b, &p);
    let start = Instant::now();
    post(&a.qp, 1, SendOp::SendInline(b"nobody listens"));
    post(&a.qp, 2, SendOp::SendInline(b"behind it"));
    let wcs = wait(&a.scq, 2);
    assert_eq!(wcs[0].status, WcStatus::RnrRetryExcErr);
    assert_eq!(wcs[1].status, WcStatus::WrFlushErr);
    assert!(start.elapsed() < Duration::from_secs(1));
}

#[test]
fn rnr_retries_run_out_after_the_timer() {
    let (a, b) = (end(false), end(false));
    // 3 retries of 20.48 ms (code 22) each.
    let p = ConnectParams {
        rnr_retry: 3,
        min_rnr_timer: 22,
        ..ConnectParams::default()
    };
    connect(&a, &p, &b, &p);
    let start = Instant::now();
    post(&a.qp, 1, SendOp::SendInline(b"nobody listens"));
    assert_eq!(wait(&a.scq, 1)[0].status, WcStatus::RnrRetryExcErr);
    assert!(
        start.elapsed() >= Duration::from_millis(60),
        "gave up after {:?}",
        start.elapsed()
    );
}

#[test]
fn rnr_retries_for_ever_until_a_receive_is_posted() {
    let (a, b) = pair();
    let dst = Memory::new(64);
    let dmr = register(&b.nic, &b.pd, &dst, ALL);
    post(&a.qp, 1, SendOp::SendInline(b"wait for me"));
    post(&a.qp, 2, SendOp::SendInline(b"and me"));
    std::thread::sleep(Duration::from_millis(100));
    let mut none = Vec::new();
    a.scq.poll(4, &mut none).unwrap();
    assert!(none.is_empty(), "completed without a receive: {none:?}");
    b.qp.post_recv(&RecvWr {
        wr_id: 7,
        sge: sge(&dmr, &dst, 0, 32),
    })
    .unwrap();
    b.qp.post_recv(&RecvWr {
        wr_id: 8,
        sge: sge(&dmr, &dst, 32, 32),
    })
    .unwrap();
    let wcs = wait(&a.scq, 2);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    let got = wait(&b.rcq, 2);
    assert_eq!((got[0].wr_id, got[0].byte_len), (7, 11));
    assert_eq!((got[1].wr_id, got[1].byte_len), (8, 6));
    assert_eq!(&dst.bytes()[..11], b"wait for me");
    assert_eq!(&dst.bytes()[32..38], b"and me");
}

#[test]
fn a_message_longer_than_the_receive_is_a_length_error_on_both_sides() {
    let (a, b) = pair();
    let dst = Memory::new(64);
    let dmr = register(&b.nic, &b.pd, &dst, ALL);
    b.qp.post_recv(&RecvWr {
        wr_id: 5,
        sge: sge(&dmr, &dst, 0, 4),
    })
    .unwrap();
    b.qp.post_recv(&RecvWr {
        wr_id: 6,
        sge: sge(&dmr, &dst, 8, 8),
    })
    .unwrap();
    post(&a.qp, 1, SendOp::SendInline(b"too long"));
    assert_eq!(wait(&a.scq, 1)[0].status, WcStatus::RemInvReqErr);
    let got = wait(&b.rcq, 2);
    assert_eq!((got[0].wr_id, got[0].status), (5, WcStatus::LocLenErr));
    assert_eq!((got[1].wr_id, got[1].status), (6, WcStatus::WrFlushErr));
    assert_eq!(dst.bytes(), vec![0; 64], "truncated data was written");
}

#[test]
fn a_shared_receive_queue_feeds_several_queue_pairs() {
    // One responder NIC with an SRQ and two queue pairs on it.
    let server = end(true);
    let srq = server.srq.as_ref().unwrap();
    let dst = Memory::new(16 * 8);
    let dmr = register(&server.nic, &server.pd, &dst, ALL);
    for i in 0..8u64 {
        srq.post_recv(&RecvWr {
            wr_id: i,
            sge: sge(&dmr, &dst, 16 * i, 16),
        })
        .unwrap();
    }
    let second = server
        .nic
        .create_qp(
            &server.pd,
            &QpInit {
                send_cq: &server.scq,
                recv_cq: &server.rcq,
                srq: Some(srq),
                caps: CAPS,
            },
        )
        .unwrap();
    let e = second
        .post_recv(&RecvWr {
            wr_id: 99,
            sge: sge(&dmr, &dst, 0, 16),
        })
        .unwrap_err();
    assert!(matches!(e, PostError::Invalid(_)));
    let (c1, c2) = (end(false), end(false));
    let p = ConnectParams::default();
    connect(&c1, &p, &server, &p);
    connect_rc(&c2.nic, &c2.qp, &second.address(), &p).unwrap();
    connect_rc(&server.nic, &second, &c2.qp.address(), &p).unwrap();
    for i in 0..4u8 {
        post(&c1.qp, 0, SendOp::SendInline(&[b'a', i]));
        post(&c2.qp, 0, SendOp::SendInline(&[b'b', i]));
    }
    wait(&c1.scq, 4);
    wait(&c2.scq, 4);
    let got = wait(&server.rcq, 8);
    let mut from_first = 0;
    let mut from_second = 0;
    for wc in &got {
        let at = 16 * wc.wr_id as usize;
        let msg = &dst.bytes()[at..at + 2];
        if wc.qp_num == server.qp.qp_num() {
            assert_eq!(msg, [b'a', from_first]);
            from_first += 1;
        } else {
            assert_eq!(wc.qp_num, second.qp_num());
            assert_eq!(msg, [b'b', from_second]);
            from_second += 1;
        }
    }
    assert_eq!((from_first, from_second), (4, 4));
    drop(second);
}

#[test]
fn a_vanished_peer_is_a_retry_error() {
    let (a, b) = pair();
    drop(b);
    post(&a.qp, 1, SendOp::SendInline(b"anyone?"));
    post(&a.qp, 2, SendOp::SendInline(b"?"));
    let wcs = wait(&a.scq, 2);
    assert_eq!(wcs[0].status, WcStatus::RetryExcErr);
    assert_eq!(wcs[1].status, WcStatus::WrFlushErr);
}

#[test]
fn posting_follows_the_state_machine_and_queue_limits() {
    let (a, b) = (end(false), end(false));
    let e =
        a.qp.post_send(&SendWr {
            wr_id: 1,
            signaled: true,
            op: SendOp::SendInline(b"x"),
        })
        .unwrap_err();
    assert!(matches!(e, PostError::Invalid(_)));
    let dst = Memory::new(8);
    let dmr = register(&b.nic, &b.pd, &dst, ALL);
    assert!(
        b.qp.post_recv(&RecvWr {
            wr_id: 1,
            sge: sge(&dmr, &dst, 0, 8)
        })
        .is_err(),
        "post_recv in RESET"
    );
    // RTR before INIT is refused.
    let rtr = RtrAttr {
        remote: a.qp.address(),
        path_mtu: Mtu::Mtu4096,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        sgid_index: 0,
        hop_limit: 64,
    };
    assert_eq!(
        b.qp.modify_to_rtr(&rtr).unwrap_err().class(),
        ErrorClass::Arg
    );
    assert_eq!(b.qp.state(), QpState::Reset);
    let p = ConnectParams::default();
    connect(&a, &p, &b, &p);
    // The send queue holds at most max_send_wr requests: with no receive
    // posted on b, SENDs pile up until it is full.
    for i in 0..CAPS.max_send_wr {
        post(&a.qp, i.into(), SendOp::SendInline(b"x"));
    }
    let full = a.qp.post_send(&SendWr {
        wr_id: 0,
        signaled: true,
        op: SendOp::SendInline(b"x"),
    });
    assert!(matches!(full, Err(PostError::QueueFull)));
}

/// A list longer than the room left in the send queue: the requests
/// that fit are posted, the rest refused as a full queue, and the
/// refusal says how many went.
#[test]
fn a_list_past_the_send_queue_is_posted_up_to_it() {
    let (a, _b) = pair();
    // No receive is posted on b: the SENDs stay outstanding.
    let list: Vec<SendWr<'_>> = (0..u64::from(CAPS.max_send_wr) + 4)
        .map(|wr_id| SendWr {
            wr_id,
            signaled: true,
            op: SendOp::SendInline(b"x"),
        })
        .collect();
    a.qp.post_send_list(&list[..10]).unwrap();
    let refused = a.qp.post_send_list(&list[10..]).unwrap_err();
    assert_eq!(refused.posted, CAPS.max_send_wr as usize - 10);
    assert!(matches!(refused.error, PostError::QueueFull), "{refused:?}");
}

#[test]
fn a_queue_pair_cannot_connect_to_itself() {
    let a = end(false);
    let e = connect_rc(&a.nic, &a.qp, &a.qp.address(), &ConnectParams::default()).unwrap_err();
    assert_eq!(e.class(), ErrorClass::UnsupportedOperation);
}

/// The abstract socket address of the soft NIC with `gid` (the provider's
/// naming, which its module docs state).
fn nic_socket(gid: &Gid) -> std::os::unix::net::SocketAddr {
    let hex: String = gid.0.iter().map(|b| format!("{b:02x}")).collect();
    std::os::unix::net::SocketAddr::from_abstract_name(format!("oxmpi-soft-nic-{hex}").as_bytes())
        .unwrap()
}

/// A GID above any a soft NIC draws (save with odds of 2^-64), unique to
/// this test process.
fn high_gid() -> Gid {
    let mut g = [0xff; 16];
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u32;
    g[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    g[12..].copy_from_slice(&nanos.to_le_bytes());
    Gid(g)
}

#[test]
fn a_malformed_response_is_an_error_completion() {
    // A fake peer NIC whose GID sorts above the real one's, so the real
    // queue pair opens the stream to it.
    let fake = high_gid();
    let listener = std::os::unix::net::UnixListener::bind_addr(&nic_socket(&fake)).unwrap();
    let a = end(false);
    let remote = QpAddress {
        gid: fake,
        lid: 0,
        qpn: 5,
        psn: 9,
        mtu: Mtu::Mtu4096,
    };
    connect_rc(&a.nic, &a.qp, &remote, &ConnectParams::default()).unwrap();
    let (mut stream, _) = listener.accept().unwrap();
    let mut hello = [0u8; 40];
    stream.read_exact(&mut hello).unwrap();
    assert_eq!(&hello[..4], b"OXSN");
    assert_eq!(&hello[8..24], &a.qp.address().gid.0);
    assert_eq!(u32::from_le_bytes(hello[28..32].try_into().unwrap()), 5);
    let out = Memory::new(64);
    let omr = register(&a.nic, &a.pd, &out, ALL);
    post(
        &a.qp,
        1,
        SendOp::RdmaRead {
            local: sge(&omr, &out, 0, 8),
            remote: RemoteAddr { addr: 0, rkey: 1 },
        },
    );
    post(&a.qp, 2, SendOp::SendInline(b"next"));
    let mut request = [0u8; 40];
    stream.read_exact(&mut request).unwrap();
    // A frame of an unknown kind, as a response.
    stream.write_all(&[0xab; 40]).unwrap();
    let wcs = wait(&a.scq, 2);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::BadRespErr));
    assert_eq!((wcs[1].wr_id, wcs[1].status), (2, WcStatus::WrFlushErr));
    assert_eq!(a.qp.state(), QpState::Error);
    assert_eq!(out.bytes(), vec![0; 64]);
}

#[test]
fn a_response_of_the_wrong_size_is_an_error_completion() {
    let fake = high_gid();
    let listener = std::os::unix::net::UnixListener::bind_addr(&nic_socket(&fake)).unwrap();
    let a = end(false);
    let remote = QpAddress {
        gid: fake,
        lid: 0,
        qpn: 6,
        psn: 1,
        mtu: Mtu::Mtu4096,
    };
    connect_rc(&a.nic, &a.qp, &remote, &ConnectParams::default()).unwrap();
    let (mut stream, _) = listener.accept().unwrap();
    let mut hello = [0u8; 40];
    stream.read_exact(&mut hello).unwrap();
    let out = Memory::new(64);
    let omr = register(&a.nic, &a.pd, &out, ALL);
    post(
        &a.qp,
        1,
        SendOp::RdmaRead {
            local: sge(&omr, &out, 0, 8),
            remote: RemoteAddr { addr: 0, rkey: 1 },
        },
    );
    let mut request = [0u8; 40];
    stream.read_exact(&mut request).unwrap();
    // A well-formed READ response carrying 64 bytes for an 8-byte READ.
    let mut response = vec![0u8; 40 + 64];
    response[0] = 7;
    response[32..36].copy_from_slice(&64u32.to_le_bytes());
    response[40..].fill(0xee);
    stream.write_all(&response).unwrap();
    assert_eq!(wait(&a.scq, 1)[0].status, WcStatus::BadRespErr);
    assert_eq!(
        out.bytes(),
        vec![0; 64],
        "an oversized response was written"
    );
}

#[test]
fn strangers_at_the_nic_are_refused_and_it_goes_on() {
    let (a, b) = (end(false), end(false));
    let gid = b.qp.address().gid;
    // Garbage instead of a hello; a hello for a queue pair that does not
    // exist; a hello that claims to be another queue pair than the one
    // b's queue pair will be connected to; and a silent connection.
    let mut garbage = UnixStream::connect_addr(&nic_socket(&gid)).unwrap();
    garbage.write_all(&[0x55; 40]).unwrap();
    let mut wrong = [0u8; 40];
    wrong[..4].copy_from_slice(b"OXSN");
    wrong[4] = 1;
    wrong[28..32].copy_from_slice(&(b.qp.qp_num() ^ 0x40).to_le_bytes());
    UnixStream::connect_addr(&nic_socket(&gid))
        .unwrap()
        .write_all(&wrong)
        .unwrap();
    let mut impostor = wrong;
    impostor[8..24].copy_from_slice(&high_gid().0);
    impostor[28..32].copy_from_slice(&b.qp.qp_num().to_le_bytes());
    let mut imp = UnixStream::connect_addr(&nic_socket(&gid)).unwrap();
    imp.write_all(&impostor).unwrap();
    let _silent = UnixStream::connect_addr(&nic_socket(&gid)).unwrap();
    // The real connection still works.
    let p = ConnectParams::default();
    connect(&a, &p, &b, &p);
    let target = Memory::new(8);
    let tmr = register(&b.nic, &b.pd, &target, all_access());
    post(
        &a.qp,
        1,
        SendOp::RdmaWriteInline {
            data: b"through",
            remote: remote(&tmr, 0),
        },
    );
    let back = Memory::new(8);
    let bmr = register(&a.nic, &a.pd, &back, all_access());
    post(
        &b.qp,
        2,
        SendOp::RdmaWriteInline {
            data: b"and back",
            remote: remote(&bmr, 0),
        },
    );
    assert_eq!(wait(&a.scq, 1)[0].status, WcStatus::Success);
    assert_eq!(wait(&b.scq, 1)[0].status, WcStatus::Success);
    assert_eq!(&target.bytes()[..7], b"through");
    assert_eq!(&back.bytes()[..8], b"and back");
    // The impostor's stream was closed, not attached.
    let mut buf = [0u8; 1];
    imp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(imp.read(&mut buf).unwrap(), 0);
}

#[test]
fn the_common_rc_semantics_hold() {
    let (a, b) = (SoftNic::open().unwrap(), SoftNic::open().unwrap());
    common::rc_semantics(&a, &b);
}

#[test]
fn the_common_ud_semantics_hold() {
    let (a, b) = (SoftNic::open().unwrap(), SoftNic::open().unwrap());
    common::ud_semantics(&a, &b);
    // Within one NIC too, as a rank's datagrams to itself would go.
    common::ud_semantics(&a, &a);
}

#[test]
fn requests_behind_a_local_error_are_not_executed() {
    let (a, b) = pair();
    let target = Memory::new(64);
    let tmr = register(&b.nic, &b.pd, &target, all_access());
    let inbox = Memory::new(64);
    let imr = register(&b.nic, &b.pd, &inbox, ALL);
    let local = Memory::new(64);
    let lmr = register(&a.nic, &a.pd, &local, AccessFlags::NONE);
    // A SEND that waits at b (no receive yet, RNR for ever) keeps the queue
    // busy; behind it a READ into memory without LOCAL_WRITE, and a WRITE.
    post(&a.qp, 1, SendOp::SendInline(b"first"));
    post(
        &a.qp,
        2,
        SendOp::RdmaRead {
            local: sge(&lmr, &local, 0, 8),
            remote: remote(&tmr, 0),
        },
    );
    post(
        &a.qp,
        3,
        SendOp::RdmaWriteInline {
            data: b"late",
            remote: remote(&tmr, 8),
        },
    );
    std::thread::sleep(Duration::from_millis(20));
    b.qp.post_recv(&RecvWr {
        wr_id: 9,
        sge: sge(&imr, &inbox, 0, 64),
    })
    .unwrap();
    let wcs = wait(&a.scq, 3);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [
            (1, WcStatus::Success),
            (2, WcStatus::LocProtErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        target.bytes(),
        vec![0; 64],
        "a flushed request was executed"
    );
}

/// A registration with remote reads whose memory is no longer accessible
/// (unmapped: the transport's registration cache keeps idle ones; here
/// protected) answers a peer's READ with REM_ACCESS_ERR instead of
/// faulting the soft NIC's process.
#[test]
fn a_read_of_unmapped_registered_memory_is_a_remote_access_error() {
    let (a, b) = pair();
    let local = Memory::new(8192);
    let lmr = register(&a.nic, &a.pd, &local, AccessFlags::LOCAL_WRITE);
    let len = 8192;
    // SAFETY: a fresh anonymous mapping, made inaccessible below while
    // registered.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: the registration gives remote reads only; the soft NIC reads
    // it through the kernel, which this test checks.
    let tmr = unsafe {
        b.nic
            .register(&b.pd, p.cast(), len, AccessFlags::REMOTE_READ)
            .unwrap()
    };
    // No longer accessible, as if unmapped; kept reserved so that no
    // other mapping of this (multi-threaded) test process takes the
    // addresses meanwhile. SAFETY: the mapping made above; nothing of
    // this process uses it.
    assert_eq!(unsafe { libc::mprotect(p, len, libc::PROT_NONE) }, 0);
    post(
        &a.qp,
        3,
        SendOp::RdmaRead {
            local: sge(&lmr, &local, 0, 4096),
            remote: remote(&tmr, 0),
        },
    );
    let wcs = wait(&a.scq, 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (3, WcStatus::RemAccessErr));
    drop(tmr);
    // SAFETY: the mapping made above, deregistered.
    assert_eq!(unsafe { libc::munmap(p, len) }, 0);
}
