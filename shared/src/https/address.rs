//! The SSRF guard's address rules: which IP addresses a destination may reach.
//!
//! A destination URL is user configuration, and einmal runs inside someone's network
//! (a VPC, a laptop): without a guard, `https://169.254.169.254/…` would post to the
//! instance metadata service. Public addresses are always allowed; loopback only when
//! the URL names loopback itself (local development); private, link-local and shared
//! (CGNAT) addresses only with the destination's `allow_private`; unspecified,
//! multicast, broadcast and reserved addresses never. IPv4-mapped and IPv4-compatible
//! IPv6 forms are judged as the IPv4 address they carry.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What kind of address an IP is, for the guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    Public,
    /// 127.0.0.0/8, ::1.
    Loopback,
    /// 10/8, 172.16/12, 192.168/16, fc00::/7.
    Private,
    /// 169.254/16 (the cloud metadata address 169.254.169.254 among them), fe80::/10.
    LinkLocal,
    /// 100.64/10, carrier-grade NAT: someone's internal network.
    SharedNat,
    /// 0.0.0.0/8, ::.
    Unspecified,
    /// 224/4, ff00::/8.
    Multicast,
    /// 240/4 (255.255.255.255 among them) and IPv6 ranges that are not unicast.
    Reserved,
}

impl fmt::Display for AddressClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AddressClass::Public => "public",
            AddressClass::Loopback => "loopback",
            AddressClass::Private => "private",
            AddressClass::LinkLocal => "link-local",
            AddressClass::SharedNat => "shared (CGNAT)",
            AddressClass::Unspecified => "unspecified",
            AddressClass::Multicast => "multicast",
            AddressClass::Reserved => "reserved",
        })
    }
}

pub fn classify(ip: IpAddr) -> AddressClass {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> AddressClass {
    let [a, b, ..] = ip.octets();
    match (a, b) {
        (0, _) => AddressClass::Unspecified,
        (127, _) => AddressClass::Loopback,
        (10, _) | (192, 168) => AddressClass::Private,
        (172, 16..=31) => AddressClass::Private,
        (169, 254) => AddressClass::LinkLocal,
        (100, 64..=127) => AddressClass::SharedNat,
        (224..=239, _) => AddressClass::Multicast,
        (240..=255, _) => AddressClass::Reserved,
        _ => AddressClass::Public,
    }
}

fn classify_v6(ip: Ipv6Addr) -> AddressClass {
    if ip.is_unspecified() {
        return AddressClass::Unspecified;
    }
    if ip.is_loopback() {
        return AddressClass::Loopback;
    }
    let segments = ip.segments();
    // ::ffff:a.b.c.d (mapped) and the deprecated ::a.b.c.d (compatible) reach the IPv4
    // address they carry.
    if let Some(v4) = ip.to_ipv4_mapped() {
        return classify_v4(v4);
    }
    if segments[..6] == [0; 6] {
        return classify_v4(Ipv4Addr::from(
            (u32::from(segments[6]) << 16) | u32::from(segments[7]),
        ));
    }
    match segments[0] {
        s if s & 0xfe00 == 0xfc00 => AddressClass::Private,
        s if s & 0xffc0 == 0xfe80 => AddressClass::LinkLocal,
        s if s & 0xff00 == 0xff00 => AddressClass::Multicast,
        // Global unicast is 2000::/3; everything else is reserved or special.
        s if s & 0xe000 == 0x2000 => AddressClass::Public,
        _ => AddressClass::Reserved,
    }
}

/// What one destination may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AddressPolicy {
    /// The URL's host is loopback itself (`localhost`, `127.0.0.1`, `[::1]`).
    pub loopback: bool,
    /// The destination's `allow_private`.
    pub private: bool,
}

impl AddressPolicy {
    /// `None` when `ip` may be reached, else why not (names the address class, which
    /// the destination owner needs to fix the configuration).
    pub fn refusal(&self, ip: IpAddr) -> Option<String> {
        let class = classify(ip);
        let allowed = match class {
            AddressClass::Public => true,
            AddressClass::Loopback => self.loopback,
            AddressClass::Private | AddressClass::LinkLocal | AddressClass::SharedNat => {
                self.private
            }
            AddressClass::Unspecified | AddressClass::Multicast | AddressClass::Reserved => false,
        };
        (!allowed).then(|| {
            let hint = match class {
                AddressClass::Loopback => {
                    " (loopback is allowed only when the URL names it: localhost, 127.0.0.1, [::1])"
                }
                AddressClass::Private | AddressClass::LinkLocal | AddressClass::SharedNat => {
                    " (set `allow_private = true` on the destination to allow it)"
                }
                _ => "",
            };
            format!("refused to connect to {class} address {ip}{hint}")
        })
    }
}

/// Is `host` (a URL's host, IPv6 without brackets or with) loopback by name or literal?
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    // A fully qualified `localhost.` is the same name.
    let host = host.strip_suffix('.').unwrap_or(host);
    host.eq_ignore_ascii_case("localhost")
        || host.to_ascii_lowercase().ends_with(".localhost")
        || host
            .parse::<IpAddr>()
            .is_ok_and(|ip| classify(ip) == AddressClass::Loopback)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(s: &str) -> AddressClass {
        classify(s.parse().unwrap())
    }

    #[test]
    fn addresses_are_classified() {
        for public in [
            "8.8.8.8",
            "1.1.1.1",
            "172.15.0.1",
            "172.32.0.1",
            "100.63.255.255",
            "100.128.0.1",
            "2606:4700::1111",
            "192.169.0.1",
        ] {
            assert_eq!(class(public), AddressClass::Public, "{public}");
        }
        for (ip, c) in [
            ("127.0.0.1", AddressClass::Loopback),
            ("127.255.0.9", AddressClass::Loopback),
            ("::1", AddressClass::Loopback),
            ("10.0.0.1", AddressClass::Private),
            ("172.16.0.1", AddressClass::Private),
            ("172.31.255.255", AddressClass::Private),
            ("192.168.1.1", AddressClass::Private),
            ("fc00::1", AddressClass::Private),
            ("fd12:3456::1", AddressClass::Private),
            ("169.254.169.254", AddressClass::LinkLocal),
            ("fe80::1", AddressClass::LinkLocal),
            ("100.64.0.1", AddressClass::SharedNat),
            ("100.127.255.255", AddressClass::SharedNat),
            ("0.0.0.0", AddressClass::Unspecified),
            ("0.1.2.3", AddressClass::Unspecified),
            ("::", AddressClass::Unspecified),
            ("224.0.0.1", AddressClass::Multicast),
            ("ff02::1", AddressClass::Multicast),
            ("255.255.255.255", AddressClass::Reserved),
            ("240.0.0.1", AddressClass::Reserved),
            // IPv4-mapped and -compatible forms are the IPv4 address they carry.
            ("::ffff:169.254.169.254", AddressClass::LinkLocal),
            ("::ffff:10.0.0.1", AddressClass::Private),
            ("::ffff:127.0.0.1", AddressClass::Loopback),
            ("::ffff:8.8.8.8", AddressClass::Public),
            ("::10.0.0.1", AddressClass::Private),
        ] {
            assert_eq!(class(ip), c, "{ip}");
        }
    }

    #[test]
    fn the_policy_allows_public_and_what_the_destination_allows() {
        let strict = AddressPolicy::default();
        assert_eq!(strict.refusal("8.8.8.8".parse().unwrap()), None);
        let metadata = strict.refusal("169.254.169.254".parse().unwrap()).unwrap();
        assert!(
            metadata.contains("link-local address 169.254.169.254"),
            "{metadata}"
        );
        assert!(metadata.contains("allow_private"), "{metadata}");
        assert!(strict.refusal("127.0.0.1".parse().unwrap()).is_some());
        let local = AddressPolicy {
            loopback: true,
            private: false,
        };
        assert_eq!(local.refusal("127.0.0.1".parse().unwrap()), None);
        assert_eq!(local.refusal("::1".parse().unwrap()), None);
        assert!(local.refusal("10.0.0.1".parse().unwrap()).is_some());
        let internal = AddressPolicy {
            loopback: false,
            private: true,
        };
        for ip in ["10.0.0.1", "fd00::1", "169.254.1.1", "100.64.0.1"] {
            assert_eq!(internal.refusal(ip.parse().unwrap()), None, "{ip}");
        }
        // Never, whatever the options.
        let all = AddressPolicy {
            loopback: true,
            private: true,
        };
        for ip in ["0.0.0.0", "::", "224.0.0.1", "255.255.255.255"] {
            assert!(all.refusal(ip.parse().unwrap()).is_some(), "{ip}");
        }
    }

    #[test]
    fn loopback_hosts_by_name_and_literal() {
        for host in [
            "localhost",
            "LOCALHOST",
            "app.localhost",
            "127.0.0.1",
            "127.1.2.3",
            "[::1]",
            "::1",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "example.com",
            "localhost.example.com",
            "10.0.0.1",
            "[::2]",
            "8.8.8.8",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }
}
