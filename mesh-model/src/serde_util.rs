//! Serde helpers shared by the state types.
//!
//! Config files are written by hand, so parsing is a little more forgiving than Istio's
//! derived impls (a port key may be quoted, a CIDR may be a bare IP) while everything
//! Istio accepts still parses. Dumps serialize maps in sorted order so `/config_dump`
//! output is stable between calls.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::Deserialize as _;

/// A port number written either as an integer (`80`) or as a string (`"80"`).
struct PortKey(u16);

impl<'de> serde::Deserialize<'de> for PortKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = PortKey;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a port number (0-65535)")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<PortKey, E> {
                u16::try_from(v)
                    .map(PortKey)
                    .map_err(|_| E::custom(format!("port {v} is out of range (0-65535)")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<PortKey, E> {
                u16::try_from(v)
                    .map(PortKey)
                    .map_err(|_| E::custom(format!("port {v} is out of range (0-65535)")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<PortKey, E> {
                v.trim()
                    .parse::<u16>()
                    .map(PortKey)
                    .map_err(|_| E::custom(format!("invalid port {v:?}")))
            }
        }
        d.deserialize_any(V)
    }
}

/// `{svcPort: targetPort}` maps.
pub mod port_map {
    use super::*;

    /// Reads a port map whose keys and values may be integers or strings; `null`
    /// gives an empty map.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<HashMap<u16, u16>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = HashMap<u16, u16>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of service port to target port")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(HashMap::new())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                let mut out = HashMap::new();
                while let Some(PortKey(k)) = m.next_key()? {
                    let PortKey(v) = m.next_value()?;
                    out.insert(k, v);
                }
                Ok(out)
            }
        }
        d.deserialize_any(V)
    }

    /// Writes the map ordered by service port.
    pub fn serialize<S: Serializer>(m: &HashMap<u16, u16>, s: S) -> Result<S::Ok, S::Error> {
        let sorted: BTreeMap<_, _> = m.iter().collect();
        let mut out = s.serialize_map(Some(sorted.len()))?;
        for (k, v) in sorted {
            out.serialize_entry(k, v)?;
        }
        out.end()
    }
}

/// A workload's `services`: `{"ns/hostname": {svcPort: targetPort}}`.
pub mod service_port_maps {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Ports(#[serde(with = "super::port_map")] HashMap<u16, u16>);

    type Map = HashMap<String, HashMap<u16, u16>>;

    /// Reads the map; `null`, for the whole map or for one service's ports, gives an
    /// empty map.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Map, D::Error> {
        let raw: Option<HashMap<String, Option<Ports>>> = serde::Deserialize::deserialize(d)?;
        Ok(raw
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.map(|p| p.0).unwrap_or_default()))
            .collect())
    }

    /// Writes the map ordered by service key, then by service port.
    pub fn serialize<S: Serializer>(m: &Map, s: S) -> Result<S::Ok, S::Error> {
        let sorted: BTreeMap<_, BTreeMap<_, _>> =
            m.iter().map(|(k, v)| (k, v.iter().collect())).collect();
        serde::Serialize::serialize(&sorted, s)
    }
}

/// Lists of CIDRs. A bare IP means the single host (`/32` or `/128`); an invalid entry
/// fails the whole load with the offending text in the message.
pub mod cidr_list {
    use super::*;

    /// Parses one CIDR, or a bare IP as a single-host network; the error quotes the input.
    pub fn parse(text: &str) -> Result<IpNet, String> {
        let t = text.trim();
        if let Ok(net) = t.parse::<IpNet>() {
            return Ok(net);
        }
        if let Ok(ip) = t.parse::<IpAddr>() {
            return Ok(IpNet::from(ip));
        }
        Err(format!(
            "invalid CIDR {text:?} (expected e.g. \"10.0.0.0/8\", \"fd00::/64\" or a single IP)"
        ))
    }

    /// Reads a list of CIDRs (`null` gives an empty list).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IpNet>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Vec<IpNet>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of CIDRs")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Vec::new())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    out.push(parse(&s).map_err(de::Error::custom)?);
                }
                Ok(out)
            }
        }
        d.deserialize_any(V)
    }

    /// Writes each network as `<ip>/<prefix length>` text.
    pub fn serialize<S: Serializer>(v: &[IpNet], s: S) -> Result<S::Ok, S::Error> {
        let mut out = s.serialize_seq(Some(v.len()))?;
        for n in v {
            out.serialize_element(&n.to_string())?;
        }
        out.end()
    }
}

/// `null` is accepted wherever a list or map is optional (`principals:` with no entries).
pub fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: serde::Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Used by `skip_serializing_if` to keep dumps short.
pub fn is_default<T: Default + PartialEq>(t: &T) -> bool {
    *t == T::default()
}
