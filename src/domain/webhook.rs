//! Completion webhooks, the rules (docs/design.md, "Webhook outbox"): the
//! event kinds and how an endpoint's subscription is stored, which URLs
//! and addresses a delivery may reach, the retry schedule, when a failing
//! endpoint is disabled, and the Standard Webhooks signature with secrets
//! derived (never stored) from the server's webhook key. Nothing in here
//! does I/O.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use super::ids::text_enum;
use super::{Secret, Timestamp};

type HmacSha256 = Hmac<Sha256>;

text_enum! {
    /// What happened to a job, as a webhook event's `type` (and a
    /// `webhook_subscriptions` row's `kind`).
    stored pub enum EventKind {
        /// The job succeeded: its result is final.
        JobSucceeded = "job.succeeded",
        /// The job failed for good.
        JobFailed = "job.failed",
        /// An attempt's outcome became unknown: support must resolve it.
        JobUnknown = "job.unknown",
        /// The job was cancelled by its owner.
        JobCancelled = "job.cancelled",
    }
}

text_enum! {
    /// Where an outbox row stands.
    pub enum EventState {
        /// Waiting for its next delivery attempt.
        Pending = "pending",
        /// An endpoint answered 2xx.
        Delivered = "delivered",
        /// Retried for the endpoint's whole retry window without success.
        Dead = "dead",
    }
}

text_enum! {
    /// How one delivery attempt ended.
    pub enum DeliveryOutcome {
        /// A 2xx answer.
        Delivered = "delivered",
        /// Any other status, a timeout, a connection error, a redirect.
        Failed = "failed",
        /// Not sent: the URL's host resolved to an address deliveries may
        /// not reach (or did not resolve).
        Refused = "refused",
    }
}

/// The most kinds one subscription may name (each known kind once).
pub const MAX_EVENTS: usize = EventKind::ALL.len();

/// The longest URL an endpoint may have, as stored.
pub const MAX_URL_LEN: usize = 2048;

/// The longest URL a client may send: one less than [`MAX_URL_LEN`],
/// because parsing may add a `/` (`https://host` becomes `https://host/`)
/// and the stored form must still fit. The API's schema states this limit.
pub const MAX_URL_INPUT_LEN: usize = MAX_URL_LEN - 1;

/// The most bytes of an answer's body a delivery row keeps.
pub const MAX_RESPONSE_BODY: usize = 1024;

/// A subscription as it is kept and shown: the kinds, each once, sorted by
/// their text (`job.failed` before `job.succeeded`). Stored as one
/// `webhook_subscriptions` row per kind.
pub fn subscription(kinds: &[EventKind]) -> Vec<EventKind> {
    let mut kinds = kinds.to_vec();
    kinds.sort_unstable_by_key(|k| k.as_str());
    kinds.dedup();
    kinds
}

/// Whether a subscription to `kinds` names `kind`: the rule the outbox's
/// look-up applies with `webhook_subscriptions.kind = kind`.
pub fn subscribes(kinds: &[EventKind], kind: EventKind) -> bool {
    kinds.contains(&kind)
}

/// Whether a job's state change of `kind` writes an outbox row for an
/// endpoint: it is enabled and subscribed to `kind`. The rule
/// `store::webhooks::record_event`'s `WHERE` applies.
pub fn records_event(enabled: bool, kinds: &[EventKind], kind: EventKind) -> bool {
    enabled && subscribes(kinds, kind)
}

/// Whether the delivery loop may claim an outbox row at `now` (database
/// clock): pending, due, no running lease, its endpoint enabled. The rule
/// `store::webhooks::claim_due`'s `WHERE` applies.
pub fn may_claim_event(
    state: EventState,
    next_attempt_at: Timestamp,
    lease_expires_at: Option<Timestamp>,
    endpoint_enabled: bool,
    now: Timestamp,
) -> bool {
    state == EventState::Pending
        && next_attempt_at <= now
        && lease_expires_at.is_none_or(|until| until < now)
        && endpoint_enabled
}

/// Why a subscription was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventsRefusal {
    #[error("`events` must name at least one event type")]
    Empty,
    #[error("`events` names more than {MAX_EVENTS} event types")]
    TooMany,
    #[error("`{0}` is not an event type; the types are job.succeeded, job.failed, job.unknown and job.cancelled")]
    Unknown(String),
}

/// The kinds a client asked for, checked: at least one, each known.
pub fn parse_events(names: &[String]) -> Result<Vec<EventKind>, EventsRefusal> {
    if names.is_empty() {
        return Err(EventsRefusal::Empty);
    }
    if names.len() > MAX_EVENTS * 2 {
        return Err(EventsRefusal::TooMany);
    }
    let mut kinds = Vec::new();
    for name in names {
        let kind = EventKind::parse(name)
            .ok_or_else(|| EventsRefusal::Unknown(name.chars().take(64).collect::<String>()))?;
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    Ok(kinds)
}

/// How many deliveries one process may have in flight at once: in all, for
/// one owner, and to one endpoint (`webhooks.max_in_flight*`). With the
/// per-owner and per-endpoint caps, an owner whose endpoints never answer
/// holds at most `per_owner` of the process's `total` slots, each until
/// its timeout; every other owner's deliveries take the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryCaps {
    pub total: usize,
    pub per_owner: usize,
    pub per_endpoint: usize,
}

/// What is in flight from this process now: deliveries by owner and by
/// endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InFlight {
    owners: std::collections::HashMap<String, usize>,
    endpoints: std::collections::HashMap<String, usize>,
    total: usize,
}

impl InFlight {
    pub fn total(&self) -> usize {
        self.total
    }

    pub fn of_owner(&self, owner: &str) -> usize {
        self.owners.get(owner).copied().unwrap_or(0)
    }

    pub fn to_endpoint(&self, endpoint: &str) -> usize {
        self.endpoints.get(endpoint).copied().unwrap_or(0)
    }

    /// A delivery starts.
    pub fn start(&mut self, owner: &str, endpoint: &str) {
        *self.owners.entry(owner.to_owned()).or_default() += 1;
        *self.endpoints.entry(endpoint.to_owned()).or_default() += 1;
        self.total += 1;
    }

    /// A delivery ends (its slot is free again).
    pub fn end(&mut self, owner: &str, endpoint: &str) {
        fn less(counts: &mut std::collections::HashMap<String, usize>, key: &str) {
            if let Some(n) = counts.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(key);
                }
            }
        }
        less(&mut self.owners, owner);
        less(&mut self.endpoints, endpoint);
        self.total = self.total.saturating_sub(1);
    }

    /// The owners, then the endpoints, with no room left under `caps`.
    pub fn full(&self, caps: DeliveryCaps) -> (Vec<String>, Vec<String>) {
        let at = |counts: &std::collections::HashMap<String, usize>, cap: usize| {
            counts
                .iter()
                .filter(|(_, n)| **n >= cap)
                .map(|(key, _)| key.clone())
                .collect()
        };
        (
            at(&self.owners, caps.per_owner),
            at(&self.endpoints, caps.per_endpoint),
        )
    }
}

/// Which of the due events (oldest first, each as `(owner, endpoint)`) a
/// claim takes, in turns between owners: each owner's oldest, then each
/// owner's next, and so on, never past the free slots, nor an owner or an
/// endpoint past its cap (counting what is in flight). The indices come
/// back in the order taken. An owner with a thousand events due takes its
/// turn like an owner with one.
pub fn take_turns(due: &[(&str, &str)], caps: DeliveryCaps, busy: &InFlight) -> Vec<usize> {
    let room = caps.total.saturating_sub(busy.total());
    let mut owners: Vec<&str> = Vec::new();
    let mut queues: Vec<std::collections::VecDeque<usize>> = Vec::new();
    for (index, (owner, _)) in due.iter().enumerate() {
        match owners.iter().position(|o| o == owner) {
            Some(at) => queues[at].push_back(index),
            None => {
                owners.push(owner);
                queues.push(std::iter::once(index).collect());
            }
        }
    }
    let mut taken: Vec<usize> = Vec::new();
    let mut by_owner = vec![0usize; owners.len()];
    let mut by_endpoint: std::collections::HashMap<&str, usize> = Default::default();
    let owner_room = |at: usize, by_owner: &[usize]| {
        caps.per_owner
            .saturating_sub(busy.of_owner(owners[at]))
            .saturating_sub(by_owner[at])
    };
    let mut progress = true;
    while taken.len() < room && progress {
        progress = false;
        for at in 0..owners.len() {
            if taken.len() == room || owner_room(at, &by_owner) == 0 {
                continue;
            }
            // This owner's oldest event whose endpoint has room.
            let queue = &mut queues[at];
            let fits = queue.iter().position(|&index| {
                let endpoint = due[index].1;
                busy.to_endpoint(endpoint) + by_endpoint.get(endpoint).copied().unwrap_or(0)
                    < caps.per_endpoint
            });
            if let Some(position) = fits {
                let index = queue.remove(position).expect("a position in the queue");
                *by_endpoint.entry(due[index].1).or_default() += 1;
                by_owner[at] += 1;
                taken.push(index);
                progress = true;
            }
        }
    }
    taken
}

/// Whether an owner with `existing` endpoints may register another
/// (`webhooks.max_endpoints_per_owner`).
pub fn may_register_endpoint(existing: usize, cap: usize) -> bool {
    existing < cap
}

/// What an address is, for the delivery's SSRF rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    Public,
    Loopback,
    /// RFC 1918 (10/8, 172.16/12, 192.168/16).
    Private,
    /// 169.254/16, fe80::/10.
    LinkLocal,
    /// fc00::/7.
    UniqueLocal,
    /// 0.0.0.0/8, ::.
    Unspecified,
    /// 224/4, ff00::/8, and 255.255.255.255.
    Multicast,
    /// 100.64/10, the carrier-grade NAT range.
    SharedAddressSpace,
    /// 192.0.2/24, 198.51.100/24, 203.0.113/24, 2001:db8::/32.
    Documentation,
    /// Other special ranges: 192.0.0/24, 198.18/15 (benchmarking),
    /// 240/4 (reserved), 64:ff9b:1::/48, site-local fec0::/10.
    Reserved,
}

impl AddressClass {
    /// Whether a delivery may reach such an address without
    /// `webhooks.allow_private_addresses`.
    pub fn is_public(self) -> bool {
        self == Self::Public
    }

    pub fn describe(self) -> &'static str {
        match self {
            Self::Public => "a public address",
            Self::Loopback => "a loopback address",
            Self::Private => "a private address",
            Self::LinkLocal => "a link-local address",
            Self::UniqueLocal => "a unique-local address",
            Self::Unspecified => "the unspecified address",
            Self::Multicast => "a multicast or broadcast address",
            Self::SharedAddressSpace => "a carrier-grade NAT address",
            Self::Documentation => "a documentation address",
            Self::Reserved => "a reserved address",
        }
    }
}

/// What `ip` is. An IPv6 address that carries an IPv4 address is judged by
/// the IPv4 address it carries (see [`embedded_v4`]): it may reach that
/// address through a translator or a tunnel.
pub fn classify(ip: IpAddr) -> AddressClass {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> AddressClass {
    let [a, b, c, _] = ip.octets();
    match (a, b, c) {
        (0, _, _) => AddressClass::Unspecified,
        (127, _, _) => AddressClass::Loopback,
        (10, _, _) => AddressClass::Private,
        (172, 16..=31, _) => AddressClass::Private,
        (192, 168, _) => AddressClass::Private,
        (169, 254, _) => AddressClass::LinkLocal,
        (100, 64..=127, _) => AddressClass::SharedAddressSpace,
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => AddressClass::Documentation,
        (192, 0, 0) | (198, 18..=19, _) => AddressClass::Reserved,
        (224..=239, _, _) => AddressClass::Multicast,
        _ if ip.is_broadcast() => AddressClass::Multicast,
        (240..=255, _, _) => AddressClass::Reserved,
        _ => AddressClass::Public,
    }
}

/// The IPv4 addresses an IPv6 address carries, by the forms that embed one:
///
/// - IPv4-mapped `::ffff:a.b.c.d` (`::ffff:0:0/96`) and IPv4-translated
///   `::ffff:0:a.b.c.d` (`::ffff:0:0:0/96`);
/// - IPv4-compatible `::a.b.c.d` (`::/96`, deprecated; not `::` or `::1`);
/// - NAT64's well-known prefix `64:ff9b::a.b.c.d` (`64:ff9b::/96`), which
///   a NAT64 gateway forwards to that IPv4 address;
/// - 6to4 `2002:AABB:CCDD::/48`, the relay's IPv4 in bits 16-47;
/// - Teredo `2001:0::/32`: the server's IPv4 in bits 32-63 and the
///   client's, inverted, in the last 32.
///
/// The local-use NAT64 prefix `64:ff9b:1::/48` places its IPv4 address
/// where its operator chooses, so it is refused whole (`Reserved`).
pub fn embedded_v4(ip: Ipv6Addr) -> Vec<Ipv4Addr> {
    let s = ip.segments();
    let v4 = |high: u16, low: u16| {
        let [a, b] = high.to_be_bytes();
        let [c, d] = low.to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    };
    let zero = |range: std::ops::Range<usize>| s[range].iter().all(|x| *x == 0);
    let mapped = zero(0..5) && s[5] == 0xffff;
    let translated = zero(0..4) && s[4] == 0xffff && s[5] == 0;
    let compatible = zero(0..6) && !ip.is_unspecified() && !ip.is_loopback();
    let nat64 = s[0] == 0x0064 && s[1] == 0xff9b && zero(2..6);
    if mapped || translated || compatible || nat64 {
        vec![v4(s[6], s[7])]
    } else if s[0] == 0x2002 {
        vec![v4(s[1], s[2])]
    } else if s[0] == 0x2001 && s[1] == 0 {
        vec![v4(s[2], s[3]), v4(!s[6], !s[7])]
    } else {
        Vec::new()
    }
}

fn classify_v6(ip: Ipv6Addr) -> AddressClass {
    let carried = embedded_v4(ip);
    if !carried.is_empty() {
        // The first carried address that is not public decides; a relay or
        // translator address carrying only public ones is public.
        return carried
            .into_iter()
            .map(classify_v4)
            .find(|class| !class.is_public())
            .unwrap_or(AddressClass::Public);
    }
    let segments = ip.segments();
    let first = segments[0];
    if ip.is_unspecified() {
        AddressClass::Unspecified
    } else if ip.is_loopback() {
        AddressClass::Loopback
    } else if first & 0xff00 == 0xff00 {
        AddressClass::Multicast
    } else if first & 0xffc0 == 0xfe80 {
        AddressClass::LinkLocal
    } else if first & 0xffc0 == 0xfec0 {
        AddressClass::Reserved
    } else if first & 0xfe00 == 0xfc00 {
        AddressClass::UniqueLocal
    } else if first == 0x2001 && segments[1] == 0x0db8 {
        AddressClass::Documentation
    } else if first == 0x0064 && segments[1] == 0xff9b && segments[2] == 0x0001 {
        AddressClass::Reserved
    } else {
        AddressClass::Public
    }
}

/// Why an endpoint URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlRefusal {
    #[error("`url` is longer than {MAX_URL_INPUT_LEN} characters")]
    TooLong,
    #[error("`url` is not a URL: {0}")]
    Malformed(String),
    #[error("`url` must be http or https")]
    Scheme,
    #[error("`url` must not carry a user name or password")]
    Credentials,
    #[error("`url` has no host")]
    NoHost,
    #[error(
        "`url` names {0}; webhooks are only sent to public addresses \
         (an operator may allow others with webhooks.allow_private_addresses)"
    )]
    Address(&'static str),
    #[error(
        "`url` must read http(s)://host[:port][/path], the host a DNS name \
         or an IP address, the rest URL-safe characters (percent-encode others)"
    )]
    Grammar,
}

/// The grammar of an endpoint URL as the API documents it (the OpenAPI
/// `pattern` of `url`): http(s), a DNS name, a port from 1 to 65535, a
/// path of URL-safe characters. [`check_url`] refuses any text outside it,
/// so what the document calls invalid is never accepted, and accepts every
/// text inside it. Beyond it, for local setups and tests, it also takes an
/// IP literal as the host (judged by its address: refused unless public or
/// `webhooks.allow_private_addresses`).
pub const URL_PATTERN: &str = r"^https?://([A-Za-z0-9-]+\.)*[A-Za-z][A-Za-z0-9-]*(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?([/?#][A-Za-z0-9._~!$&'()*+,;=:@/?#%-]*)?$";

/// Whether `text` matches [`URL_PATTERN`], written out by hand.
pub fn follows_url_pattern(text: &str) -> bool {
    url_grammar(text, false)
}

/// [`URL_PATTERN`], or the same with an IP literal (dotted IPv4 or a
/// bracketed IPv6) as the host.
fn follows_url_grammar(text: &str) -> bool {
    url_grammar(text, true)
}

fn url_grammar(text: &str, ip_literals: bool) -> bool {
    let Some(rest) = text
        .strip_prefix("https://")
        .or_else(|| text.strip_prefix("http://"))
    else {
        return false;
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let url_safe = |c: char| c.is_ascii_alphanumeric() || "._~!$&'()*+,;=:@/?#%-".contains(c);
    if !tail.chars().all(url_safe) {
        return false;
    }
    let (host_ok, port) = match authority.strip_prefix('[') {
        Some(bracketed) => {
            let Some((inner, after)) = bracketed.split_once(']') else {
                return false;
            };
            let ok = ip_literals
                && !inner.is_empty()
                && inner
                    .chars()
                    .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.');
            (ok, after)
        }
        None => {
            let split = authority.find(':').unwrap_or(authority.len());
            let (host, port) = authority.split_at(split);
            (
                is_dns_name(host) || (ip_literals && is_dotted_quad(host)),
                port,
            )
        }
    };
    host_ok
        && (port.is_empty()
            || port.strip_prefix(':').is_some_and(|digits| {
                !digits.starts_with('0')
                    && (1..=5).contains(&digits.len())
                    && digits.chars().all(|c| c.is_ascii_digit())
                    && digits
                        .parse::<u32>()
                        .is_ok_and(|p| (1..=65_535).contains(&p))
            }))
}

fn is_dns_name(host: &str) -> bool {
    let labels: Vec<&str> = host.split('.').collect();
    let last = labels.last().copied().unwrap_or("");
    labels.iter().all(|label| {
        !label.is_empty() && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    }) && last.starts_with(|c: char| c.is_ascii_alphabetic())
}

fn is_dotted_quad(host: &str) -> bool {
    let parts: Vec<&str> = host.split('.').collect();
    parts.len() == 4
        && parts
            .iter()
            .all(|p| (1..=3).contains(&p.len()) && p.chars().all(|c| c.is_ascii_digit()))
}

/// Checks an endpoint URL at registration: http or https, no credentials,
/// a host, and, when the host is an IP literal, a public one unless
/// `allow_private`. A host name is judged at each delivery, by the
/// addresses it resolves to ([`check_resolved`]). Returns the URL as
/// parsed (normalised), without a fragment.
pub fn check_url(text: &str, allow_private: bool) -> Result<url::Url, UrlRefusal> {
    if text.chars().count() > MAX_URL_INPUT_LEN {
        return Err(UrlRefusal::TooLong);
    }
    let mut url = url::Url::parse(text).map_err(|e| UrlRefusal::Malformed(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(UrlRefusal::Scheme);
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(UrlRefusal::Credentials);
    }
    if !follows_url_grammar(text) {
        return Err(UrlRefusal::Grammar);
    }
    let literal = match url.host() {
        None => return Err(UrlRefusal::NoHost),
        Some(url::Host::Domain("")) => return Err(UrlRefusal::NoHost),
        Some(url::Host::Domain(_)) => None,
        Some(url::Host::Ipv4(v4)) => Some(IpAddr::V4(v4)),
        Some(url::Host::Ipv6(v6)) => Some(IpAddr::V6(v6)),
    };
    if let Some(ip) = literal {
        let class = classify(ip);
        if !allow_private && !class.is_public() {
            return Err(UrlRefusal::Address(class.describe()));
        }
    }
    url.set_fragment(None);
    if url.as_str().len() > MAX_URL_LEN {
        return Err(UrlRefusal::TooLong);
    }
    Ok(url)
}

/// Judges the addresses a delivery's host resolved to: refused if there
/// are none, or if ANY is not public (unless `allow_private`); else the
/// address to connect to (the first), so that a second resolution cannot
/// switch it.
pub fn check_resolved(addresses: &[IpAddr], allow_private: bool) -> Result<IpAddr, String> {
    let first = *addresses
        .first()
        .ok_or_else(|| "the host did not resolve to any address".to_owned())?;
    if !allow_private {
        if let Some(bad) = addresses.iter().find(|ip| !classify(**ip).is_public()) {
            return Err(format!(
                "the host resolves to {bad}, {}; webhooks are only sent to public addresses",
                classify(*bad).describe()
            ));
        }
    }
    Ok(first)
}

/// How the wait between delivery attempts grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetrySchedule {
    /// The wait after the first failed attempt.
    pub initial_ms: i64,
    /// The longest one wait may be.
    pub max_step_ms: i64,
}

/// The wait after the `failed`-th failed attempt (from 1): `initial_ms`
/// doubling each time, spread by `jitter` (uniform in [0, 1)) over
/// ±20 %, never above `max_step_ms`, never below 1 ms.
pub fn retry_delay_ms(schedule: RetrySchedule, failed: u32, jitter: f64) -> i64 {
    let exponent = failed.saturating_sub(1).min(40);
    let base = schedule
        .initial_ms
        .max(1)
        .saturating_mul(1i64 << exponent)
        .min(schedule.max_step_ms.max(1));
    let spread = 0.8 + 0.4 * jitter.clamp(0.0, 1.0);
    ((base as f64 * spread) as i64).clamp(1, schedule.max_step_ms.max(1))
}

/// When an event whose `failed`-th attempt just failed at `now` is tried
/// next, or `None` when its retry window (`retry_for_ms` from
/// `window_start`) is over: the event is then dead. An attempt that fails
/// inside the window is always followed by another, so an event is
/// retried for at least the whole window.
pub fn next_attempt_at(
    schedule: RetrySchedule,
    failed: u32,
    now: Timestamp,
    window_start: Timestamp,
    retry_for_ms: i64,
    jitter: f64,
) -> Option<Timestamp> {
    (now < window_start + retry_for_ms).then(|| now + retry_delay_ms(schedule, failed, jitter))
}

/// When an endpoint that keeps failing is disabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DisableRule {
    /// Consecutive failed deliveries (any event) …
    pub after_failures: u32,
    /// … spanning at least this long since the first of them.
    pub after_ms: i64,
}

/// Whether an endpoint with `consecutive_failures` failed deliveries in a
/// row (this one included), failing since `failing_since`, is disabled
/// now. A success resets both.
pub fn should_disable(
    rule: DisableRule,
    consecutive_failures: u32,
    failing_since: Timestamp,
    now: Timestamp,
) -> bool {
    consecutive_failures >= rule.after_failures.max(1) && (now - failing_since) >= rule.after_ms
}

/// The reason recorded on an endpoint [`should_disable`] disables.
pub fn disabled_reason(
    consecutive_failures: u32,
    failing_since: Timestamp,
    now: Timestamp,
) -> String {
    let hours = (now - failing_since) as f64 / 3_600_000.0;
    format!(
        "disabled after {consecutive_failures} consecutive failed deliveries over {hours:.1} h; \
         fix the receiver, then enable the endpoint again"
    )
}

/// The rotations whose secrets sign a delivery at `now`: the current
/// generation, and the one before while its overlap lasts.
pub fn signing_generations(
    generation: i64,
    previous_valid_until: Option<Timestamp>,
    now: Timestamp,
) -> Vec<i64> {
    let mut generations = vec![generation];
    if generation > 1 && previous_valid_until.is_some_and(|until| now < until) {
        generations.push(generation - 1);
    }
    generations
}

/// The server's webhook key, from which every endpoint's signing secret
/// is derived. `Debug` never shows it.
#[derive(Clone)]
pub struct WebhookKey(Vec<u8>);

impl std::fmt::Debug for WebhookKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookKey(***)")
    }
}

/// An endpoint's signing secret for one generation: 32 bytes. Shown to
/// its owner once, as [`EndpointSecret::whsec`].
pub struct EndpointSecret([u8; 32]);

impl std::fmt::Debug for EndpointSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EndpointSecret(***)")
    }
}

impl WebhookKey {
    pub fn new(secret: &Secret) -> Self {
        Self(secret.expose().as_bytes().to_vec())
    }

    /// HMAC-SHA256(server key, "onejob-webhook:{endpoint}:{generation}").
    pub fn endpoint_secret(&self, endpoint_id: &str, generation: i64) -> EndpointSecret {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(format!("onejob-webhook:{endpoint_id}:{generation}").as_bytes());
        EndpointSecret(mac.finalize().into_bytes().into())
    }

    /// The `webhook-signature` header of a delivery: one `v1,<signature>`
    /// per generation in `generations`, space-separated.
    pub fn signature_header(
        &self,
        endpoint_id: &str,
        generations: &[i64],
        webhook_id: &str,
        timestamp: i64,
        body: &[u8],
    ) -> String {
        generations
            .iter()
            .map(|g| {
                self.endpoint_secret(endpoint_id, *g)
                    .sign(webhook_id, timestamp, body)
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

impl EndpointSecret {
    /// The secret as Standard Webhooks writes it: `whsec_<base64 key>`.
    pub fn whsec(&self) -> Secret {
        Secret::new(format!("whsec_{}", base64_encode(&self.0)))
    }

    /// A short public fingerprint (8 hex digits of its SHA-256), to tell
    /// secrets apart without showing them.
    pub fn fingerprint(&self) -> String {
        hex::encode(&Sha256::digest(self.0)[..4])
    }

    /// `v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`.
    pub fn sign(&self, webhook_id: &str, timestamp: i64, body: &[u8]) -> String {
        format!(
            "v1,{}",
            base64_encode(&sign_bytes(&self.0, webhook_id, timestamp, body))
        )
    }
}

/// The raw HMAC a Standard Webhooks signature carries.
pub fn sign_bytes(key: &[u8], webhook_id: &str, timestamp: i64, body: &[u8]) -> Vec<u8> {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(format!("{webhook_id}.{timestamp}.").as_bytes());
    mac.update(body);
    mac.finalize().into_bytes().to_vec()
}

/// Whether `header` (a `webhook-signature` value) holds a valid `v1`
/// signature by the `whsec_…` secret `secret`: what a receiver checks.
pub fn verify(secret: &str, header: &str, webhook_id: &str, timestamp: i64, body: &[u8]) -> bool {
    let Some(key) = secret.strip_prefix("whsec_").and_then(base64_decode) else {
        return false;
    };
    header.split(' ').any(|part| {
        part.strip_prefix("v1,")
            .and_then(base64_decode)
            .is_some_and(|sig| {
                let mut mac =
                    HmacSha256::new_from_slice(&key).expect("HMAC takes keys of any length");
                mac.update(format!("{webhook_id}.{timestamp}.").as_bytes());
                mac.update(body);
                mac.verify_slice(&sig).is_ok()
            })
    })
}

/// Standard base64, padding written on encoding and optional on decoding
/// (receivers' libraries differ).
const BASE64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// Standard base64 with padding.
pub fn base64_encode(bytes: &[u8]) -> String {
    base64::Engine::encode(&BASE64, bytes)
}

/// Standard base64 (padding optional); `None` for anything else.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    if text.len() > 1 << 20 {
        return None;
    }
    base64::Engine::decode(&BASE64, text).ok()
}

/// At most [`MAX_RESPONSE_BODY`] bytes of an answer's body, as text (cut
/// at a character boundary; invalid UTF-8 replaced).
pub fn truncate_response(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX_RESPONSE_BODY)]).into_owned();
    let mut end = text.len().min(MAX_RESPONSE_BODY);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// What an event says about its job (never a secret, never the input).
#[derive(Debug, Clone)]
pub struct EventData<'a> {
    pub job_id: &'a str,
    pub owner_id: &'a str,
    pub status: &'a str,
    pub idempotency_key: &'a str,
    pub task: &'a str,
    pub provider: &'a str,
    pub completed_by: Option<&'a str>,
    pub failure_reason: Option<&'a str>,
    /// The job's result (JSON text), for `job.succeeded`.
    pub result: Option<&'a str>,
    /// The attempt that went unknown, for `job.unknown`.
    pub attempt_id: Option<&'a str>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// The event's body, fixed when the event is recorded: every retry and
/// resend sends these bytes.
pub fn event_body(kind: EventKind, data: &EventData<'_>, at: Timestamp) -> String {
    let result = data
        .result
        .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok());
    let body = serde_json::json!({
        "type": kind.as_str(),
        "timestamp": at.rfc3339(),
        "data": {
            "id": data.job_id,
            "status": data.status,
            "owner": data.owner_id,
            "idempotency_key": data.idempotency_key,
            "task": data.task,
            "provider": data.provider,
            "completed_by": data.completed_by,
            "failure_reason": data.failure_reason,
            "attempt_id": data.attempt_id,
            "result": result,
            "created_at": data.created_at.rfc3339(),
            "updated_at": data.updated_at.rfc3339(),
        }
    });
    body.to_string()
}

/// A fresh Standard Webhooks message id: `msg_<uuid>`.
pub fn new_webhook_id() -> String {
    format!("msg_{}", uuid::Uuid::now_v7().simple())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn addresses_are_classified_v4_and_v6() {
        use AddressClass::*;
        for (text, class) in [
            ("8.8.8.8", Public),
            ("1.1.1.1", Public),
            ("127.0.0.1", Loopback),
            ("127.255.0.9", Loopback),
            ("10.1.2.3", Private),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("172.32.0.1", Public),
            ("192.168.1.1", Private),
            ("169.254.169.254", LinkLocal),
            ("0.0.0.0", Unspecified),
            ("224.0.0.1", Multicast),
            ("255.255.255.255", Multicast),
            ("100.64.0.1", SharedAddressSpace),
            ("100.127.255.255", SharedAddressSpace),
            ("100.128.0.1", Public),
            ("192.0.2.10", Documentation),
            ("198.51.100.1", Documentation),
            ("203.0.113.5", Documentation),
            ("240.0.0.1", Reserved),
            ("::1", Loopback),
            ("::", Unspecified),
            ("fe80::1", LinkLocal),
            ("fc00::1", UniqueLocal),
            ("fd12:3456::1", UniqueLocal),
            ("ff02::1", Multicast),
            ("2001:db8::1", Documentation),
            ("2606:4700:4700::1111", Public),
            ("::ffff:127.0.0.1", Loopback),
            ("::ffff:10.0.0.1", Private),
            ("::ffff:8.8.8.8", Public),
            ("::127.0.0.1", Loopback),
        ] {
            assert_eq!(classify(ip(text)), class, "{text}");
        }
    }

    fn busy(owners: &[(&str, &str, usize)]) -> InFlight {
        let mut in_flight = InFlight::default();
        for (owner, endpoint, n) in owners {
            for _ in 0..*n {
                in_flight.start(owner, endpoint);
            }
        }
        in_flight
    }

    const CAPS: DeliveryCaps = DeliveryCaps {
        total: 6,
        per_owner: 3,
        per_endpoint: 2,
    };

    /// An owner with many due events takes turns with an owner with one,
    /// within the free slots and each cap.
    #[test]
    fn owners_take_turns_within_their_caps() {
        let idle = InFlight::default();
        let due: Vec<(&str, &str)> = [
            ("mallory", "m1"),
            ("mallory", "m1"),
            ("mallory", "m1"),
            ("mallory", "m2"),
            ("mallory", "m3"),
            ("alice", "a1"),
            ("bob", "b1"),
        ]
        .to_vec();
        // Round one: each owner's oldest; round two: mallory's next (m1,
        // within its endpoint cap); round three: m2 (m1 is full). Then
        // mallory is at its owner cap.
        assert_eq!(take_turns(&due, CAPS, &idle), vec![0, 5, 6, 1, 3]);
        // Mallory already has two in flight: one more turn, then alice's
        // and bob's come in the free slots.
        let two = busy(&[("mallory", "m1", 2)]);
        assert_eq!(take_turns(&due, CAPS, &two), vec![3, 5, 6]);
        assert_eq!(two.full(CAPS), (vec![], vec!["m1".to_owned()]));
        // No free slot, nothing taken.
        let mut full = busy(&[
            ("mallory", "m1", 2),
            ("mallory", "m2", 1),
            ("carol", "c1", 3),
        ]);
        assert_eq!(full.full(CAPS).0.len(), 2);
        assert!(take_turns(&due, CAPS, &full).is_empty());
        full.end("carol", "c1");
        assert_eq!(take_turns(&due, CAPS, &full), vec![5]);
        assert!(may_register_endpoint(9, 10));
        assert!(!may_register_endpoint(10, 10));
    }

    /// Every IPv6 form that carries an IPv4 address is judged by it.
    #[test]
    fn ipv6_forms_that_carry_an_ipv4_address_are_judged_by_it() {
        use AddressClass::*;
        for (text, class) in [
            // NAT64, the well-known prefix.
            ("64:ff9b::a9fe:a9fe", LinkLocal),
            ("64:ff9b::169.254.169.254", LinkLocal),
            ("64:ff9b::127.0.0.1", Loopback),
            ("64:ff9b::10.0.0.1", Private),
            ("64:ff9b::8.8.8.8", Public),
            // NAT64, local use: refused whole.
            ("64:ff9b:1::8.8.8.8", Reserved),
            ("64:ff9b:1:ffff::1", Reserved),
            // 6to4.
            ("2002:7f00:1::1", Loopback),
            ("2002:a9fe:a9fe::1", LinkLocal),
            ("2002:c0a8:101::", Private),
            ("2002:808:808::1", Public),
            // IPv4-mapped and IPv4-translated.
            ("::ffff:169.254.169.254", LinkLocal),
            ("::ffff:0:169.254.169.254", LinkLocal),
            ("::ffff:0:a00:1", Private),
            ("::ffff:0:8.8.8.8", Public),
            // IPv4-compatible.
            ("::a9fe:a9fe", LinkLocal),
            ("::10.1.2.3", Private),
            ("::8.8.8.8", Public),
            // Teredo: the server (bits 32-63) and the inverted client.
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", Documentation),
            ("2001:0:4136:e378::80ff:fffe", Loopback),
            ("2001:0:a00:1:8000:63bf:f7f7:f7f7", Private),
            ("2001:0:a9fe:a9fe::f7f7:f7f7", LinkLocal),
            ("2001:0:808:808::f7f7:f7f7", Public),
        ] {
            assert_eq!(classify(ip(text)), class, "{text}");
        }
        // At registration (a literal address) and after DNS alike.
        for text in [
            "http://[64:ff9b::a9fe:a9fe]/",
            "http://[2002:a9fe:a9fe::1]/",
            "http://[::ffff:0:a9fe:a9fe]/",
            "http://[::a9fe:a9fe]/",
            "http://[2001:0:4136:e378::5601:5601]/",
            "http://[64:ff9b:1::1]/",
        ] {
            assert!(check_url(text, false).is_err(), "{text}");
            let host = url::Url::parse(text).unwrap();
            let Some(url::Host::Ipv6(v6)) = host.host() else {
                panic!("{text}")
            };
            assert!(check_resolved(&[IpAddr::V6(v6)], false).is_err(), "{text}");
        }
    }

    #[test]
    fn urls_are_checked_at_registration() {
        assert!(check_url("https://hooks.example.com/in?x=1", false).is_ok());
        assert_eq!(
            check_url("ftp://example.com/", false),
            Err(UrlRefusal::Scheme)
        );
        assert_eq!(
            check_url("https://user:pw@example.com/", false),
            Err(UrlRefusal::Credentials)
        );
        assert!(matches!(
            check_url("http://127.0.0.1:9000/", false),
            Err(UrlRefusal::Address(_))
        ));
        assert!(matches!(
            check_url("http://[::ffff:192.168.0.1]/", false),
            Err(UrlRefusal::Address(_))
        ));
        assert!(matches!(
            check_url("http://[fd00::1]/", false),
            Err(UrlRefusal::Address(_))
        ));
        assert!(check_url("http://127.0.0.1:9000/", true).is_ok());
        // A name is judged when it is resolved, at delivery.
        assert!(check_url("http://localhost:9000/", false).is_ok());
        assert!(matches!(
            check_url("not a url", false),
            Err(UrlRefusal::Malformed(_))
        ));
        let long = format!("https://example.com/{}", "a".repeat(MAX_URL_LEN));
        assert_eq!(check_url(&long, false), Err(UrlRefusal::TooLong));
        // The schema's `maxLength` is the input limit: one character more
        // is refused even when the fragment it sits in would be dropped.
        let prefix = "https://example.com/x#";
        let at_limit = format!("{prefix}{}", "a".repeat(MAX_URL_INPUT_LEN - prefix.len()));
        assert!(check_url(&at_limit, false).is_ok());
        let over = format!("{at_limit}a");
        assert_eq!(check_url(&over, false), Err(UrlRefusal::TooLong));
        let bare_host = format!("https://{}.com", "a".repeat(MAX_URL_INPUT_LEN - 12));
        assert_eq!(bare_host.len(), MAX_URL_INPUT_LEN);
        // Its stored form gains a `/` and still fits.
        let stored = check_url(&bare_host, false).unwrap();
        assert_eq!(stored.as_str().len(), MAX_URL_LEN);
        assert_eq!(
            check_url("https://example.com/x#frag", false)
                .unwrap()
                .as_str(),
            "https://example.com/x"
        );
    }

    #[test]
    fn urls_outside_the_documented_grammar_are_refused() {
        for good in [
            "https://hooks.example.com",
            "http://localhost:65535/in?x=%20y#f",
            "https://a-b.c0/",
        ] {
            assert!(follows_url_pattern(good), "{good}");
            assert!(check_url(good, true).is_ok(), "{good}");
        }
        // IP literals: outside the documented pattern, taken all the same.
        assert!(!follows_url_pattern("http://127.0.0.1:41234/x"));
        assert!(check_url("http://127.0.0.1:41234/x", true).is_ok());
        assert!(check_url("http://[::1]:8080/", true).is_ok());
        for bad in [
            "https://q0Z*",
            " https://example.com",
            "HTTPS://example.com",
            "https://example.com:0/",
            "https://example.com:123456/",
            "https://example.com:65536/",
            "https://exa mple.com/",
            "https://example.com/a b",
            "https://example.com/\u{e9}",
            "https://example.com./",
            "https://1example.9/",
            "https://[]/",
        ] {
            assert!(!follows_url_grammar(bad), "{bad}");
            assert!(check_url(bad, true).is_err(), "{bad}");
        }
    }

    #[test]
    fn resolved_addresses_are_refused_if_any_is_not_public() {
        assert_eq!(check_resolved(&[ip("8.8.8.8")], false), Ok(ip("8.8.8.8")));
        assert!(check_resolved(&[ip("8.8.8.8"), ip("127.0.0.1")], false).is_err());
        assert!(check_resolved(&[], true).is_err());
        assert_eq!(
            check_resolved(&[ip("127.0.0.1")], true),
            Ok(ip("127.0.0.1"))
        );
    }

    #[test]
    fn the_retry_schedule_doubles_is_capped_and_ends_with_the_window() {
        let s = RetrySchedule {
            initial_ms: 5_000,
            max_step_ms: 3_600_000,
        };
        assert_eq!(retry_delay_ms(s, 1, 0.5), 5_000);
        assert_eq!(retry_delay_ms(s, 2, 0.5), 10_000);
        assert_eq!(retry_delay_ms(s, 3, 0.5), 20_000);
        assert_eq!(retry_delay_ms(s, 30, 0.5), 3_600_000);
        assert_eq!(retry_delay_ms(s, 30, 0.99), 3_600_000);
        assert_eq!(retry_delay_ms(s, 1, 0.0), 4_000);
        assert!(retry_delay_ms(s, 1, 0.999) <= 6_000);
        assert_eq!(retry_delay_ms(s, u32::MAX, 0.5), 3_600_000);
        let day = 86_400_000;
        let start = Timestamp::EPOCH;
        assert_eq!(
            next_attempt_at(s, 1, at(1_000), at(1_000), day, 0.5),
            Some(at(6_000))
        );
        assert_eq!(next_attempt_at(s, 9, at(day), start, day, 0.5), None);
        // Retried until at least the end of the window.
        let mut now = start;
        let mut failed = 0;
        while let Some(next) = next_attempt_at(s, failed + 1, now, start, day, 0.5) {
            failed += 1;
            now = next;
        }
        assert!(now >= at(day), "last try at {now:?}");
        assert!(failed < 100);
    }

    #[test]
    fn an_endpoint_is_disabled_after_enough_failures_over_enough_time() {
        let rule = DisableRule {
            after_failures: 20,
            after_ms: 3_600_000,
        };
        let start = Timestamp::EPOCH;
        assert!(!should_disable(rule, 19, start, at(10 * 3_600_000)));
        assert!(!should_disable(rule, 20, start, at(3_599_999)));
        assert!(should_disable(rule, 20, start, at(3_600_000)));
        let quick = DisableRule {
            after_failures: 3,
            after_ms: 0,
        };
        assert!(should_disable(quick, 3, at(5), at(5)));
    }

    #[test]
    fn subscriptions_are_kept_sorted_each_kind_once() {
        let kinds = subscription(&[
            EventKind::JobSucceeded,
            EventKind::JobFailed,
            EventKind::JobFailed,
        ]);
        assert_eq!(kinds, vec![EventKind::JobFailed, EventKind::JobSucceeded]);
        assert!(subscribes(&kinds, EventKind::JobFailed));
        assert!(!subscribes(&kinds, EventKind::JobUnknown));
        assert!(!records_event(false, &kinds, EventKind::JobFailed));
        assert_eq!(parse_events(&[]), Err(EventsRefusal::Empty));
        assert!(matches!(
            parse_events(&["job.done".to_owned()]),
            Err(EventsRefusal::Unknown(_))
        ));
    }

    #[test]
    fn signatures_follow_standard_webhooks() {
        // The example from the Standard Webhooks specification.
        let key = base64_decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        let sig = sign_bytes(&key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body);
        assert_eq!(
            base64_encode(&sig),
            "g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        assert!(verify(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "v1,nope v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            body
        ));
        assert!(!verify(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232315}"#
        ));
    }

    #[test]
    fn secrets_are_derived_per_endpoint_and_generation() {
        let key = WebhookKey::new(&Secret::new("k".repeat(32)));
        let a1 = key.endpoint_secret("a", 1).whsec();
        assert_eq!(a1, key.endpoint_secret("a", 1).whsec());
        assert_ne!(a1, key.endpoint_secret("a", 2).whsec());
        assert_ne!(a1, key.endpoint_secret("b", 1).whsec());
        assert!(a1.expose().starts_with("whsec_"));
        let header = key.signature_header("a", &[2, 1], "msg_x", 10, b"{}");
        assert_eq!(header.split(' ').count(), 2);
        assert!(verify(a1.expose(), &header, "msg_x", 10, b"{}"));
        assert!(verify(
            key.endpoint_secret("a", 2).whsec().expose(),
            &header,
            "msg_x",
            10,
            b"{}"
        ));
        assert_eq!(signing_generations(2, Some(at(100)), at(99)), vec![2, 1]);
        assert_eq!(signing_generations(2, Some(at(100)), at(100)), vec![2]);
        assert_eq!(signing_generations(1, None, Timestamp::EPOCH), vec![1]);
        assert_eq!(
            format!("{:?}", key.endpoint_secret("a", 1)),
            "EndpointSecret(***)"
        );
    }

    #[test]
    fn base64_round_trips() {
        for n in 0..40 {
            let bytes: Vec<u8> = (0..n).map(|i| (i * 37 + 11) as u8).collect();
            assert_eq!(base64_decode(&base64_encode(&bytes)).unwrap(), bytes);
        }
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
        assert_eq!(base64_decode("Zm8"), Some(b"fo".to_vec()));
        assert_eq!(base64_decode("Zm!="), None);
    }

    #[test]
    fn a_response_body_is_cut_at_one_kib_on_a_character_boundary() {
        let body = "é".repeat(1000);
        let cut = truncate_response(body.as_bytes());
        assert!(cut.len() <= MAX_RESPONSE_BODY);
        assert!(cut.chars().all(|c| c == 'é'));
        assert_eq!(truncate_response(b"ok"), "ok");
    }
}
