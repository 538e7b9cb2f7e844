//! Which transports a rank runs, and which one each virtual connection
//! binds to: the choice of method, made here and nowhere else.
//!
//! - **At start** ([`start_transports`]): `OXMPI_TRANSPORTS` names the
//!   transports a rank may use; unset, it is every transport the build
//!   has. The list restricts, it does not rank: the order of preference is
//!   the build's (best first: shared memory, then the network), so that
//!   two ranks whose lists differ in order still choose the same method
//!   for the VC between them. A transport that fails to start is skipped
//!   when the list is the default (the reason is shown under
//!   `OXMPI_VERBOSE=1`): a machine without shared memory still runs jobs
//!   over the network. A transport the user named explicitly that fails is
//!   an error, as is a name this build does not know, a name given twice,
//!   or a list that names nothing.
//! - **At initialize** (`Routes::plan`, called by
//!   [`crate::device::Device::new`] after every rank has published its
//!   cards): each rank reads every peer's cards and chooses, for each
//!   peer, the first of its own transports whose card the peer published
//!   and that can reach it. A peer that no transport reaches fails
//!   initialize with [`ErrorClass::Other`] at once, naming the peer, the
//!   host identity and what each side offers, rather than at its first
//!   message. The VC itself is still bound on first use (the transport's
//!   connection is made lazily); the route is only decided early.
//!
//! Cost: a rank reads one card per peer (two when the first transport does
//! not reach it), so initialize makes `O(size)` KVS reads per rank. That is
//! cheap for the jobs of one host or a few; a job of thousands of ranks
//! would want the cards read lazily again, with this check done only for
//! the peers a rank talks to.

use crate::error::{Error, ErrorClass, Result};
use crate::host::HostId;
use crate::pmi::Pmi;
use crate::transport::{JobInfo, PeerRank, Transport};
use crate::vlog;

/// Environment variable: which transports may be used, a comma-separated
/// list (default: every transport the build has). Its order does not
/// matter: the build's order of preference applies to what it names.
/// Messages to the own rank always use the self method.
pub const TRANSPORTS_ENV: &str = "OXMPI_TRANSPORTS";

/// A transport the build can start, by the name `OXMPI_TRANSPORTS` uses.
#[derive(Clone, Copy)]
pub struct TransportFactory {
    /// The transport's name ([`Transport::name`]).
    pub name: &'static str,
    /// Starts the transport for a rank of a job. An error of class
    /// [`ErrorClass::Arg`] is a bad setting (one of the transport's own
    /// variables) and always fails the rank; any other means the transport
    /// cannot run here.
    pub start: fn(&JobInfo) -> Result<Box<dyn Transport>>,
}

/// The names of `known`, for messages: `shm, tcp`.
fn names(known: &[TransportFactory]) -> String {
    known.iter().map(|f| f.name).collect::<Vec<_>>().join(", ")
}

/// The transports `setting` (the value of `OXMPI_TRANSPORTS`, `None` when
/// unset) names, in the order of `known` (the order of preference); see
/// the module docs for what is refused.
fn chosen<'a>(
    setting: Option<&str>,
    known: &'a [TransportFactory],
) -> Result<Vec<&'a TransportFactory>> {
    let Some(list) = setting else {
        return Ok(known.iter().collect());
    };
    let mut chosen: Vec<&TransportFactory> = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let factory = known.iter().find(|f| f.name == name).ok_or_else(|| {
            Error::new(
                ErrorClass::Arg,
                format!(
                    "{TRANSPORTS_ENV}={list:?} names unknown transport {name:?}; this build has: {} \
                     (messages to the own rank always use the self method)",
                    names(known)
                ),
            )
        })?;
        if chosen.iter().any(|f| f.name == name) {
            return Err(Error::new(
                ErrorClass::Arg,
                format!("{TRANSPORTS_ENV}={list:?} names {name} twice"),
            ));
        }
        chosen.push(factory);
    }
    chosen.sort_by_key(|f| known.iter().position(|k| k.name == f.name));
    if chosen.is_empty() {
        return Err(Error::new(
            ErrorClass::Arg,
            format!(
                "{TRANSPORTS_ENV}={list:?} names no transport; this build has: {}",
                names(known)
            ),
        ));
    }
    Ok(chosen)
}

/// Starts the transports a rank of `job` uses between processes, in the
/// order of preference that `known` has: those `setting` names (the value
/// of `OXMPI_TRANSPORTS`), or, when it is `None`, each of `known` that
/// starts. A 1-rank job needs
/// none (the self method carries its messages), but its setting is checked
/// all the same.
pub fn start_transports(
    setting: Option<&str>,
    known: &[TransportFactory],
    job: &JobInfo,
) -> Result<Vec<Box<dyn Transport>>> {
    let chosen = chosen(setting, known)?;
    if job.size == 1 {
        return Ok(Vec::new());
    }
    let mut started = Vec::new();
    let mut failures = Vec::new();
    for factory in chosen {
        match (factory.start)(job) {
            Ok(transport) => started.push(transport),
            Err(e) if e.class() == ErrorClass::Arg => return Err(e),
            Err(e) => match setting {
                None => {
                    vlog!(
                        "rank {}: the {} transport does not start here, so this rank does \
                         not offer it: {e}",
                        job.rank,
                        factory.name
                    );
                    failures.push(format!("{}: {}", factory.name, e.message()));
                }
                Some(list) => {
                    return Err(Error::new(
                        e.class(),
                        format!(
                            "{TRANSPORTS_ENV}={list:?} names {}, which cannot start on rank {}: \
                             {}. Take it out of {TRANSPORTS_ENV}, or unset {TRANSPORTS_ENV} to \
                             use the transports that start",
                            factory.name,
                            job.rank,
                            e.message()
                        ),
                    ))
                }
            },
        }
    }
    if started.is_empty() {
        return Err(Error::new(
            ErrorClass::Other,
            format!(
                "no transport starts on rank {}, so it cannot reach the other {} ranks: {}",
                job.rank,
                job.size - 1,
                failures.join("; ")
            ),
        ));
    }
    Ok(started)
}

/// KVS key of `rank`'s card for `method`.
pub(crate) fn card_key(method: &str, rank: PeerRank) -> String {
    format!("oxmpi-card-{method}-{rank}")
}

/// KVS key of `rank`'s [`Offer`].
fn offer_key(rank: PeerRank) -> String {
    format!("oxmpi-offer-{rank}")
}

/// What a rank offers its peers, published beside its cards so that an
/// error about a peer can say what that peer has: its transports and its
/// host identity. In the KVS as `METHODS@BOOT_ID:NETNS:PIDNS`
/// (`shm,tcp@…:4026531840:4026531836`),
/// or `METHODS@unknown` when the rank could not read its identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Offer {
    methods: Vec<String>,
    host: Option<HostId>,
}

impl Offer {
    /// This rank's offer: the transports it runs.
    pub(crate) fn of(transports: &[Box<dyn Transport>]) -> Offer {
        Offer {
            methods: transports.iter().map(|t| t.name().to_owned()).collect(),
            host: HostId::current().ok(),
        }
    }

    fn format(&self) -> String {
        let host = self
            .host
            .as_ref()
            .map_or("unknown".to_owned(), HostId::to_string);
        format!("{}@{host}", self.methods.join(","))
    }

    fn parse(value: &str) -> Option<Offer> {
        let (methods, host) = value.rsplit_once('@')?;
        let host = match host {
            "unknown" => None,
            _ => Some(host.parse().ok()?),
        };
        Some(Offer {
            methods: methods
                .split(',')
                .filter(|m| !m.is_empty())
                .map(str::to_owned)
                .collect(),
            host,
        })
    }

    fn describe_methods(&self) -> String {
        match self.methods.as_slice() {
            [] => "no transport".to_owned(),
            m => m.join(", "),
        }
    }

    fn describe_host(&self) -> String {
        match &self.host {
            Some(h) => format!("host {h}"),
            None => "a host it could not identify".to_owned(),
        }
    }
}

/// The transport a VC will bind to and the card the peer published for it.
pub(crate) struct Route {
    /// Index of the transport in the device's list.
    pub(crate) transport: usize,
    pub(crate) card: String,
}

/// The route to every peer, chosen at initialize (the own rank has none:
/// the self method carries its messages).
pub(crate) struct Routes(Vec<Option<Route>>);

/// How many unreachable peers an error describes one by one.
const DESCRIBED_AT_MOST: usize = 4;

impl Routes {
    /// Publishes this rank's offer; called before the barrier after which
    /// [`Routes::plan`] reads the peers'.
    pub(crate) fn publish_offer(
        pmi: &mut Pmi,
        rank: PeerRank,
        transports: &[Box<dyn Transport>],
    ) -> Result<()> {
        pmi.put(&offer_key(rank), &Offer::of(transports).format())
    }

    /// Chooses the route to every peer of `job` among `transports` (index
    /// `first..` are the ones between processes, in order of preference),
    /// from the cards the peers published. Fails, naming them, if some
    /// peers cannot be reached.
    pub(crate) fn plan(
        pmi: &mut Pmi,
        job: &JobInfo,
        transports: &[Box<dyn Transport>],
        first: usize,
    ) -> Result<Routes> {
        let mut routes = Vec::with_capacity(job.size);
        let mut unreachable = Vec::new();
        for peer in 0..job.size {
            if peer == job.rank {
                routes.push(None);
                continue;
            }
            let route = route_to(&transports[first..], |method| {
                pmi.get(&card_key(method, peer))
            })?;
            if route.is_none() {
                unreachable.push(peer);
            }
            routes.push(route.map(|r| Route {
                transport: r.transport + first,
                card: r.card,
            }));
        }
        if unreachable.is_empty() {
            return Ok(Routes(routes));
        }
        let ours = Offer::of(&transports[first..]);
        let mut theirs = Vec::new();
        for &peer in unreachable.iter().take(DESCRIBED_AT_MOST) {
            let offer = pmi.get(&offer_key(peer))?.and_then(|v| Offer::parse(&v));
            theirs.push((peer, offer));
        }
        Err(unreachable_error(job.rank, &ours, &unreachable, &theirs))
    }

    /// The routes planned and not yet taken: (peer, transport index, card).
    pub(crate) fn planned(&self) -> impl Iterator<Item = (PeerRank, usize, &str)> {
        self.0
            .iter()
            .enumerate()
            .filter_map(|(peer, r)| r.as_ref().map(|r| (peer, r.transport, r.card.as_str())))
    }

    /// Takes the route to `peer` (at its VC's binding).
    pub(crate) fn take(&mut self, peer: PeerRank) -> Option<Route> {
        self.0.get_mut(peer).and_then(Option::take)
    }

    /// The card of `peer` for the transport at `transport`, if that is the
    /// route chosen for it.
    pub(crate) fn card_for(&self, peer: PeerRank, transport: usize) -> Option<&str> {
        match self.0.get(peer) {
            Some(Some(r)) if r.transport == transport => Some(&r.card),
            _ => None,
        }
    }
}

/// The first of `transports` (in order of preference) whose card
/// `card_of(name)` finds and that can reach the peer with it.
fn route_to(
    transports: &[Box<dyn Transport>],
    mut card_of: impl FnMut(&str) -> Result<Option<String>>,
) -> Result<Option<Route>> {
    for (index, t) in transports.iter().enumerate() {
        if let Some(card) = card_of(t.name())? {
            if t.reachable(&card) {
                return Ok(Some(Route {
                    transport: index,
                    card,
                }));
            }
        }
    }
    Ok(None)
}

/// The error of a rank that cannot reach `unreachable`; `theirs` are the
/// offers of the first few of them (`None`: the peer published none that
/// parses).
fn unreachable_error(
    rank: PeerRank,
    ours: &Offer,
    unreachable: &[PeerRank],
    theirs: &[(PeerRank, Option<Offer>)],
) -> Error {
    let list = match unreachable {
        [one] => format!("rank {one}"),
        many if many.len() <= DESCRIBED_AT_MOST => format!(
            "ranks {}",
            many.iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        many => format!("{} ranks ({}, ...)", many.len(), many[0]),
    };
    let mut sides = vec![format!(
        "rank {rank} ({}) offers {}",
        ours.describe_host(),
        ours.describe_methods()
    )];
    for (peer, offer) in theirs {
        sides.push(match offer {
            Some(o) => {
                let host = match (&o.host, &ours.host) {
                    (Some(a), Some(b)) if a == b => "the same host".to_owned(),
                    (Some(_), Some(_)) => format!("another {}", o.describe_host()),
                    _ => o.describe_host(),
                };
                format!("rank {peer} ({host}) offers {}", o.describe_methods())
            }
            None => format!("rank {peer} published no offer"),
        });
    }
    Error::new(
        ErrorClass::Other,
        format!(
            "rank {rank} cannot reach {list}, as no transport both ends offer connects them: \
             {}. A host is a kernel boot id and network namespace; shared memory reaches only \
             ranks of the same host. Set {TRANSPORTS_ENV} on every rank so that each pair of \
             ranks has a transport in common that reaches across (or unset it, for every \
             transport that starts)",
            sides.join("; ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::Header;
    use crate::transport::PacketSink;
    use std::os::fd::RawFd;

    /// A transport that reaches the peers whose card is its own card.
    struct Fake {
        name: &'static str,
        card: String,
    }

    impl Transport for Fake {
        fn name(&self) -> &'static str {
            self.name
        }
        fn card(&self) -> &str {
            &self.card
        }
        fn reachable(&self, card: &str) -> bool {
            card == self.card
        }
        fn add_peer(&mut self, _peer: PeerRank, _card: &str) -> Result<()> {
            Ok(())
        }
        fn eager_limit(&self) -> usize {
            0
        }
        fn send(&mut self, _peer: PeerRank, _header: &Header, _payload: &[u8]) -> Result<()> {
            Ok(())
        }
        unsafe fn send_zcopy(
            &mut self,
            _peer: PeerRank,
            _header: &Header,
            _payload: *const u8,
            _len: usize,
            _token: u64,
        ) -> Result<()> {
            Ok(())
        }
        fn poll(&mut self, _sink: &mut dyn PacketSink) -> Result<bool> {
            Ok(false)
        }
        fn arm_wakeup(&mut self) -> Result<Option<RawFd>> {
            Ok(None)
        }
        fn disarm_wakeup(&mut self) -> Result<()> {
            Ok(())
        }
        fn has_pending_sends(&self) -> bool {
            false
        }
    }

    fn fake(name: &'static str) -> Box<dyn Transport> {
        Box::new(Fake {
            name,
            card: format!("{name}-card"),
        })
    }

    const KNOWN: [TransportFactory; 3] = [
        TransportFactory {
            name: "fast",
            start: |_| {
                Err(Error::os(
                    "creating a memory file",
                    std::io::Error::from_raw_os_error(libc::EPERM),
                ))
            },
        },
        TransportFactory {
            name: "net",
            start: |_| Ok(fake("net")),
        },
        TransportFactory {
            name: "tuned",
            start: |_| {
                Err(Error::new(
                    ErrorClass::Arg,
                    "OXMPI_TUNED_SIZE=\"x\" is not a number",
                ))
            },
        },
    ];

    fn job(size: usize) -> JobInfo {
        JobInfo {
            rank: 0,
            size,
            secret: [0; 32],
        }
    }

    fn started(setting: Option<&str>, known: &[TransportFactory]) -> Result<Vec<&'static str>> {
        start_transports(setting, known, &job(2)).map(|ts| ts.iter().map(|t| t.name()).collect())
    }

    #[test]
    fn the_default_list_skips_a_transport_that_cannot_start() {
        assert_eq!(started(None, &KNOWN[..2]).unwrap(), ["net"]);
        let e = started(None, &KNOWN[..1]).unwrap_err();
        assert_eq!(e.class(), ErrorClass::Other);
        assert!(e.message().contains("no transport starts on rank 0"), "{e}");
        assert!(e.message().contains("fast: creating a memory file"), "{e}");
    }

    #[test]
    fn a_bad_setting_fails_even_in_the_default_list() {
        let e = started(None, &KNOWN).unwrap_err();
        assert_eq!(e.class(), ErrorClass::Arg);
        assert!(e.message().contains("OXMPI_TUNED_SIZE"), "{e}");
    }

    #[test]
    fn a_named_transport_that_cannot_start_is_an_error() {
        let e = started(Some("fast,net"), &KNOWN).unwrap_err();
        assert_eq!(e.class(), ErrorClass::Other, "{e}");
        for part in [
            "names fast, which cannot start on rank 0",
            "memory file",
            "Take it out",
        ] {
            assert!(e.message().contains(part), "{e}");
        }
        assert_eq!(started(Some(" net ,"), &KNOWN).unwrap(), ["net"]);
    }

    #[test]
    fn a_list_restricts_but_the_build_order_ranks() {
        let known = [
            KNOWN[1],
            TransportFactory {
                name: "other",
                start: |_| Ok(fake("other")),
            },
        ];
        assert_eq!(
            started(Some("other,net"), &known).unwrap(),
            ["net", "other"]
        );
        assert_eq!(
            started(Some("net,other"), &known).unwrap(),
            ["net", "other"]
        );
        assert_eq!(started(Some("other"), &known).unwrap(), ["other"]);
    }

    #[test]
    fn unknown_repeated_and_empty_lists_are_refused() {
        for (setting, says) in [
            (
                "net,ib",
                "unknown transport \"ib\"; this build has: fast, net, tuned",
            ),
            ("self", "unknown transport \"self\""),
            ("net,net", "names net twice"),
            ("", "names no transport"),
            (" , ", "names no transport"),
        ] {
            let e = started(Some(setting), &KNOWN).unwrap_err();
            assert_eq!(e.class(), ErrorClass::Arg, "{setting:?}: {e}");
            assert!(e.message().contains(says), "{setting:?}: {e}");
            // A 1-rank job starts nothing but is checked all the same.
            assert!(start_transports(Some(setting), &KNOWN, &job(1)).is_err());
        }
        assert!(start_transports(Some("fast"), &KNOWN, &job(1))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn the_route_is_the_first_transport_that_reaches_the_peer() {
        let ours = [fake("fast"), fake("net")];
        let cards = |published: &'static [(&'static str, &'static str)]| {
            move |m: &str| -> Result<Option<String>> {
                Ok(published
                    .iter()
                    .find(|(n, _)| *n == m)
                    .map(|(_, c)| c.to_string()))
            }
        };
        let r = route_to(&ours, cards(&[("fast", "fast-card"), ("net", "net-card")])).unwrap();
        assert_eq!(r.map(|r| r.transport), Some(0));
        // The peer's fast card is of another host: net it is.
        let r = route_to(&ours, cards(&[("fast", "elsewhere"), ("net", "net-card")])).unwrap();
        assert_eq!(
            r.map(|r| (r.transport, r.card)),
            Some((1, "net-card".to_owned()))
        );
        assert!(route_to(&ours, cards(&[("fast", "elsewhere")]))
            .unwrap()
            .is_none());
        assert!(route_to(&ours, cards(&[("other", "other-card")]))
            .unwrap()
            .is_none());
    }

    #[test]
    fn offers_travel_through_the_kvs_format() {
        let here = HostId::current().unwrap();
        let offer = Offer {
            methods: vec!["shm".into(), "tcp".into()],
            host: Some(here.clone()),
        };
        crate::pmi::check_word("value", &offer.format(), 1024).unwrap();
        assert_eq!(Offer::parse(&offer.format()), Some(offer));
        let none = Offer {
            methods: vec![],
            host: None,
        };
        assert_eq!(Offer::parse(&none.format()), Some(none));
        assert_eq!(Offer::parse("shm"), None);
        assert_eq!(Offer::parse("shm@boot:notanumber"), None);
        assert_eq!(Offer::parse("shm@boot:1"), None);
    }

    #[test]
    fn the_unreachable_error_says_who_has_what_and_what_to_set() {
        let here = HostId::current().unwrap();
        let elsewhere = HostId::from_parts(here.boot(), here.netns(), here.pidns() + 1).unwrap();
        let offer = |methods: &[&str], host: &HostId| Offer {
            methods: methods.iter().map(|m| m.to_string()).collect(),
            host: Some(host.clone()),
        };
        let e = unreachable_error(
            0,
            &offer(&["tcp"], &here),
            &[1, 2],
            &[
                (1, Some(offer(&["shm"], &here))),
                (2, Some(offer(&["shm"], &elsewhere))),
            ],
        );
        assert_eq!(e.class(), ErrorClass::Other);
        let m = e.message();
        for part in [
            "rank 0 cannot reach ranks 1, 2",
            &format!("rank 0 (host {here}) offers tcp"),
            "rank 1 (the same host) offers shm",
            &format!("rank 2 (another host {elsewhere}) offers shm"),
            "Set OXMPI_TRANSPORTS on every rank",
        ] {
            assert!(m.contains(part), "{part:?} not in {m}");
        }
        let many: Vec<PeerRank> = (1..=6).collect();
        let e = unreachable_error(0, &offer(&["tcp"], &here), &many, &[(1, None)]);
        assert!(e.message().contains("cannot reach 6 ranks (1, ...)"), "{e}");
        assert!(e.message().contains("rank 1 published no offer"), "{e}");
    }
}
