//! The PMI-1 "simple PMI" wire protocol: its line format (shared by this
//! crate's client and oxrun's server) and the client ranks use to reach
//! the process manager's key-value space (the seeds' "BNR").
//!
//! A message is one line of `key=value` words separated by spaces, the
//! first being `cmd=...` (`cmd=put kvsname=kvs_1 key=card-0 value=...`).
//! Values may not contain spaces or `=`; lines are at most
//! [`MAX_LINE`] bytes. The client reaches the server over the socket named
//! by `PMI_FD` (inherited from the launcher, as oxrun and MPICH's hydra do),
//! or `PMI_PORT` (host:port) with `PMI_ID`. With neither, the process is a
//! singleton: a 1-rank job whose key-value space is private.
//! [`PmiSource::from_env`] reads those variables; [`Pmi::connect`] takes a
//! [`PmiSource`] built any other way (tests, embedders).

use crate::error::{Error, ErrorClass, Result};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Longest line either side may send, in bytes (MPICH's PMIU_MAXLINE).
pub const MAX_LINE: usize = 1024;

/// One parsed PMI-1 message: the command and its arguments in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The value of `cmd=`.
    pub cmd: String,
    /// The other `key=value` words, in order.
    pub args: Vec<(String, String)>,
}

impl Message {
    /// A message with `cmd` and `args`.
    pub fn new(cmd: &str, args: &[(&str, &str)]) -> Message {
        Message {
            cmd: cmd.to_owned(),
            args: args
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    /// Parses one line (without or with its trailing newline).
    pub fn parse(line: &[u8]) -> Result<Message> {
        let bad = |why: &str| {
            let shown = String::from_utf8_lossy(&line[..line.len().min(80)]).into_owned();
            Error::new(
                ErrorClass::Other,
                format!("malformed PMI line ({why}): {shown:?}"),
            )
        };
        if line.len() > MAX_LINE {
            return Err(bad("longer than 1024 bytes"));
        }
        let text = std::str::from_utf8(line).map_err(|_| bad("not UTF-8"))?;
        let text = text.strip_suffix('\n').unwrap_or(text);
        let mut words = text.split(' ').filter(|w| !w.is_empty());
        let cmd = match words.next().and_then(|w| w.strip_prefix("cmd=")) {
            Some(c) if !c.is_empty() => c.to_owned(),
            _ => return Err(bad("does not start with cmd=")),
        };
        let mut args: Vec<(String, String)> = Vec::new();
        for word in words {
            let (k, v) = word
                .split_once('=')
                .ok_or_else(|| bad("a word without '='"))?;
            if k.is_empty() {
                return Err(bad("an empty key"));
            }
            if k == "cmd" || args.iter().any(|(seen, _)| seen == k) {
                return Err(bad("a repeated key"));
            }
            args.push((k.to_owned(), v.to_owned()));
        }
        Ok(Message { cmd, args })
    }

    /// The line for this message, newline included.
    pub fn format(&self) -> String {
        let mut line = format!("cmd={}", self.cmd);
        for (k, v) in &self.args {
            line.push(' ');
            line.push_str(k);
            line.push('=');
            line.push_str(v);
        }
        line.push('\n');
        line
    }

    /// The value of argument `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.args
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The value of argument `key`, or an error naming the message.
    pub fn require(&self, key: &str) -> Result<&str> {
        self.get(key).ok_or_else(|| {
            Error::new(
                ErrorClass::Other,
                format!("PMI message cmd={} lacks {key}=", self.cmd),
            )
        })
    }
}

/// Checks that `value` can travel as a PMI word.
pub fn check_word(what: &str, value: &str, max: usize) -> Result<()> {
    if value.is_empty() || value.len() > max || value.contains([' ', '=', '\n']) {
        return Err(Error::new(
            ErrorClass::Arg,
            format!("PMI {what} {value:?} must be 1 to {max} characters without spaces or '='"),
        ));
    }
    Ok(())
}

/// Where the process manager is and how this process learns its rank: what
/// the launcher's environment says ([`PmiSource::from_env`]), or built
/// directly and handed to [`Pmi::connect`].
#[derive(Debug)]
pub enum PmiSource {
    /// No process manager: a 1-rank job with a private key-value space.
    Singleton,
    /// A socket to the server inherited from the launcher (`PMI_FD`).
    Fd {
        /// The connected socket; the client owns it from now on.
        socket: OwnedFd,
        /// How the rank and size are learnt.
        identity: Identity,
    },
    /// A server to connect to over TCP (`PMI_PORT`).
    Port {
        /// The server's `host:port`.
        addr: String,
        /// How the rank and size are learnt.
        identity: Identity,
    },
}

/// How a process connected to a PMI server learns its rank and the size of
/// the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// `PMI_ID`: the process names itself with this id in an `initack`
    /// exchange, and the server answers with the size and rank.
    Id(String),
    /// `PMI_RANK` and `PMI_SIZE`: the launcher said them.
    Given {
        /// This process's rank.
        rank: usize,
        /// Number of processes in the job.
        size: usize,
    },
}

impl PmiSource {
    /// The source the environment names; see the module docs. Only checks
    /// the variables (and that `PMI_FD` is open): connecting is
    /// [`Pmi::connect`]'s.
    pub fn from_env() -> Result<PmiSource> {
        Ok(if let Some(fd) = env_number("PMI_FD")? {
            PmiSource::Fd {
                socket: inherited_socket(fd)?,
                identity: Identity::from_env("PMI_FD")?,
            }
        } else if let Ok(addr) = std::env::var("PMI_PORT") {
            PmiSource::Port {
                addr,
                identity: Identity::from_env("PMI_PORT")?,
            }
        } else {
            PmiSource::Singleton
        })
    }
}

impl Identity {
    /// `PMI_ID`, else `PMI_RANK` and `PMI_SIZE`; `via` names the variable
    /// that said where the server is, for the error.
    fn from_env(via: &str) -> Result<Identity> {
        if let Ok(id) = std::env::var("PMI_ID") {
            return Ok(Identity::Id(id));
        }
        let missing = |name: &str| {
            Error::new(
                ErrorClass::Other,
                format!("{via} is set but neither PMI_ID nor {name} is"),
            )
        };
        Ok(Identity::Given {
            rank: env_number("PMI_RANK")?.ok_or_else(|| missing("PMI_RANK"))?,
            size: env_number("PMI_SIZE")?.ok_or_else(|| missing("PMI_SIZE"))?,
        })
    }
}

/// Takes over descriptor `fd` (from `PMI_FD`), checking that it is open.
fn inherited_socket(fd: usize) -> Result<OwnedFd> {
    let fd =
        i32::try_from(fd).map_err(|_| Error::new(ErrorClass::Arg, "PMI_FD is out of range"))?;
    // SAFETY: fcntl(F_GETFD) only queries the descriptor; it fails cleanly
    // if `fd` is not open.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(Error::new(
            ErrorClass::Other,
            format!("PMI_FD={fd} is not an open descriptor: was this started by a PMI-1 launcher?"),
        ));
    }
    // SAFETY: the launcher handed this process `fd` (open, checked above),
    // a socket to the PMI server, for its exclusive use; nothing else here
    // owns or closes it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The line-oriented connection to the server, over a socket of either
/// family (read and written as a plain descriptor).
struct Connection {
    reader: BufReader<File>,
    writer: File,
}

impl Connection {
    /// Takes over `socket`, connected to the server.
    fn new(socket: OwnedFd) -> Result<Connection> {
        // The descriptor must not leak into processes this rank starts.
        // SAFETY: F_SETFD on a descriptor `socket` owns.
        unsafe { libc::fcntl(socket.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
        let writer = socket
            .try_clone()
            .map_err(|e| Error::os("duplicating the PMI socket", e))?;
        Ok(Connection {
            reader: BufReader::new(File::from(socket)),
            writer: File::from(writer),
        })
    }

    fn send(&mut self, message: &Message) -> Result<()> {
        self.writer
            .write_all(message.format().as_bytes())
            .map_err(|e| Error::os("writing to the process manager (PMI)", e))
    }

    fn receive(&mut self, expected: &str) -> Result<Message> {
        let mut line = Vec::new();
        let n = std::io::Read::take(&mut self.reader, MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(|e| Error::os("reading from the process manager (PMI)", e))?;
        if n == 0 {
            return Err(Error::new(
                ErrorClass::Other,
                "the process manager closed the PMI connection (the job is ending?)",
            ));
        }
        let message = Message::parse(&line)?;
        if message.cmd != expected {
            return Err(Error::new(
                ErrorClass::Other,
                format!(
                    "PMI server answered cmd={} where cmd={expected} was due",
                    message.cmd
                ),
            ));
        }
        if let Some(rc) = message.get("rc") {
            if rc != "0" && expected != "get_result" {
                let msg = message.get("msg").unwrap_or("");
                return Err(Error::new(
                    ErrorClass::Other,
                    format!("PMI cmd={expected} failed with rc={rc} {msg}"),
                ));
            }
        }
        Ok(message)
    }

    fn call(&mut self, request: &Message, reply: &str) -> Result<Message> {
        self.send(request)?;
        self.receive(reply)
    }
}

/// A client of the process manager; see the module docs.
pub struct Pmi {
    rank: usize,
    size: usize,
    appnum: i32,
    kvsname: String,
    key_max: usize,
    value_max: usize,
    /// `None` for a singleton.
    connection: Option<Connection>,
    /// The singleton's key-value space.
    local: HashMap<String, String>,
}

fn env_number(name: &str) -> Result<Option<usize>> {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().map(Some).map_err(|_| {
            Error::new(
                ErrorClass::Arg,
                format!("{name}={v:?} is not a non-negative number"),
            )
        }),
        Err(_) => Ok(None),
    }
}

fn number(message: &Message, key: &str) -> Result<usize> {
    let v = message.require(key)?;
    v.parse().map_err(|_| {
        Error::new(
            ErrorClass::Other,
            format!("PMI cmd={} has {key}={v:?}, not a number", message.cmd),
        )
    })
}

impl Pmi {
    /// Connects to the process manager named by the environment; see the
    /// module docs.
    pub fn from_env() -> Result<Pmi> {
        Pmi::connect(PmiSource::from_env()?)
    }

    /// Connects to the process manager at `source` and runs PMI-1's
    /// initialization: the `initack` exchange when the identity is an id,
    /// then `init`, the limits, the application number and the name of the
    /// key-value space.
    pub fn connect(source: PmiSource) -> Result<Pmi> {
        let mut pmi = Pmi {
            rank: 0,
            size: 1,
            appnum: 0,
            kvsname: "singleton_kvs".to_owned(),
            key_max: 64,
            value_max: 1024,
            connection: None,
            local: HashMap::new(),
        };
        let (socket, identity) = match source {
            PmiSource::Singleton => return Ok(pmi),
            PmiSource::Fd { socket, identity } => (socket, identity),
            PmiSource::Port { addr, identity } => {
                let stream = std::net::TcpStream::connect(addr.as_str()).map_err(|e| {
                    Error::os(
                        format!("connecting to the PMI server at PMI_PORT={addr}"),
                        e,
                    )
                })?;
                (OwnedFd::from(stream), identity)
            }
        };
        let mut conn = Connection::new(socket)?;
        match identity {
            Identity::Id(id) => {
                // The PMI_PORT handshake: the server tells size and rank.
                conn.call(&Message::new("initack", &[("pmiid", &id)]), "initack")?;
                for _ in 0..3 {
                    let set = conn.receive("set")?;
                    if let Some(v) = set.get("size") {
                        pmi.size = v
                            .parse()
                            .map_err(|_| Error::new(ErrorClass::Other, "bad PMI size"))?;
                    } else if let Some(v) = set.get("rank") {
                        pmi.rank = v
                            .parse()
                            .map_err(|_| Error::new(ErrorClass::Other, "bad PMI rank"))?;
                    }
                }
            }
            Identity::Given { rank, size } => {
                pmi.rank = rank;
                pmi.size = size;
            }
        }
        conn.call(
            &Message::new("init", &[("pmi_version", "1"), ("pmi_subversion", "1")]),
            "response_to_init",
        )?;
        let maxes = conn.call(&Message::new("get_maxes", &[]), "maxes")?;
        pmi.key_max = number(&maxes, "keylen_max")?;
        pmi.value_max = number(&maxes, "vallen_max")?;
        let appnum = conn.call(&Message::new("get_appnum", &[]), "appnum")?;
        pmi.appnum = appnum.require("appnum")?.parse().unwrap_or(0);
        let kvs = conn.call(&Message::new("get_my_kvsname", &[]), "my_kvsname")?;
        pmi.kvsname = kvs.require("kvsname")?.to_owned();
        if pmi.rank >= pmi.size {
            return Err(Error::new(
                ErrorClass::Other,
                format!(
                    "the process manager gave rank {} in a job of {}",
                    pmi.rank, pmi.size
                ),
            ));
        }
        pmi.connection = Some(conn);
        Ok(pmi)
    }

    /// This process's rank in the job.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of processes in the job.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The application number (MPMD part) of this process.
    pub fn appnum(&self) -> i32 {
        self.appnum
    }

    /// Whether this is a singleton with no process manager.
    pub fn is_singleton(&self) -> bool {
        self.connection.is_none()
    }

    /// Name of the job's key-value space.
    pub fn kvsname(&self) -> &str {
        &self.kvsname
    }

    /// Puts `key` = `value` in the job's key-value space.
    pub fn put(&mut self, key: &str, value: &str) -> Result<()> {
        check_word("key", key, self.key_max)?;
        check_word("value", value, self.value_max)?;
        match &mut self.connection {
            None => {
                self.local.insert(key.to_owned(), value.to_owned());
                Ok(())
            }
            Some(c) => c
                .call(
                    &Message::new(
                        "put",
                        &[("kvsname", &self.kvsname), ("key", key), ("value", value)],
                    ),
                    "put_result",
                )
                .map(|_| ()),
        }
    }

    /// The value of `key` in the job's key-value space, `None` if absent.
    pub fn get(&mut self, key: &str) -> Result<Option<String>> {
        check_word("key", key, self.key_max)?;
        match &mut self.connection {
            None => Ok(self.local.get(key).cloned()),
            Some(c) => {
                let reply = c.call(
                    &Message::new("get", &[("kvsname", &self.kvsname), ("key", key)]),
                    "get_result",
                )?;
                match reply.get("rc") {
                    Some("0") => Ok(Some(reply.require("value")?.to_owned())),
                    _ => Ok(None),
                }
            }
        }
    }

    /// Waits until every process of the job has entered the barrier; puts
    /// before it are visible to gets after it.
    pub fn barrier(&mut self) -> Result<()> {
        match &mut self.connection {
            None => Ok(()),
            Some(c) => c
                .call(&Message::new("barrier_in", &[]), "barrier_out")
                .map(|_| ()),
        }
    }

    /// Asks the process manager to end the job with exit code `code`.
    pub fn abort(&mut self, code: i32, message: &str) -> Result<()> {
        match &mut self.connection {
            None => Ok(()),
            Some(c) => {
                let text = message.replace([' ', '='], "_");
                c.send(&Message::new(
                    "abort",
                    &[("exitcode", &code.to_string()), ("message", &text)],
                ))
            }
        }
    }

    /// Tells the process manager this process is done with PMI.
    pub fn finalize(&mut self) -> Result<()> {
        match self.connection.take() {
            None => Ok(()),
            Some(mut c) => c
                .call(&Message::new("finalize", &[]), "finalize_ack")
                .map(|_| ()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let m = Message::new(
            "put",
            &[("kvsname", "kvs_1"), ("key", "a"), ("value", "b:1")],
        );
        assert_eq!(m.format(), "cmd=put kvsname=kvs_1 key=a value=b:1\n");
        assert_eq!(Message::parse(m.format().as_bytes()).unwrap(), m);
        assert_eq!(
            Message::parse(b"cmd=barrier_out").unwrap().cmd,
            "barrier_out"
        );
    }

    #[test]
    fn rejects_malformed_lines() {
        let long = format!("cmd=put value={}", "x".repeat(MAX_LINE));
        for line in [
            &b""[..],
            b"\n",
            b"put key=a",
            b"cmd= key=a",
            b"cmd=put key",
            b"cmd=put =a",
            b"cmd=put key=a key=b",
            b"cmd=put cmd=get",
            b"cmd=put key=\xff\xfe",
            long.as_bytes(),
        ] {
            assert!(
                Message::parse(line).is_err(),
                "accepted {:?}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn words_are_checked() {
        assert!(check_word("key", "card-0", 64).is_ok());
        for bad in ["", "a b", "a=b", "a\nb"] {
            assert_eq!(
                check_word("key", bad, 64).unwrap_err().class(),
                ErrorClass::Arg
            );
        }
        assert!(check_word("key", &"k".repeat(65), 64).is_err());
    }

    #[test]
    fn singleton_has_a_private_kvs() {
        let mut pmi = Pmi::connect(PmiSource::Singleton).unwrap();
        assert!(pmi.is_singleton());
        assert_eq!((pmi.rank(), pmi.size()), (0, 1));
        pmi.put("a", "1").unwrap();
        assert_eq!(pmi.get("a").unwrap().as_deref(), Some("1"));
        assert_eq!(pmi.get("b").unwrap(), None);
        pmi.barrier().unwrap();
        pmi.finalize().unwrap();
    }
}
