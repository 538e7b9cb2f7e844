//! The PMI-1 client over `PMI_PORT`: a process that connects to the
//! process manager over TCP and names itself with `PMI_ID`, as MPICH's
//! simple PMI allows (oxrun and hydra pass `PMI_FD` instead, which the
//! launcher tests cover).
//!
//! A small PMI-1 server runs in threads of the test on 127.0.0.1: it speaks
//! the simple PMI wire protocol (`initack` with `set size/rank/debug`,
//! `init`, `get_maxes`, `get_appnum`, `get_my_kvsname`, `put`, `get`,
//! `barrier_in`, `finalize`) with a shared key-value space and barrier,
//! and records every line each client sent. The tests drive the client
//! through its public API, [`Pmi::connect`] with a [`PmiSource::Port`], and
//! once through [`Pmi::from_env`] in a child process with `PMI_PORT` and
//! `PMI_ID` set, then check both what the client learnt and the exact
//! conversation on the wire. Every blocking step has a deadline.

use oxmpi_adi::pmi::{Identity, Message, Pmi, PmiSource};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Longest any wait may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(10);
/// The key-value space the server names.
const KVSNAME: &str = "kvs_port_test";

/// What the server answers `initack pmiid=<id>` with.
#[derive(Clone, Copy)]
struct Assignment {
    size: usize,
    rank: usize,
}

/// The job's state, shared by the server's connection threads.
struct Job {
    size: usize,
    /// The rank each PMI_ID gets.
    ranks: HashMap<String, Assignment>,
    kvs: Mutex<HashMap<String, String>>,
    /// Processes in the barrier now, and how many barriers completed.
    barrier: Mutex<(usize, u64)>,
    barrier_done: Condvar,
}

/// A PMI-1 server on 127.0.0.1 that serves `connections` clients.
struct Server {
    addr: String,
    /// Per connection, in accept order: the messages the client sent.
    threads: JoinHandle<Vec<Vec<Message>>>,
}

impl Server {
    /// Serves a job of `size` where the client with PMI_ID `ids[r]` is
    /// told rank `ranks[r]` (so a test can give ranks the ids do not hint).
    fn start(size: usize, ids: &[(&str, Assignment)], connections: usize) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the PMI server");
        let addr = listener.local_addr().expect("server address").to_string();
        let job = Arc::new(Job {
            size,
            ranks: ids.iter().map(|(id, a)| ((*id).to_owned(), *a)).collect(),
            kvs: Mutex::new(HashMap::new()),
            barrier: Mutex::new((0, 0)),
            barrier_done: Condvar::new(),
        });
        let threads = std::thread::spawn(move || {
            listener
                .set_nonblocking(true)
                .expect("non-blocking listener");
            let deadline = Instant::now() + DEADLINE;
            let mut served = Vec::new();
            while served.len() < connections {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let job = Arc::clone(&job);
                        served.push(std::thread::spawn(move || serve(&job, stream)));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        assert!(
                            Instant::now() < deadline,
                            "the PMI server got {} of {connections} connections in {DEADLINE:?}",
                            served.len()
                        );
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(e) => panic!("accept: {e}"),
                }
            }
            served
                .into_iter()
                .map(|t| t.join().expect("a PMI server thread panicked"))
                .collect()
        });
        Server { addr, threads }
    }

    /// Waits for every connection to end; their transcripts.
    fn transcripts(self) -> Vec<Vec<Message>> {
        self.threads.join().expect("the PMI server panicked")
    }
}

/// What a PMI_PORT client says before the application's first call.
const STARTUP: [&str; 5] = [
    "initack",
    "init",
    "get_maxes",
    "get_appnum",
    "get_my_kvsname",
];

/// The commands of a transcript, in order.
fn commands(transcript: &[Message]) -> Vec<&str> {
    transcript.iter().map(|m| m.cmd.as_str()).collect()
}

/// Serves one client until it finalizes or closes; returns what it sent.
fn serve(job: &Job, stream: TcpStream) -> Vec<Message> {
    // A client that stops talking ends the connection (and so the test)
    // instead of hanging it.
    stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let mut writer = stream.try_clone().expect("clone");
    let mut reader = BufReader::new(stream);
    let mut sent = Vec::new();
    let mut reply = |m: Message| {
        writer
            .write_all(m.format().as_bytes())
            .expect("write to the client");
    };
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) => return sent,
            Ok(_) => {}
            Err(e) => panic!("reading from the client: {e}"),
        }
        let m = Message::parse(line.as_bytes()).expect("a well-formed PMI line");
        sent.push(m.clone());
        let ok = |cmd: &str| Message::new(cmd, &[("rc", "0"), ("msg", "success")]);
        match m.cmd.as_str() {
            "initack" => {
                let id = m.get("pmiid").expect("initack names its pmiid");
                let a = job.ranks[id];
                reply(Message::new("initack", &[]));
                reply(Message::new("set", &[("size", &a.size.to_string())]));
                reply(Message::new("set", &[("rank", &a.rank.to_string())]));
                reply(Message::new("set", &[("debug", "0")]));
            }
            "init" => reply(Message::new(
                "response_to_init",
                &[("pmi_version", "1"), ("pmi_subversion", "1"), ("rc", "0")],
            )),
            "get_maxes" => reply(Message::new(
                "maxes",
                &[
                    ("kvsname_max", "256"),
                    ("keylen_max", "64"),
                    ("vallen_max", "960"),
                ],
            )),
            "get_appnum" => reply(Message::new("appnum", &[("appnum", "0")])),
            "get_my_kvsname" => reply(Message::new("my_kvsname", &[("kvsname", KVSNAME)])),
            "put" => {
                assert_eq!(m.get("kvsname"), Some(KVSNAME));
                let (k, v) = (m.get("key").unwrap(), m.get("value").unwrap());
                job.kvs.lock().unwrap().insert(k.to_owned(), v.to_owned());
                reply(ok("put_result"));
            }
            "get" => {
                assert_eq!(m.get("kvsname"), Some(KVSNAME));
                let value = job.kvs.lock().unwrap().get(m.get("key").unwrap()).cloned();
                reply(match value {
                    Some(v) => Message::new(
                        "get_result",
                        &[("rc", "0"), ("msg", "success"), ("value", &v)],
                    ),
                    None => Message::new("get_result", &[("rc", "-1"), ("msg", "key_not_found")]),
                });
            }
            "barrier_in" => {
                let mut b = job.barrier.lock().unwrap();
                let generation = b.1;
                b.0 += 1;
                if b.0 == job.size {
                    *b = (0, generation + 1);
                    job.barrier_done.notify_all();
                } else {
                    let deadline = Instant::now() + DEADLINE;
                    while b.1 == generation {
                        let left = deadline.saturating_duration_since(Instant::now());
                        assert!(!left.is_zero(), "the barrier did not fill in {DEADLINE:?}");
                        b = job.barrier_done.wait_timeout(b, left).unwrap().0;
                    }
                }
                drop(b);
                reply(Message::new("barrier_out", &[]));
            }
            "finalize" => {
                reply(Message::new("finalize_ack", &[]));
                return sent;
            }
            other => panic!("the client sent an unexpected cmd={other}"),
        }
    }
}

/// Runs `f` on a thread and waits at most [`DEADLINE`] for it.
fn within_deadline<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(DEADLINE) {
        Ok(v) => v,
        // It ended without an answer: it panicked; show why.
        Err(RecvTimeoutError::Disconnected) => match thread.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("the thread ended without sending"),
        },
        // Still running: leave it (joining would hang the test too).
        Err(RecvTimeoutError::Timeout) => panic!("{what} did not finish in {DEADLINE:?}"),
    }
}

/// The conversation a client of rank `rank` in a 2-rank job has: the PMI_PORT
/// start-up, its card published, a barrier, the other card read, a key
/// that is absent, finalize.
fn expected_conversation(id: &str, rank: usize) -> Vec<Message> {
    let other = 1 - rank;
    let key = format!("card-{rank}");
    let value = format!("host{rank}:{}", 4000 + rank);
    let other_key = format!("card-{other}");
    vec![
        Message::new("initack", &[("pmiid", id)]),
        Message::new("init", &[("pmi_version", "1"), ("pmi_subversion", "1")]),
        Message::new("get_maxes", &[]),
        Message::new("get_appnum", &[]),
        Message::new("get_my_kvsname", &[]),
        Message::new(
            "put",
            &[("kvsname", KVSNAME), ("key", &key), ("value", &value)],
        ),
        Message::new("barrier_in", &[]),
        Message::new("get", &[("kvsname", KVSNAME), ("key", &other_key)]),
        Message::new("get", &[("kvsname", KVSNAME), ("key", "absent")]),
        Message::new("finalize", &[]),
    ]
}

/// What one rank does with its client; returns (rank, size, the other
/// rank's card).
fn run_rank(mut pmi: Pmi) -> (usize, usize, Option<String>) {
    assert!(!pmi.is_singleton());
    assert_eq!(pmi.kvsname(), KVSNAME);
    assert_eq!(pmi.appnum(), 0);
    let (rank, size) = (pmi.rank(), pmi.size());
    pmi.put(
        &format!("card-{rank}"),
        &format!("host{rank}:{}", 4000 + rank),
    )
    .expect("put");
    pmi.barrier().expect("barrier");
    let other = pmi.get(&format!("card-{}", 1 - rank)).expect("get");
    assert_eq!(pmi.get("absent").expect("get of an absent key"), None);
    pmi.finalize().expect("finalize");
    (rank, size, other)
}

#[test]
fn two_ranks_start_exchange_cards_and_finalize_over_pmi_port() {
    // The ids do not hint at the ranks: the client must take its rank from
    // the server's `set rank=`.
    let ids = [
        ("17", Assignment { size: 2, rank: 1 }),
        ("4", Assignment { size: 2, rank: 0 }),
    ];
    let server = Server::start(2, &ids, 2);
    let clients: Vec<JoinHandle<(usize, usize, Option<String>)>> = ids
        .iter()
        .map(|(id, _)| {
            let source = PmiSource::Port {
                addr: server.addr.clone(),
                identity: Identity::Id((*id).to_owned()),
            };
            std::thread::spawn(move || run_rank(Pmi::connect(source).expect("connect")))
        })
        .collect();
    let results = within_deadline("the two clients", move || {
        clients
            .into_iter()
            .map(|c| c.join().expect("a client panicked"))
            .collect::<Vec<_>>()
    });
    assert_eq!(results[0], (1, 2, Some("host0:4000".to_owned())), "id 17");
    assert_eq!(results[1], (0, 2, Some("host1:4001".to_owned())), "id 4");

    // Accept order is not fixed: find each client by the id it gave.
    let transcripts = server.transcripts();
    for (id, a) in ids {
        let t = transcripts
            .iter()
            .find(|t| t.first().and_then(|m| m.get("pmiid")) == Some(id))
            .unwrap_or_else(|| panic!("no conversation starts with pmiid={id}"));
        assert_eq!(*t, expected_conversation(id, a.rank), "pmiid={id}");
    }
}

#[test]
fn a_rank_outside_the_job_is_refused() {
    let ids = [("1", Assignment { size: 2, rank: 2 })];
    let server = Server::start(2, &ids, 1);
    let source = PmiSource::Port {
        addr: server.addr.clone(),
        identity: Identity::Id("1".to_owned()),
    };
    let result = within_deadline("connect", move || Pmi::connect(source).map(|_| ()));
    let error = result.expect_err("rank 2 of 2 was accepted");
    assert!(
        error.message().contains("rank 2 in a job of 2"),
        "unexpected error: {error}"
    );
    // The client went as far as asking for the key-value space's name.
    let transcripts = server.transcripts();
    assert_eq!(commands(&transcripts[0]), &STARTUP);
}

#[test]
fn a_server_that_hangs_up_is_an_error_not_a_hang() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().unwrap().to_string();
    let server = std::thread::spawn(move || {
        let (stream, _) = listener.accept().expect("accept");
        stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
        let mut line = String::new();
        BufReader::new(&stream).read_line(&mut line).expect("read");
        // Read the initack, answer nothing, hang up.
        line
    });
    let source = PmiSource::Port {
        addr,
        identity: Identity::Id("0".to_owned()),
    };
    let result = within_deadline("connect", move || Pmi::connect(source).map(|_| ()));
    let error = result.expect_err("a server that hung up was accepted");
    assert!(
        error.message().contains("closed the PMI connection"),
        "unexpected error: {error}"
    );
    assert_eq!(server.join().unwrap(), "cmd=initack pmiid=0\n");
}

#[test]
fn nobody_listening_on_pmi_port_is_an_error() {
    // A port that was just free: bind, note it, close.
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().unwrap().to_string()
    };
    let source = PmiSource::Port {
        addr: addr.clone(),
        identity: Identity::Id("0".to_owned()),
    };
    let error = within_deadline("connect", move || Pmi::connect(source).map(|_| ()))
        .expect_err("connected to nothing");
    assert!(error.message().contains(&addr), "unexpected error: {error}");
}

/// Set in the child process that [`from_env_reads_pmi_port_and_pmi_id`]
/// starts: the child runs [`child_from_env`] for real.
const CHILD_ENV: &str = "OXMPI_TEST_PMI_PORT_CHILD";

#[test]
fn from_env_reads_pmi_port_and_pmi_id() {
    let ids = [("9", Assignment { size: 1, rank: 0 })];
    let server = Server::start(1, &ids, 1);
    let exe = std::env::current_exe().expect("the test binary");
    let mut child = std::process::Command::new(exe)
        .args([
            "--exact",
            "child_from_env",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .env("PMI_PORT", &server.addr)
        .env("PMI_ID", "9")
        .env_remove("PMI_FD")
        .env_remove("PMI_RANK")
        .env_remove("PMI_SIZE")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the child");
    let deadline = Instant::now() + DEADLINE;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child did not finish in {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().expect("child output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "the child failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let transcripts = server.transcripts();
    let cmds = commands(&transcripts[0]);
    assert_eq!(cmds[..STARTUP.len()], STARTUP);
    assert_eq!(
        cmds[STARTUP.len()..],
        ["put", "barrier_in", "get", "finalize"]
    );
    assert_eq!(transcripts[0][0].get("pmiid"), Some("9"));
}

/// The child half of [`from_env_reads_pmi_port_and_pmi_id`]; does nothing
/// in an ordinary run.
#[test]
fn child_from_env() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let mut pmi = Pmi::from_env().expect("from_env with PMI_PORT and PMI_ID");
    assert!(!pmi.is_singleton());
    assert_eq!((pmi.rank(), pmi.size()), (0, 1));
    assert_eq!(pmi.kvsname(), KVSNAME);
    pmi.put("k", "v").expect("put");
    pmi.barrier().expect("barrier");
    assert_eq!(pmi.get("k").expect("get").as_deref(), Some("v"));
    pmi.finalize().expect("finalize");
}
