//! Who can share memory with whom: the business card that carries the
//! host identity ([`oxmpi_adi::host::HostId`]: boot id, network and PID
//! namespaces; two ranks can share memory when theirs are equal).
//!
//! A card is `VERSION:BOOT_ID:NETNS:PIDNS:NAME`: the transport's
//! [`SHM_VERSION`], the identity, and the name of the rank's listener in the abstract
//! namespace (`oxmpi-shm-PID-RANDOM`, [`is_listener_name`]).

use crate::proto::SHM_VERSION;
use oxmpi_adi::host::HostId;
use std::io;

/// Longest listener name this version makes or accepts.
pub(crate) const NAME_MAX: usize = 64;
/// What every listener name starts with.
const NAME_PREFIX: &str = "oxmpi-shm-";

/// A new listener name for the process `pid`: unpredictable, so that no
/// one can take it first.
pub(crate) fn listener_name(pid: u32) -> io::Result<String> {
    let mut random = [0u8; 8];
    crate::sys::random_bytes(&mut random)?;
    Ok(format!(
        "{NAME_PREFIX}{pid}-{:016x}",
        u64::from_le_bytes(random)
    ))
}

/// Whether `name` has the shape of a listener name (printable, no `:`).
pub(crate) fn is_listener_name(name: &[u8]) -> bool {
    name.len() <= NAME_MAX
        && name.starts_with(NAME_PREFIX.as_bytes())
        && name.iter().all(|&b| b.is_ascii_alphanumeric() || b == b'-')
}

/// A peer's card, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Card {
    /// The peer's [`SHM_VERSION`].
    pub version: u32,
    /// Where the peer runs.
    pub host: HostId,
    /// The peer's listener name.
    pub name: Vec<u8>,
}

impl Card {
    /// The card of a process at `host` listening on `name`.
    pub(crate) fn format(host: &HostId, name: &str) -> String {
        format!("{SHM_VERSION}:{host}:{name}")
    }

    /// Parses a card; `None` if it is not one.
    pub(crate) fn parse(card: &str) -> Option<Card> {
        let (version, rest) = card.split_once(':')?;
        let (host, name) = rest.rsplit_once(':')?;
        let name = name.as_bytes().to_vec();
        if !is_listener_name(&name) {
            return None;
        }
        Some(Card {
            version: version.parse().ok()?,
            host: host.parse().ok()?,
            name,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_host_has_an_identity_and_a_card_that_parses_back() {
        let host = HostId::current().expect("host identity");
        let name = listener_name(std::process::id()).expect("random name");
        assert!(is_listener_name(name.as_bytes()), "{name}");
        assert_ne!(name, listener_name(std::process::id()).unwrap());
        let card = Card::format(&host, &name);
        assert_eq!(
            Card::parse(&card),
            Some(Card {
                version: SHM_VERSION,
                host,
                name: name.into_bytes()
            })
        );
    }

    #[test]
    fn bad_cards_do_not_parse() {
        for card in [
            "",
            "127.0.0.1:4000",
            "1:boot:12:34",
            "1:boot:12:oxmpi-shm-1-2",
            "1:boot:12:34:oxmpi-shm-1-2:extra",
            "1:boot:12:34:56:oxmpi-shm-1-2",
            "x:boot:12:34:oxmpi-shm-1-2",
            "1::12:34:oxmpi-shm-1-2",
            "1:boot:net:34:oxmpi-shm-1-2",
            "1:boot:12:pid:oxmpi-shm-1-2",
            "1:boot:12:34:someone-else",
            "1:boot:12:34:oxmpi-shm-with space",
        ] {
            assert_eq!(Card::parse(card), None, "{card:?}");
        }
    }
}
