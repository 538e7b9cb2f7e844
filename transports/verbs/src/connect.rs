//! The messages of the verbs transport's connection channel: a request
//! ("connect your queue pair for me to mine") and its reply, sent as
//! datagrams between the ranks' UD queue pairs, and the Q_Key of a job.
//!
//! It owns the encoding, the checked decoding and the authentication of
//! these messages, and nothing of queue pairs or of when to send what
//! (that is the transport's). A datagram reaches a UD queue pair from
//! anyone who knows its number and Q_Key, so every message carries an
//! HMAC-SHA256 under the job's secret (truncated to 16 bytes) over all its
//! other bytes: a stranger can neither make a rank connect a queue pair
//! nor redirect one. A replayed message is harmless: a request is answered
//! at most once per queue pair (duplicates get the same reply), and a
//! reply is taken only for the queue pair it names.
//!
//! Layout (little-endian): magic `OXCM` (4), version (1), kind (1), MTU
//! (`enum ibv_mtu`, 1), reserved (1), from rank (4), to rank (4), the
//! sender's GID (16), LID (2), reserved (2), UD QPN (4), RC QPN (4), RC
//! PSN (4), the requester's RC QPN a reply answers (4; 0 in a request),
//! MAC (16): [`MESSAGE_LEN`] bytes.

use crate::provider::{Gid, Mtu};
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of one message.
pub const MESSAGE_LEN: usize = 68;
/// Bytes the MAC covers.
const SIGNED_LEN: usize = 52;
const MAGIC: &[u8; 4] = b"OXCM";
const VERSION: u8 = 1;
const LABEL: &[u8] = b"oxmpi-verbs-connect";

/// What a message asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// "My queue pair for you is `qpn`/`psn`: connect yours to it and
    /// reply."
    Request,
    /// "My queue pair is connected to yours (`echo`), and is `qpn`/`psn`."
    Reply,
}

/// One connection message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message {
    /// Request or reply.
    pub kind: Kind,
    /// The sender's rank.
    pub from: u32,
    /// The rank it is for.
    pub to: u32,
    /// The sender's port: GID.
    pub gid: Gid,
    /// The sender's port: LID.
    pub lid: u16,
    /// The sender's port: active MTU.
    pub mtu: Mtu,
    /// The sender's UD queue pair (where a reply goes).
    pub ud_qpn: u32,
    /// The sender's RC queue pair for the receiver.
    pub qpn: u32,
    /// Its first PSN.
    pub psn: u32,
    /// In a reply: the requester's RC queue pair it connected to.
    pub echo: u32,
}

type HmacSha256 = Hmac<Sha256>;

fn mac(secret: &[u8; 32]) -> HmacSha256 {
    // HMAC takes keys of any length: this cannot fail.
    let mut m = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
    m.update(LABEL);
    m
}

/// The Q_Key of the job with `secret`: derived from it (so a stranger
/// cannot guess it, and it does not reveal the secret), with the high bit
/// clear (a Q_Key with it set is a privileged one, refused to processes).
pub fn qkey(secret: &[u8; 32]) -> u32 {
    let mut m = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
    m.update(b"oxmpi-verbs-qkey");
    let tag = m.finalize().into_bytes();
    u32::from_le_bytes([tag[0], tag[1], tag[2], tag[3]]) & 0x7fff_ffff
}

impl Message {
    /// The message's bytes, authenticated under `secret`.
    pub fn encode(&self, secret: &[u8; 32]) -> [u8; MESSAGE_LEN] {
        let mut b = [0u8; MESSAGE_LEN];
        b[..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        b[5] = match self.kind {
            Kind::Request => 1,
            Kind::Reply => 2,
        };
        b[6] = self.mtu.to_ibv() as u8;
        b[8..12].copy_from_slice(&self.from.to_le_bytes());
        b[12..16].copy_from_slice(&self.to.to_le_bytes());
        b[16..32].copy_from_slice(&self.gid.0);
        b[32..34].copy_from_slice(&self.lid.to_le_bytes());
        b[36..40].copy_from_slice(&self.ud_qpn.to_le_bytes());
        b[40..44].copy_from_slice(&self.qpn.to_le_bytes());
        b[44..48].copy_from_slice(&self.psn.to_le_bytes());
        b[48..52].copy_from_slice(&self.echo.to_le_bytes());
        let mut m = mac(secret);
        m.update(&b[..SIGNED_LEN]);
        b[SIGNED_LEN..].copy_from_slice(&m.finalize().into_bytes()[..MESSAGE_LEN - SIGNED_LEN]);
        b
    }

    /// Decodes and checks a message that arrived for rank `me` of a job
    /// of `size` ranks with `secret`. The error says what was wrong with
    /// it; such a datagram is to be dropped (it came from a stranger, or
    /// was damaged), never to fail anything.
    pub fn decode(
        b: &[u8],
        secret: &[u8; 32],
        me: u32,
        size: u32,
    ) -> std::result::Result<Message, String> {
        if b.len() != MESSAGE_LEN {
            return Err(format!(
                "{} bytes, not the {MESSAGE_LEN} of a connection message",
                b.len()
            ));
        }
        if &b[..4] != MAGIC {
            return Err("no OXCM magic".into());
        }
        if b[4] != VERSION {
            return Err(format!("version {}, this rank speaks {VERSION}", b[4]));
        }
        let mut m = mac(secret);
        m.update(&b[..SIGNED_LEN]);
        m.verify_truncated_left(&b[SIGNED_LEN..])
            .map_err(|_| "its MAC is wrong (not from this job)".to_owned())?;
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let kind = match b[5] {
            1 => Kind::Request,
            2 => Kind::Reply,
            k => return Err(format!("unknown kind {k}")),
        };
        let mtu = Mtu::from_ibv(b[6].into()).ok_or_else(|| format!("bad MTU code {}", b[6]))?;
        let (from, to) = (u32_at(8), u32_at(12));
        if to != me {
            return Err(format!("it is for rank {to}, not {me}"));
        }
        if from >= size || from == me {
            return Err(format!(
                "it claims to come from rank {from} (job of {size})"
            ));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        let message = Message {
            kind,
            from,
            to,
            gid: Gid(gid),
            lid: u16::from_le_bytes([b[32], b[33]]),
            mtu,
            ud_qpn: u32_at(36),
            qpn: u32_at(40),
            psn: u32_at(44),
            echo: u32_at(48),
        };
        let qpn_ok = |q: u32| q != 0 && q < 1 << 24;
        if !qpn_ok(message.ud_qpn) || !qpn_ok(message.qpn) || message.psn >= 1 << 24 {
            return Err("queue-pair numbers and PSNs have 24 bits (and a number is not 0)".into());
        }
        match kind {
            Kind::Request if message.echo != 0 => Err("a request answers nothing".into()),
            Kind::Reply if !qpn_ok(message.echo) => {
                Err("a reply must name the queue pair it answers".into())
            }
            _ => Ok(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: [u8; 32] = [3; 32];

    fn request() -> Message {
        Message {
            kind: Kind::Request,
            from: 5,
            to: 2,
            gid: Gid([0xab; 16]),
            lid: 7,
            mtu: Mtu::Mtu2048,
            ud_qpn: 0x11,
            qpn: 0x22_3344,
            psn: 0x55_6677,
            echo: 0,
        }
    }

    #[test]
    fn messages_round_trip() {
        let req = request();
        assert_eq!(
            Message::decode(&req.encode(&SECRET), &SECRET, 2, 8).unwrap(),
            req
        );
        let rep = Message {
            kind: Kind::Reply,
            echo: 0x99,
            ..req
        };
        assert_eq!(
            Message::decode(&rep.encode(&SECRET), &SECRET, 2, 8).unwrap(),
            rep
        );
    }

    #[test]
    fn malformed_foreign_and_misdirected_messages_are_refused() {
        let good = request().encode(&SECRET);
        let refuse = |b: &[u8], me: u32, size: u32, says: &str| {
            let e = Message::decode(b, &SECRET, me, size).unwrap_err();
            assert!(e.contains(says), "{e:?} lacks {says:?}");
        };
        refuse(&good[..40], 2, 8, "bytes");
        refuse(&[good.as_slice(), &[0]].concat(), 2, 8, "bytes");
        let mut bad = good;
        bad[0] = b'X';
        refuse(&bad, 2, 8, "magic");
        let mut bad = good;
        bad[4] = 9;
        refuse(&bad, 2, 8, "version");
        // Any changed byte under the MAC, or another job's secret.
        for at in [5, 8, 20, 41, 51, 60] {
            let mut bad = good;
            bad[at] ^= 1;
            refuse(&bad, 2, 8, "MAC");
        }
        let e = Message::decode(&good, &[4; 32], 2, 8).unwrap_err();
        assert!(e.contains("MAC"), "{e}");
        // Well signed, but wrong in itself.
        let signed = |m: Message| m.encode(&SECRET);
        refuse(&good, 3, 8, "for rank 2");
        refuse(&good, 2, 5, "from rank 5");
        refuse(
            &signed(Message {
                from: 2,
                ..request()
            }),
            2,
            8,
            "from rank 2",
        );
        refuse(
            &signed(Message {
                qpn: 0,
                ..request()
            }),
            2,
            8,
            "24 bits",
        );
        refuse(
            &signed(Message {
                psn: 1 << 24,
                ..request()
            }),
            2,
            8,
            "24 bits",
        );
        refuse(
            &signed(Message {
                echo: 4,
                ..request()
            }),
            2,
            8,
            "answers nothing",
        );
        refuse(
            &signed(Message {
                kind: Kind::Reply,
                ..request()
            }),
            2,
            8,
            "must name",
        );
        let mut bad = good;
        bad[6] = 9;
        let mut m = mac(&SECRET);
        m.update(&bad[..SIGNED_LEN]);
        bad[SIGNED_LEN..].copy_from_slice(&m.finalize().into_bytes()[..16]);
        refuse(&bad, 2, 8, "MTU");
        bad[6] = 4;
        bad[5] = 3;
        let mut m = mac(&SECRET);
        m.update(&bad[..SIGNED_LEN]);
        bad[SIGNED_LEN..].copy_from_slice(&m.finalize().into_bytes()[..16]);
        refuse(&bad, 2, 8, "kind 3");
    }

    #[test]
    fn the_qkey_is_the_jobs_and_never_privileged() {
        assert_eq!(qkey(&SECRET), qkey(&SECRET));
        assert_ne!(qkey(&SECRET), qkey(&[4; 32]));
        for s in 0..32u8 {
            assert_eq!(qkey(&[s; 32]) & 0x8000_0000, 0);
        }
    }
}
