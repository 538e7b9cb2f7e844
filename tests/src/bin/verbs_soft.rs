//! The soft verbs provider between two processes of a job, started by the
//! harness through oxrun: `verbs_soft`.
//!
//! Each rank opens a soft NIC, registers a window (and a counter word)
//! for remote access, and publishes its queue pair's business card, with
//! the window's address and rkey, in the job's key-value space (PMI); after
//! a barrier each connects its queue pair to the other's. Then, both ranks
//! at once, each:
//! - SENDs a message into a receive the other posted;
//! - RDMA-WRITEs a pattern of its own into the other's window and reads
//!   it back with RDMA READ;
//! - adds 1 to the other's counter with fetch-and-add, and then with
//!   compare-and-swap loops, [`OPS`] times each, every fetched value
//!   checked.
//!
//! After a barrier each rank checks what landed in its own memory (the
//! other's pattern, and a counter of exactly 2 × [`OPS`]); then
//! rank 0 writes with a wrong rkey and expects REM_ACCESS_ERR, and rank 1
//! sees its queue pair go to the error state. On a failure the rank says
//! why and aborts the job.

use oxmpi::{Error, Result};
use oxmpi_adi::pmi::Pmi;
use oxmpi_jobs::checks::{ensure, fail, same};
use oxmpi_verbs::provider::{
    connect_rc, AccessFlags, CompletionQueue, ConnectParams, MemoryRegion, Nic, QpAddress, QpCaps,
    QpInit, QpState, QueuePair, RecvWr, RemoteAddr, SendOp, SendWr, Sge, WcOpcode, WcStatus,
    WorkCompletion,
};
use oxmpi_verbs::soft::{SoftCq, SoftNic, SoftQp};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Atomics of each kind each rank does on the other's counter.
const OPS: u64 = 200;
/// Bytes of each rank's window.
const WINDOW: usize = 64 * 1024;

fn main() -> ExitCode {
    let mut pmi = match Pmi::from_env() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("verbs_soft: no PMI: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(&mut pmi) {
        Ok(()) => {
            let _ = pmi.finalize();
            ExitCode::SUCCESS
        }
        Err(e) => {
            let message = format!("rank {}: {e}", pmi.rank());
            eprintln!("verbs_soft: {message}");
            let _ = pmi.abort(1, &message);
            ExitCode::FAILURE
        }
    }
}

/// Memory the NIC may write at any time (interior mutability).
struct Memory(Vec<AtomicU64>);

impl Memory {
    fn new(bytes: usize) -> Memory {
        Memory((0..bytes.div_ceil(8)).map(|_| AtomicU64::new(0)).collect())
    }
    fn addr(&self) -> u64 {
        self.0.as_ptr() as u64
    }
    fn len(&self) -> usize {
        self.0.len() * 8
    }
    fn bytes(&self) -> Vec<u8> {
        self.0
            .iter()
            .flat_map(|w| w.load(Ordering::SeqCst).to_ne_bytes())
            .collect()
    }
    fn fill(&self, data: &[u8]) {
        for (w, chunk) in self.0.iter().zip(data.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            w.store(u64::from_ne_bytes(b), Ordering::SeqCst);
        }
    }
    fn word(&self, i: usize) -> u64 {
        self.0[i].load(Ordering::SeqCst)
    }
}

fn pattern(rank: usize) -> Vec<u8> {
    (0..WINDOW)
        .map(|i| (i * 31 + rank * 101 + 7) as u8)
        .collect()
}

/// Polls `cq` for one completion, for at most 20 s.
fn wait_one(cq: &SoftCq) -> Result<WorkCompletion> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut out = Vec::new();
    while out.is_empty() {
        cq.poll(1, &mut out)?;
        ensure(Instant::now() < deadline, || {
            "no completion after 20 s".to_string()
        })?;
        std::thread::yield_now();
    }
    Ok(out[0])
}

fn expect(wc: WorkCompletion, opcode: WcOpcode, what: &str) -> Result<()> {
    ensure(
        wc.status == WcStatus::Success && wc.opcode == opcode,
        || format!("{what}: completion {wc:?}"),
    )
}

fn post(qp: &SoftQp, op: SendOp<'_>) -> Result<()> {
    qp.post_send(&SendWr {
        wr_id: 0,
        signaled: true,
        op,
    })
    .map_err(Error::from)
}

fn run(pmi: &mut Pmi) -> Result<()> {
    let (rank, size) = (pmi.rank(), pmi.size());
    ensure(size == 2, || format!("run with 2 ranks, not {size}"))?;
    let peer = 1 - rank;
    let nic = SoftNic::open()?;
    let pd = nic.alloc_pd()?;
    let cq = nic.create_cq(64, None)?;
    let qp = nic.create_qp(
        &pd,
        &QpInit {
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            caps: QpCaps {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_inline_data: 64,
            },
        },
    )?;
    let window = Memory::new(WINDOW);
    let counter = Memory::new(8);
    let local = Memory::new(WINDOW);
    let remote_access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    // SAFETY: the three memories outlive their registrations (declared
    // before them), are interior-mutable, and are only read through
    // atomics while peers may write them.
    let (wmr, cmr, lmr) = unsafe {
        (
            nic.register(&pd, window.addr() as *mut u8, window.len(), remote_access)?,
            nic.register(&pd, counter.addr() as *mut u8, counter.len(), remote_access)?,
            nic.register(
                &pd,
                local.addr() as *mut u8,
                local.len(),
                AccessFlags::LOCAL_WRITE,
            )?,
        )
    };
    let card = format!(
        "{},{},{},{},{}",
        qp.address().to_card(),
        wmr.addr(),
        wmr.rkey(),
        cmr.addr(),
        cmr.rkey()
    );
    pmi.put(&format!("verbs-soft-{rank}"), &card)?;
    pmi.barrier()?;
    let peer_card = pmi
        .get(&format!("verbs-soft-{peer}"))?
        .ok_or_else(|| fail(format!("rank {peer} published no card")))?;
    let fields: Vec<&str> = peer_card.split(',').collect();
    let [address, waddr, wkey, caddr, ckey] = fields[..] else {
        return Err(fail(format!("malformed card {peer_card:?}")));
    };
    let number = |s: &str| {
        s.parse::<u64>()
            .map_err(|_| fail(format!("malformed card {peer_card:?}")))
    };
    let peer_window = RemoteAddr {
        addr: number(waddr)?,
        rkey: number(wkey)? as u32,
    };
    let peer_counter = RemoteAddr {
        addr: number(caddr)?,
        rkey: number(ckey)? as u32,
    };
    connect_rc(
        &nic,
        &qp,
        &QpAddress::from_card(address)?,
        &ConnectParams::default(),
    )?;
    let sge = |mem: &Memory, length: u32| Sge {
        addr: mem.addr(),
        length,
        lkey: lmr.lkey(),
    };

    // SEND / RECV.
    qp.post_recv(&RecvWr {
        wr_id: 1,
        sge: sge(&local, 64),
    })?;
    pmi.barrier()?;
    let hello = format!("hello from rank {rank}");
    post(&qp, SendOp::SendInline(hello.as_bytes()))?;
    let (mut sent, mut received) = (false, None);
    while !sent || received.is_none() {
        let wc = wait_one(&cq)?;
        match wc.opcode {
            WcOpcode::Recv => received = Some(wc),
            _ => sent = true,
        }
        ensure(wc.status == WcStatus::Success, || {
            format!("SEND/RECV: {wc:?}")
        })?;
    }
    let expected = format!("hello from rank {peer}");
    let got = received.map_or(0, |wc| wc.byte_len as usize);
    same(
        &local.bytes()[..got],
        expected.as_bytes(),
        "received message",
    )?;

    // RDMA WRITE of this rank's pattern, then READ back.
    local.fill(&pattern(rank));
    post(
        &qp,
        SendOp::RdmaWrite {
            local: sge(&local, WINDOW as u32),
            remote: peer_window,
        },
    )?;
    expect(wait_one(&cq)?, WcOpcode::RdmaWrite, "RDMA WRITE")?;
    local.fill(&vec![0; WINDOW]);
    post(
        &qp,
        SendOp::RdmaRead {
            local: sge(&local, WINDOW as u32),
            remote: peer_window,
        },
    )?;
    expect(wait_one(&cq)?, WcOpcode::RdmaRead, "RDMA READ")?;
    same(&local.bytes()[..WINDOW], &pattern(rank), "data read back")?;

    // Atomics on the peer's counter, by both ranks at once.
    let result = Sge {
        addr: local.addr(),
        length: 8,
        lkey: lmr.lkey(),
    };
    for i in 0..OPS {
        post(
            &qp,
            SendOp::FetchAdd {
                local: result,
                remote: peer_counter,
                add: 1,
            },
        )?;
        expect(wait_one(&cq)?, WcOpcode::FetchAdd, "fetch-and-add")?;
        ensure(local.word(0) == i, || {
            format!("fetch-and-add {i} fetched {}", local.word(0))
        })?;
    }
    let (mut swaps, mut guess) = (0, 0u64);
    while swaps < OPS {
        post(
            &qp,
            SendOp::CompareSwap {
                local: result,
                remote: peer_counter,
                compare: guess,
                swap: guess + 1,
            },
        )?;
        expect(wait_one(&cq)?, WcOpcode::CompareSwap, "compare-and-swap")?;
        let original = local.word(0);
        if original == guess {
            swaps += 1;
        }
        guess = if original == guess {
            guess + 1
        } else {
            original
        };
    }
    pmi.barrier()?;
    same(
        &window.bytes(),
        &pattern(peer),
        "window written by the peer",
    )?;
    ensure(counter.word(0) == 2 * OPS, || {
        format!("counter is {}, expected {}", counter.word(0), 2 * OPS)
    })?;
    pmi.barrier()?;

    // A wrong rkey: REM_ACCESS_ERR for rank 0, the error state on both.
    if rank == 0 {
        let wrong = RemoteAddr {
            rkey: peer_window.rkey ^ 1,
            ..peer_window
        };
        post(
            &qp,
            SendOp::RdmaWriteInline {
                data: b"denied",
                remote: wrong,
            },
        )?;
        let wc = wait_one(&cq)?;
        ensure(wc.status == WcStatus::RemAccessErr, || {
            format!("write with a wrong rkey: {wc:?}")
        })?;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while qp.state() != QpState::Error {
        ensure(Instant::now() < deadline, || {
            "the queue pair never went to the error state".to_string()
        })?;
        std::thread::sleep(Duration::from_millis(1));
    }
    ensure(window.bytes()[..6] != *b"denied", || {
        "a write with a wrong rkey landed".to_string()
    })?;
    // Nothing may touch this rank's memory once both ranks are here.
    pmi.barrier()?;
    drop((wmr, cmr, lmr));
    Ok(())
}
