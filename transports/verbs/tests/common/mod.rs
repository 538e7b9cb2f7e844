//! RC semantics every provider must keep, written once over the provider
//! interface: the soft provider runs them in CI (`tests/soft.rs`), a real
//! device in the opt-in `tests/hw.rs`.

use oxmpi_adi::ErrorClass;
use oxmpi_verbs::provider::{
    connect_rc, AccessFlags, AhAttr, CompletionChannel, CompletionQueue, ConnectParams,
    MemoryRegion, Nic, PostError, QpCaps, QpInit, QpState, QueuePair, RecvWr, RemoteAddr, SendOp,
    SendWr, Sge, UdAttr, UdQueuePair, UdSendWr, WcOpcode, WcStatus, WorkCompletion, GRH_LEN,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Memory the NIC may write at any time: words with interior mutability,
/// so writes through the registration's raw pointer are allowed while the
/// test holds a shared reference.
pub struct Memory {
    words: Vec<AtomicU64>,
}

impl Memory {
    /// `bytes` zeroed bytes (rounded up to whole words).
    pub fn new(bytes: usize) -> Memory {
        Memory {
            words: (0..bytes.div_ceil(8)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Its address.
    pub fn addr(&self) -> u64 {
        self.words.as_ptr() as u64
    }

    /// A copy of its bytes.
    pub fn bytes(&self) -> Vec<u8> {
        self.words
            .iter()
            .flat_map(|w| w.load(Ordering::SeqCst).to_ne_bytes())
            .collect()
    }

    /// Sets its first bytes to `data`.
    pub fn fill(&self, data: &[u8]) {
        for (w, chunk) in self.words.iter().zip(data.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            w.store(u64::from_ne_bytes(b), Ordering::SeqCst);
        }
    }

    /// Its `i`th word.
    pub fn word(&self, i: usize) -> u64 {
        self.words[i].load(Ordering::SeqCst)
    }
}

/// Registers all of `mem` on `nic`.
pub fn register<N: Nic>(nic: &N, pd: &N::Pd, mem: &Memory, access: AccessFlags) -> N::Mr {
    // SAFETY: `mem` is interior-mutable memory that every test keeps alive
    // (declared before its registration) until the registration is dropped.
    unsafe {
        nic.register(
            pd,
            mem.words.as_ptr() as *mut u8,
            mem.words.len() * 8,
            access,
        )
    }
    .expect("registration")
}

/// Every right.
pub fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

/// Polls `cq` until `n` completions came, for at most 10 s.
pub fn wait(cq: &impl CompletionQueue, n: usize) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    while out.len() < n {
        cq.poll(n - out.len(), &mut out).unwrap();
        assert!(
            Instant::now() < deadline,
            "only {} of {n} completions after 10 s: {out:?}",
            out.len()
        );
        std::thread::yield_now();
    }
    out
}

/// The SGE of `length` bytes at `offset` in `mem`, registered as `mr`.
pub fn sge(mr: &impl MemoryRegion, mem: &Memory, offset: u64, length: u32) -> Sge {
    Sge {
        addr: mem.addr() + offset,
        length,
        lkey: mr.lkey(),
    }
}

/// The remote address of `offset` in the region `mr`.
pub fn remote(mr: &impl MemoryRegion, offset: u64) -> RemoteAddr {
    RemoteAddr {
        addr: mr.addr() + offset,
        rkey: mr.rkey(),
    }
}

/// Posts a signaled send request.
pub fn post(qp: &impl QueuePair, wr_id: u64, op: SendOp<'_>) {
    qp.post_send(&SendWr {
        wr_id,
        signaled: true,
        op,
    })
    .unwrap();
}

/// Connects a queue pair on `nic_a` to one on `nic_b` (the same NIC
/// twice is fine) and checks, in order: SEND into a posted receive;
/// RDMA WRITE and READ back; fetch-and-add and compare-and-swap with their
/// original values; lists of WRITEs and READs posted at once, completed
/// in order, and a list cut by a request with too much inline data
/// (those before it posted, it and those after not); then a WRITE with a
/// wrong rkey completes with
/// REM_ACCESS_ERR, the request behind it with WR_FLUSH_ERR, and nothing
/// lands.
pub fn rc_semantics<N: Nic>(nic_a: &N, nic_b: &N) {
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_inline_data: 32,
    };
    let (pd_a, pd_b) = (nic_a.alloc_pd().unwrap(), nic_b.alloc_pd().unwrap());
    let (cq_a, cq_b) = (
        nic_a.create_cq(64, None).unwrap(),
        nic_b.create_cq(64, None).unwrap(),
    );
    let qp_a = nic_a
        .create_qp(
            &pd_a,
            &QpInit {
                send_cq: &cq_a,
                recv_cq: &cq_a,
                srq: None,
                caps,
            },
        )
        .unwrap();
    let qp_b = nic_b
        .create_qp(
            &pd_b,
            &QpInit {
                send_cq: &cq_b,
                recv_cq: &cq_b,
                srq: None,
                caps,
            },
        )
        .unwrap();
    let p = ConnectParams::default();
    connect_rc(nic_a, &qp_a, &qp_b.address(), &p).unwrap();
    connect_rc(nic_b, &qp_b, &qp_a.address(), &p).unwrap();
    assert_eq!((qp_a.state(), qp_b.state()), (QpState::Rts, QpState::Rts));

    let local = Memory::new(4096);
    let target = Memory::new(4096);
    let lmr = register(nic_a, &pd_a, &local, AccessFlags::LOCAL_WRITE);
    let tmr = register(nic_b, &pd_b, &target, all_access());

    // SEND / RECV.
    qp_b.post_recv(&RecvWr {
        wr_id: 9,
        sge: sge(&tmr, &target, 0, 64),
    })
    .unwrap();
    post(&qp_a, 1, SendOp::SendInline(b"rc semantics"));
    assert_eq!(wait(&cq_a, 1)[0].status, WcStatus::Success);
    let got = wait(&cq_b, 1)[0];
    assert_eq!(
        (got.wr_id, got.status, got.opcode, got.byte_len),
        (9, WcStatus::Success, WcOpcode::Recv, 12)
    );
    assert_eq!(&target.bytes()[..12], b"rc semantics");

    // RDMA WRITE, then READ back.
    let data: Vec<u8> = (0..2048u32).map(|i| (i % 253) as u8).collect();
    local.fill(&data);
    post(
        &qp_a,
        2,
        SendOp::RdmaWrite {
            local: sge(&lmr, &local, 0, 2048),
            remote: remote(&tmr, 1024),
        },
    );
    assert_eq!(wait(&cq_a, 1)[0].status, WcStatus::Success);
    assert_eq!(&target.bytes()[1024..3072], &data[..]);
    local.fill(&[0; 2048]);
    post(
        &qp_a,
        3,
        SendOp::RdmaRead {
            local: sge(&lmr, &local, 0, 2048),
            remote: remote(&tmr, 1024),
        },
    );
    let read = wait(&cq_a, 1)[0];
    assert_eq!(
        (read.status, read.opcode),
        (WcStatus::Success, WcOpcode::RdmaRead)
    );
    assert_eq!(&local.bytes()[..2048], &data[..]);

    // Atomics on the word at offset 3072, which holds its bytes from the
    // pattern above: set it first.
    target.words[384].store(40, Ordering::SeqCst);
    post(
        &qp_a,
        4,
        SendOp::FetchAdd {
            local: sge(&lmr, &local, 0, 8),
            remote: remote(&tmr, 3072),
            add: 2,
        },
    );
    assert_eq!(wait(&cq_a, 1)[0].status, WcStatus::Success);
    assert_eq!((local.word(0), target.word(384)), (40, 42));
    post(
        &qp_a,
        5,
        SendOp::CompareSwap {
            local: sge(&lmr, &local, 0, 8),
            remote: remote(&tmr, 3072),
            compare: 42,
            swap: 7,
        },
    );
    assert_eq!(wait(&cq_a, 1)[0].status, WcStatus::Success);
    assert_eq!((local.word(0), target.word(384)), (42, 7));
    post(
        &qp_a,
        6,
        SendOp::CompareSwap {
            local: sge(&lmr, &local, 0, 8),
            remote: remote(&tmr, 3072),
            compare: 42,
            swap: 9,
        },
    );
    assert_eq!(wait(&cq_a, 1)[0].status, WcStatus::Success);
    assert_eq!((local.word(0), target.word(384)), (7, 7));

    // A list of WRITEs, then one of READs back: one post each, executed
    // and completed in order.
    let pieces: Vec<u8> = (0..512u32).map(|i| (i * 5 % 251) as u8).collect();
    local.fill(&pieces);
    let writes: Vec<SendWr<'_>> = (0..8u64)
        .map(|i| SendWr {
            wr_id: 100 + i,
            signaled: true,
            op: SendOp::RdmaWrite {
                local: sge(&lmr, &local, 64 * i, 64),
                remote: remote(&tmr, 2048 + 128 * i),
            },
        })
        .collect();
    qp_a.post_send_list(&writes).unwrap();
    let reads: Vec<SendWr<'_>> = (0..8u64)
        .map(|i| SendWr {
            wr_id: 200 + i,
            signaled: true,
            op: SendOp::RdmaRead {
                local: sge(&lmr, &local, 1024 + 64 * i, 64),
                remote: remote(&tmr, 2048 + 128 * i),
            },
        })
        .collect();
    qp_a.post_send_list(&reads).unwrap();
    let wcs = wait(&cq_a, 16);
    let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    let want: Vec<u64> = (100..108).chain(200..208).collect();
    assert_eq!(ids, want, "completions of two lists");
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    for i in 0..8 {
        let piece = &pieces[64 * i..64 * i + 64];
        assert_eq!(&target.bytes()[2048 + 128 * i..][..64], piece, "write {i}");
        assert_eq!(&local.bytes()[1024 + 64 * i..][..64], piece, "read {i}");
    }
    // A list whose third request has more inline data than the queue
    // pair takes (more than any device grants): the two before it are
    // posted and complete, the third and the fourth are not.
    let too_long = vec![9u8; 4096];
    let marked = |wr_id: u64, data: &'static [u8], at: u64| SendWr {
        wr_id,
        signaled: true,
        op: SendOp::RdmaWriteInline {
            data,
            remote: remote(&tmr, at),
        },
    };
    let list = [
        marked(300, b"first", 3200),
        marked(301, b"second", 3208),
        SendWr {
            wr_id: 302,
            signaled: true,
            op: SendOp::RdmaWriteInline {
                data: &too_long,
                remote: remote(&tmr, 3216),
            },
        },
        marked(303, b"fourth", 3256),
    ];
    let refused = qp_a.post_send_list(&list).unwrap_err();
    assert_eq!(refused.posted, 2, "{refused:?}");
    assert!(
        matches!(refused.error, PostError::Invalid(ref e) if e.class() == ErrorClass::Arg),
        "{refused:?}"
    );
    let wcs = wait(&cq_a, 2);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(300, WcStatus::Success), (301, WcStatus::Success)]
    );
    let landed = target.bytes();
    assert_eq!(&landed[3200..3214], b"first\0\0\0second");
    assert!(landed[3216..3264].iter().all(|&b| b == 0));

    // A wrong rkey.
    let before = target.bytes();
    let wrong = RemoteAddr {
        rkey: tmr.rkey() ^ 0x80,
        ..remote(&tmr, 0)
    };
    post(
        &qp_a,
        7,
        SendOp::RdmaWriteInline {
            data: b"denied",
            remote: wrong,
        },
    );
    post(
        &qp_a,
        8,
        SendOp::RdmaWriteInline {
            data: b"after",
            remote: remote(&tmr, 0),
        },
    );
    let wcs = wait(&cq_a, 2);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (7, WcStatus::RemAccessErr));
    assert_eq!((wcs[1].wr_id, wcs[1].status), (8, WcStatus::WrFlushErr));
    assert_eq!(target.bytes(), before);
    drop((qp_a, qp_b));
}

/// Whether `fd` becomes readable within `ms` milliseconds.
fn readable(fd: std::os::fd::RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, for the duration of the call.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    n == 1 && p.revents & libc::POLLIN != 0
}

/// Readies a UD queue pair on `nic_a` and one on `nic_b` and checks: a
/// datagram lands after the GRH, whose source GID is `nic_a`'s port's, with
/// `byte_len` counting the GRH; a datagram with the wrong Q_Key, and one
/// that finds no receive posted, are lost while their sends succeed; and
/// the next good datagram still lands. On the way, `nic_b`'s completion
/// queue has a channel: armed, its first completion makes the channel
/// readable once, until drained; unarmed, completions raise nothing.
pub fn ud_semantics<N: Nic>(nic_a: &N, nic_b: &N) {
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_inline_data: 0,
    };
    let (pd_a, pd_b) = (nic_a.alloc_pd().unwrap(), nic_b.alloc_pd().unwrap());
    let channel = nic_b.create_comp_channel().unwrap();
    let cq_a = nic_a.create_cq(64, None).unwrap();
    let cq_b = nic_b.create_cq(64, Some(&channel)).unwrap();
    assert!(
        cq_a.req_notify().is_err(),
        "armed a queue without a channel"
    );
    let make = |nic: &N, pd, cq| {
        nic.create_ud(
            pd,
            &QpInit {
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                caps,
            },
        )
        .unwrap()
    };
    let ud_a = make(nic_a, &pd_a, &cq_a);
    let ud_b = make(nic_b, &pd_b, &cq_b);
    let qkey = 0x0bad_cafe;
    for (nic, ud) in [(nic_a, &ud_a), (nic_b, &ud_b)] {
        ud.ready(&UdAttr {
            port: nic.port().port,
            pkey_index: 0,
            qkey,
            sq_psn: 1,
        })
        .unwrap();
        assert_eq!(ud.state(), QpState::Rts);
    }
    let port_b = nic_b.port();
    let ah = nic_a
        .create_ah(
            &pd_a,
            &AhAttr {
                gid: port_b.gid.gid,
                lid: port_b.lid,
            },
        )
        .unwrap();
    let out = Memory::new(256);
    let inbox = Memory::new(1024);
    let omr = register(nic_a, &pd_a, &out, AccessFlags::NONE);
    let imr = register(nic_b, &pd_b, &inbox, AccessFlags::LOCAL_WRITE);
    let send = |wr_id, payload: &[u8], remote_qkey| {
        out.fill(payload);
        ud_a.post_send(&UdSendWr {
            wr_id,
            signaled: true,
            sge: sge(&omr, &out, 0, payload.len() as u32),
            ah: &ah,
            remote_qpn: ud_b.qp_num(),
            remote_qkey,
        })
        .unwrap();
        let wc = wait(&cq_a, 1)[0];
        assert_eq!((wc.wr_id, wc.status), (wr_id, WcStatus::Success));
    };
    let post_recv = |wr_id, offset| {
        ud_b.post_recv(&RecvWr {
            wr_id,
            sge: sge(&imr, &inbox, offset, 512),
        })
        .unwrap();
    };
    let no_more = |cq: &N::Cq| {
        // Long enough for a datagram to cross one host or fabric.
        std::thread::sleep(Duration::from_millis(200));
        let mut late = Vec::new();
        cq.poll(4, &mut late).unwrap();
        assert!(late.is_empty(), "unexpected completions: {late:?}");
    };

    post_recv(20, 0);
    cq_b.req_notify().unwrap();
    assert!(!readable(channel.fd(), 0));
    send(1, b"ud datagram", qkey);
    assert!(
        readable(channel.fd(), 10_000),
        "no event for an armed queue"
    );
    assert_eq!(channel.drain().unwrap(), 1);
    assert!(!readable(channel.fd(), 0));
    let got = wait(&cq_b, 1)[0];
    assert_eq!(
        (got.wr_id, got.status, got.opcode, got.byte_len),
        (20, WcStatus::Success, WcOpcode::Recv, (GRH_LEN + 11) as u32)
    );
    let bytes = inbox.bytes();
    assert_eq!(&bytes[GRH_LEN..GRH_LEN + 11], b"ud datagram");
    // The GRH's source GID (bytes 8..24) names the sender's port.
    assert_eq!(&bytes[8..24], &nic_a.port().gid.gid.0);

    // Lost: the wrong Q_Key; then no receive posted.
    post_recv(21, 512);
    send(2, b"wrong key", qkey ^ 1);
    no_more(&cq_b);
    send(3, b"hello", qkey);
    let got = wait(&cq_b, 1)[0];
    assert_eq!((got.wr_id, got.status), (21, WcStatus::Success));
    // Not armed since its event: no other.
    assert!(!readable(channel.fd(), 0));
    send(4, b"nobody listens", qkey);
    no_more(&cq_b);
    post_recv(22, 0);
    send(5, b"again", qkey);
    let got = wait(&cq_b, 1)[0];
    assert_eq!((got.wr_id, got.byte_len), (22, (GRH_LEN + 5) as u32));
    assert_eq!(&inbox.bytes()[GRH_LEN..GRH_LEN + 5], b"again");
}
