//! The connection handshake: both ends prove they know the job's secret.
//!
//! Transport independent: four fixed-size [`MESSAGE_LEN`]-byte messages,
//! produced and checked here, carried by whatever stream the transport has
//! (TCP today, the verbs bootstrap later). The secret never travels:
//!
//! ```text
//! connector                                   acceptor
//!   HELLO     {rank_c, channel, nonce_c} ──►
//!             {rank_a, nonce_a, mac_a}   ◄──  CHALLENGE
//!   RESPONSE  {mac_c}                    ──►
//!             {verdict}                  ◄──  VERDICT (accept / duplicate)
//! ```
//!
//! `mac_a = HMAC-SHA256(secret, "oxmpi-acceptor" ‖ nonce_c ‖ nonce_a ‖
//! rank_c ‖ rank_a ‖ channel)` and `mac_c` the same with
//! `"oxmpi-connector"`: fresh nonces on both sides stop replay, and the
//! different labels stop a stranger from reflecting one side's MAC back at
//! it. MACs are compared in constant time. The [`Channel`] the connector
//! asks for is under both MACs, so it cannot be changed on the way.
//!
//! Message layout (little-endian): magic `OXHS` (4), version (2), kind (1),
//! verdict (1), rank (4), channel (1), reserved (3), nonce (32), mac (32).

use crate::transport::{JobInfo, PeerRank};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;

/// Size of every handshake message.
pub const MESSAGE_LEN: usize = 80;
/// Version of the handshake and of the packet stream that follows it.
pub const HANDSHAKE_VERSION: u16 = 2;
const MAGIC: &[u8; 4] = b"OXHS";

const HELLO: u8 = 1;
const CHALLENGE: u8 = 2;
const RESPONSE: u8 = 3;
const VERDICT: u8 = 4;

/// What a connection is for, asked for by the connector in its HELLO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channel {
    /// The connection between two ranks that carries every kind of packet
    /// in both directions, in order.
    Packets,
    /// An extra connection that carries only rendezvous data packets, from
    /// the connector to the acceptor (a data lane).
    Data,
}

impl Channel {
    fn to_u8(self) -> u8 {
        match self {
            Channel::Packets => 0,
            Channel::Data => 1,
        }
    }

    fn from_u8(v: u8) -> Option<Channel> {
        match v {
            0 => Some(Channel::Packets),
            1 => Some(Channel::Data),
            _ => None,
        }
    }
}

/// The acceptor's decision, after authentication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The connection carries packets from now on.
    Accept,
    /// The acceptor keeps another connection to this peer (it has one, or
    /// its own attempt wins a simultaneous connect): close this one.
    Duplicate,
}

/// Why a handshake failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthError {
    /// Not an oxmpi handshake message (wrong magic or kind).
    Garbage(&'static str),
    /// The peer speaks another version.
    Version {
        /// The peer's version.
        theirs: u16,
    },
    /// The peer does not know the job's secret.
    BadMac,
    /// The peer claims a rank outside the job.
    BadRank(u32),
    /// The peer asks for a channel this version does not know.
    BadChannel(u8),
    /// The OS could not provide random bytes.
    Random(String),
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthError::Garbage(what) => write!(f, "not an oxmpi handshake ({what})"),
            AuthError::Version { theirs } => write!(
                f,
                "peer speaks handshake version {theirs}, this oxmpi speaks {HANDSHAKE_VERSION}"
            ),
            AuthError::BadMac => write!(f, "peer does not know the job's secret"),
            AuthError::BadRank(r) => write!(f, "peer claims rank {r}, which is not in the job"),
            AuthError::BadChannel(c) => write!(f, "peer asks for unknown channel {c}"),
            AuthError::Random(e) => write!(f, "no random nonce from the OS: {e}"),
        }
    }
}

struct Fields {
    kind: u8,
    verdict: u8,
    rank: u32,
    channel: u8,
    nonce: [u8; 32],
    mac: [u8; 32],
}

fn encode(f: &Fields) -> [u8; MESSAGE_LEN] {
    let mut b = [0u8; MESSAGE_LEN];
    b[0..4].copy_from_slice(MAGIC);
    b[4..6].copy_from_slice(&HANDSHAKE_VERSION.to_le_bytes());
    b[6] = f.kind;
    b[7] = f.verdict;
    b[8..12].copy_from_slice(&f.rank.to_le_bytes());
    b[12] = f.channel;
    b[16..48].copy_from_slice(&f.nonce);
    b[48..80].copy_from_slice(&f.mac);
    b
}

fn decode(b: &[u8; MESSAGE_LEN], kind: u8) -> Result<Fields, AuthError> {
    if &b[0..4] != MAGIC {
        return Err(AuthError::Garbage("bad magic"));
    }
    let version = u16::from_le_bytes([b[4], b[5]]);
    if version != HANDSHAKE_VERSION {
        return Err(AuthError::Version { theirs: version });
    }
    if b[6] != kind {
        return Err(AuthError::Garbage("unexpected message kind"));
    }
    let mut nonce = [0u8; 32];
    nonce.copy_from_slice(&b[16..48]);
    let mut mac = [0u8; 32];
    mac.copy_from_slice(&b[48..80]);
    Ok(Fields {
        kind,
        verdict: b[7],
        rank: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
        channel: b[12],
        nonce,
        mac,
    })
}

fn nonce() -> Result<[u8; 32], AuthError> {
    let mut n = [0u8; 32];
    getrandom::getrandom(&mut n).map_err(|e| AuthError::Random(e.to_string()))?;
    Ok(n)
}

/// What both MACs of a handshake cover besides the label.
struct Transcript<'a> {
    nonce_c: &'a [u8; 32],
    nonce_a: &'a [u8; 32],
    rank_c: u32,
    rank_a: u32,
    channel: Channel,
}

impl Transcript<'_> {
    fn mac(&self, secret: &[u8; 32], label: &[u8]) -> Hmac<Sha256> {
        // HMAC accepts keys of any length, so this cannot fail.
        let mut m =
            <Hmac<Sha256> as Mac>::new_from_slice(secret).unwrap_or_else(|_| unreachable!());
        m.update(label);
        m.update(self.nonce_c);
        m.update(self.nonce_a);
        m.update(&self.rank_c.to_le_bytes());
        m.update(&self.rank_a.to_le_bytes());
        m.update(&[self.channel.to_u8()]);
        m
    }
}

fn check_rank(rank: u32, job: &JobInfo) -> Result<PeerRank, AuthError> {
    let r = rank as usize;
    if r >= job.size || r == job.rank {
        return Err(AuthError::BadRank(rank));
    }
    Ok(r)
}

/// The side that opened the connection.
pub struct Connector {
    secret: [u8; 32],
    rank: u32,
    peer: u32,
    channel: Channel,
    nonce: [u8; 32],
}

impl Connector {
    /// Starts a handshake to `peer` for a connection of `channel`; returns
    /// the HELLO to send.
    pub fn new(
        job: &JobInfo,
        peer: PeerRank,
        channel: Channel,
    ) -> Result<(Connector, [u8; MESSAGE_LEN]), AuthError> {
        let c = Connector {
            secret: job.secret,
            rank: job.rank as u32,
            peer: peer as u32,
            channel,
            nonce: nonce()?,
        };
        let hello = encode(&Fields {
            kind: HELLO,
            verdict: 0,
            rank: c.rank,
            channel: channel.to_u8(),
            nonce: c.nonce,
            mac: [0; 32],
        });
        Ok((c, hello))
    }

    /// Checks the acceptor's CHALLENGE; returns the RESPONSE to send.
    pub fn on_challenge(&self, msg: &[u8; MESSAGE_LEN]) -> Result<[u8; MESSAGE_LEN], AuthError> {
        let f = decode(msg, CHALLENGE)?;
        if f.rank != self.peer {
            return Err(AuthError::BadRank(f.rank));
        }
        let transcript = Transcript {
            nonce_c: &self.nonce,
            nonce_a: &f.nonce,
            rank_c: self.rank,
            rank_a: self.peer,
            channel: self.channel,
        };
        transcript
            .mac(&self.secret, b"oxmpi-acceptor")
            .verify_slice(&f.mac)
            .map_err(|_| AuthError::BadMac)?;
        let mine = transcript
            .mac(&self.secret, b"oxmpi-connector")
            .finalize()
            .into_bytes();
        let mut m = [0u8; 32];
        m.copy_from_slice(&mine);
        Ok(encode(&Fields {
            kind: RESPONSE,
            verdict: 0,
            rank: self.rank,
            channel: 0,
            nonce: [0; 32],
            mac: m,
        }))
    }

    /// Reads the acceptor's VERDICT.
    pub fn on_verdict(&self, msg: &[u8; MESSAGE_LEN]) -> Result<Verdict, AuthError> {
        match decode(msg, VERDICT)?.verdict {
            0 => Ok(Verdict::Accept),
            1 => Ok(Verdict::Duplicate),
            _ => Err(AuthError::Garbage("unknown verdict")),
        }
    }
}

/// The side that accepted the connection.
pub struct Acceptor {
    secret: [u8; 32],
    rank: u32,
    nonce: [u8; 32],
    /// The connector's rank, channel and nonce, from its HELLO.
    peer: Option<(u32, Channel, [u8; 32])>,
}

impl Acceptor {
    /// Waits for a HELLO.
    pub fn new(job: &JobInfo) -> Result<Acceptor, AuthError> {
        Ok(Acceptor {
            secret: job.secret,
            rank: job.rank as u32,
            nonce: nonce()?,
            peer: None,
        })
    }

    /// Reads the connector's HELLO; returns the rank and the channel it
    /// claims (not yet proven) and the CHALLENGE to send.
    pub fn on_hello(
        &mut self,
        job: &JobInfo,
        msg: &[u8; MESSAGE_LEN],
    ) -> Result<(PeerRank, Channel, [u8; MESSAGE_LEN]), AuthError> {
        let f = decode(msg, HELLO)?;
        let peer = check_rank(f.rank, job)?;
        let channel = Channel::from_u8(f.channel).ok_or(AuthError::BadChannel(f.channel))?;
        self.peer = Some((f.rank, channel, f.nonce));
        let transcript = Transcript {
            nonce_c: &f.nonce,
            nonce_a: &self.nonce,
            rank_c: f.rank,
            rank_a: self.rank,
            channel,
        };
        let m = transcript
            .mac(&self.secret, b"oxmpi-acceptor")
            .finalize()
            .into_bytes();
        let mut mac_a = [0u8; 32];
        mac_a.copy_from_slice(&m);
        Ok((
            peer,
            channel,
            encode(&Fields {
                kind: CHALLENGE,
                verdict: 0,
                rank: self.rank,
                channel: 0,
                nonce: self.nonce,
                mac: mac_a,
            }),
        ))
    }

    /// Checks the connector's RESPONSE: only then are its rank and channel
    /// proven.
    pub fn on_response(&self, msg: &[u8; MESSAGE_LEN]) -> Result<(), AuthError> {
        let (rank_c, channel, nonce_c) = self
            .peer
            .ok_or(AuthError::Garbage("RESPONSE before HELLO"))?;
        let f = decode(msg, RESPONSE)?;
        let transcript = Transcript {
            nonce_c: &nonce_c,
            nonce_a: &self.nonce,
            rank_c,
            rank_a: self.rank,
            channel,
        };
        transcript
            .mac(&self.secret, b"oxmpi-connector")
            .verify_slice(&f.mac)
            .map_err(|_| AuthError::BadMac)
    }

    /// The VERDICT message to send.
    pub fn verdict(&self, verdict: Verdict) -> [u8; MESSAGE_LEN] {
        encode(&Fields {
            kind: VERDICT,
            verdict: match verdict {
                Verdict::Accept => 0,
                Verdict::Duplicate => 1,
            },
            rank: self.rank,
            channel: 0,
            nonce: [0; 32],
            mac: [0; 32],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(rank: usize, secret: u8) -> JobInfo {
        JobInfo {
            rank,
            size: 4,
            secret: [secret; 32],
        }
    }

    #[test]
    fn handshake_succeeds_with_the_same_secret() {
        let (c, hello) = Connector::new(&job(1, 7), 2, Channel::Packets).unwrap();
        let mut a = Acceptor::new(&job(2, 7)).unwrap();
        let (peer, channel, challenge) = a.on_hello(&job(2, 7), &hello).unwrap();
        assert_eq!((peer, channel), (1, Channel::Packets));
        let response = c.on_challenge(&challenge).unwrap();
        a.on_response(&response).unwrap();
        assert_eq!(
            c.on_verdict(&a.verdict(Verdict::Duplicate)),
            Ok(Verdict::Duplicate)
        );
        assert_eq!(
            c.on_verdict(&a.verdict(Verdict::Accept)),
            Ok(Verdict::Accept)
        );
    }

    #[test]
    fn the_channel_asked_for_is_proven_with_the_rank() {
        let (c, hello) = Connector::new(&job(1, 7), 2, Channel::Data).unwrap();
        let mut a = Acceptor::new(&job(2, 7)).unwrap();
        let (_, channel, challenge) = a.on_hello(&job(2, 7), &hello).unwrap();
        assert_eq!(channel, Channel::Data);
        a.on_response(&c.on_challenge(&challenge).unwrap()).unwrap();

        // A channel changed on the way: neither side's MAC checks out.
        let (c, mut hello) = Connector::new(&job(1, 7), 2, Channel::Data).unwrap();
        hello[12] = Channel::Packets.to_u8();
        let mut a = Acceptor::new(&job(2, 7)).unwrap();
        let (_, channel, challenge) = a.on_hello(&job(2, 7), &hello).unwrap();
        assert_eq!(channel, Channel::Packets);
        assert_eq!(c.on_challenge(&challenge), Err(AuthError::BadMac));

        // An unknown channel is refused at once.
        hello[12] = 7;
        assert_eq!(
            Acceptor::new(&job(2, 7))
                .unwrap()
                .on_hello(&job(2, 7), &hello)
                .unwrap_err(),
            AuthError::BadChannel(7)
        );
    }

    #[test]
    fn wrong_secret_is_caught_by_both_sides() {
        // The connector checks the acceptor...
        let (c, hello) = Connector::new(&job(1, 7), 2, Channel::Packets).unwrap();
        let mut a = Acceptor::new(&job(2, 8)).unwrap();
        let (_, _, challenge) = a.on_hello(&job(2, 8), &hello).unwrap();
        assert_eq!(c.on_challenge(&challenge), Err(AuthError::BadMac));
        // ...and the acceptor checks the connector.
        let (stranger, hello) = Connector::new(&job(1, 9), 2, Channel::Packets).unwrap();
        let mut a = Acceptor::new(&job(2, 7)).unwrap();
        let (_, _, challenge) = a.on_hello(&job(2, 7), &hello).unwrap();
        // The stranger cannot answer, so it forges a response from the
        // challenge's own MAC (a reflection): refused.
        let mut forged = challenge;
        forged[6] = RESPONSE;
        assert_eq!(a.on_response(&forged), Err(AuthError::BadMac));
        assert!(stranger.on_challenge(&challenge).is_err());
    }

    #[test]
    fn other_version_and_garbage_are_refused() {
        let (_, mut hello) = Connector::new(&job(1, 7), 2, Channel::Packets).unwrap();
        hello[4] = 9;
        let mut a = Acceptor::new(&job(2, 7)).unwrap();
        assert_eq!(
            a.on_hello(&job(2, 7), &hello).unwrap_err(),
            AuthError::Version { theirs: 9 }
        );
        assert!(a.on_hello(&job(2, 7), &[0u8; MESSAGE_LEN]).is_err());
        assert!(a.on_hello(&job(2, 7), &[0xffu8; MESSAGE_LEN]).is_err());
        let mut http = [b' '; MESSAGE_LEN];
        http[..16].copy_from_slice(b"GET / HTTP/1.1\r\n");
        assert!(matches!(
            a.on_hello(&job(2, 7), &http),
            Err(AuthError::Garbage(_))
        ));
        // A RESPONSE before any HELLO.
        assert!(Acceptor::new(&job(2, 7))
            .unwrap()
            .on_response(&hello)
            .is_err());
    }

    #[test]
    fn claimed_ranks_are_checked() {
        let mut a = Acceptor::new(&job(2, 7)).unwrap();
        for rank in [2usize, 4, 1000] {
            let (_, hello) = Connector::new(
                &JobInfo {
                    rank,
                    size: 2000,
                    secret: [7; 32],
                },
                2,
                Channel::Packets,
            )
            .unwrap();
            assert!(matches!(
                a.on_hello(&job(2, 7), &hello),
                Err(AuthError::BadRank(_))
            ));
        }
    }
}
