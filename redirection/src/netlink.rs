//! Policy routing for ztunnel's transparent sockets, in the CURRENT thread's netns:
//! `ip rule add fwmark 0x111/0xfff pref 32764 lookup 100` and
//! `ip route add local 0.0.0.0/0 dev lo table 100` (and `local ::/0` for IPv6).
//!
//! The netlink socket is created on the calling thread, so it lives in whatever netns
//! that thread has entered; each call runs its own single-threaded tokio runtime so it
//! never depends on (or moves) the caller's runtime. Call it from a plain thread (a
//! netns job), not from async code.

use super::rules::IpFamily;
use futures::TryStreamExt as _;
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use rtnetlink::packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use rtnetlink::{Handle, IpVersion, RouteMessageBuilder};
use shared_types::constants::{CONNMARK, CONNMARK_MASK, ROUTE_RULE_PRIORITY, ROUTE_TABLE};
use std::net::{Ipv4Addr, Ipv6Addr};

/// Why the policy routing could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// The netlink socket or the tokio runtime could not be created.
    #[error("netlink socket or runtime: {0}")]
    Io(#[from] std::io::Error),
    /// The kernel refused a netlink request.
    #[error("{op}: {source}")]
    Request {
        /// What was being done (e.g. `adding fwmark rule`).
        op: &'static str,
        /// The rtnetlink error.
        #[source]
        source: rtnetlink::Error,
    },
    /// The netns has no `lo` interface for the local route.
    #[error("no loopback interface in this netns: {0}")]
    NoLoopback(nix::Error),
    /// Called on a thread inside a tokio runtime, where blocking on its own would panic.
    #[error("called from async code; run it inside a netns job (NetnsHandle::run)")]
    InsideRuntime,
}

/// The fwmark rule and local route, as values (defaults are Istio's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyRouting {
    /// The mark the rule matches (`fwmark`).
    pub fwmark: u32,
    /// The mask applied to the mark before matching.
    pub mask: u32,
    /// The rule's priority (`pref`).
    pub priority: u32,
    /// The routing table holding the local route (`lookup`).
    pub table: u32,
}

impl Default for PolicyRouting {
    fn default() -> Self {
        PolicyRouting {
            fwmark: CONNMARK,
            mask: CONNMARK_MASK,
            priority: ROUTE_RULE_PRIORITY,
            table: ROUTE_TABLE,
        }
    }
}

/// What [`PolicyRouting::state`] found for one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoutingState {
    /// Our fwmark rule exists.
    pub rule: bool,
    /// Our local route exists.
    pub route: bool,
}

impl PolicyRouting {
    /// Adds the rule and route for each family; existing ones are fine.
    pub fn add(&self, families: &[IpFamily]) -> Result<(), NetlinkError> {
        self.with_handle(|handle| async move {
            let lo = loopback_index()?;
            for &family in families {
                // Route first: the rule must never point at an empty table.
                let route = handle.route().add(self.route_message(family, lo)).execute();
                tolerate(errno::EEXIST, route.await).map_err(|source| NetlinkError::Request {
                    op: "adding local route",
                    source,
                })?;
                tolerate(errno::EEXIST, self.add_rule(&handle, family).await).map_err(
                    |source| NetlinkError::Request {
                        op: "adding fwmark rule",
                        source,
                    },
                )?;
            }
            Ok(())
        })
    }

    /// Removes the rule and route for each family; absent ones are fine.
    pub fn remove(&self, families: &[IpFamily]) -> Result<(), NetlinkError> {
        self.with_handle(|handle| async move {
            for &family in families {
                // Rule first, so marked packets never look up an emptied table.
                for rule in self.find_rules(&handle, family).await? {
                    tolerate(errno::ENOENT, handle.rule().del(rule).execute().await).map_err(
                        |source| NetlinkError::Request {
                            op: "deleting fwmark rule",
                            source,
                        },
                    )?;
                }
                for route in self.find_routes(&handle, family).await? {
                    tolerate(errno::ESRCH, handle.route().del(route).execute().await).map_err(
                        |source| NetlinkError::Request {
                            op: "deleting local route",
                            source,
                        },
                    )?;
                }
            }
            Ok(())
        })
    }

    /// Whether the rule and route exist for `family`.
    pub fn state(&self, family: IpFamily) -> Result<RoutingState, NetlinkError> {
        self.with_handle(|handle| async move {
            Ok(RoutingState {
                rule: !self.find_rules(&handle, family).await?.is_empty(),
                route: !self.find_routes(&handle, family).await?.is_empty(),
            })
        })
    }

    fn with_handle<'a, T, Fut>(&'a self, job: impl FnOnce(Handle) -> Fut) -> Result<T, NetlinkError>
    where
        Fut: std::future::Future<Output = Result<T, NetlinkError>> + 'a,
    {
        // block_on inside a runtime would panic; netns jobs run on plain threads.
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(NetlinkError::InsideRuntime);
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()?;
        rt.block_on(async {
            // Created here, on this thread, so the socket lives in this thread's netns.
            let (conn, handle, _) = rtnetlink::new_connection()?;
            let task = tokio::spawn(conn);
            let result = job(handle).await;
            task.abort();
            result
        })
    }

    async fn add_rule(&self, handle: &Handle, family: IpFamily) -> Result<(), rtnetlink::Error> {
        let base = handle
            .rule()
            .add()
            .action(RuleAction::ToTable)
            .table_id(self.table)
            .priority(self.priority)
            .fw_mark(self.fwmark);
        // The builder has no mask setter; the attribute is FRA_FWMASK.
        let mask = RuleAttribute::FwMask(self.mask);
        match family {
            IpFamily::V4 => {
                let mut req = base.v4();
                req.message_mut().attributes.push(mask);
                req.execute().await
            }
            IpFamily::V6 => {
                let mut req = base.v6();
                req.message_mut().attributes.push(mask);
                req.execute().await
            }
        }
    }

    fn route_message(&self, family: IpFamily, lo: u32) -> RouteMessage {
        match family {
            IpFamily::V4 => RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(Ipv4Addr::UNSPECIFIED, 0)
                .output_interface(lo)
                .table_id(self.table)
                .kind(RouteType::Local)
                .scope(RouteScope::Host)
                .protocol(RouteProtocol::Boot)
                .build(),
            IpFamily::V6 => RouteMessageBuilder::<Ipv6Addr>::new()
                .destination_prefix(Ipv6Addr::UNSPECIFIED, 0)
                .output_interface(lo)
                .table_id(self.table)
                .kind(RouteType::Local)
                .scope(RouteScope::Host)
                .protocol(RouteProtocol::Boot)
                .build(),
        }
    }

    /// Our rules: this fwmark/mask, priority and table.
    async fn find_rules(
        &self,
        handle: &Handle,
        family: IpFamily,
    ) -> Result<Vec<RuleMessage>, NetlinkError> {
        let rules: Vec<RuleMessage> = handle
            .rule()
            .get(ip_version(family))
            .execute()
            .try_collect()
            .await
            .map_err(|source| NetlinkError::Request {
                op: "listing rules",
                source,
            })?;
        Ok(rules.into_iter().filter(|r| self.is_our_rule(r)).collect())
    }

    fn is_our_rule(&self, rule: &RuleMessage) -> bool {
        let attr = |want: fn(&RuleAttribute) -> Option<u32>| rule.attributes.iter().find_map(want);
        let table = attr(|a| {
            if let RuleAttribute::Table(t) = a {
                Some(*t)
            } else {
                None
            }
        })
        .unwrap_or(u32::from(rule.header.table));
        attr(|a| {
            if let RuleAttribute::FwMark(m) = a {
                Some(*m)
            } else {
                None
            }
        }) == Some(self.fwmark)
            && attr(|a| {
                if let RuleAttribute::FwMask(m) = a {
                    Some(*m)
                } else {
                    None
                }
            }) == Some(self.mask)
            && attr(|a| {
                if let RuleAttribute::Priority(p) = a {
                    Some(*p)
                } else {
                    None
                }
            }) == Some(self.priority)
            && table == self.table
    }

    /// Our routes: `local <any>/0` in our table.
    async fn find_routes(
        &self,
        handle: &Handle,
        family: IpFamily,
    ) -> Result<Vec<RouteMessage>, NetlinkError> {
        let query = match family {
            IpFamily::V4 => RouteMessageBuilder::<Ipv4Addr>::new()
                .table_id(self.table)
                .build(),
            IpFamily::V6 => RouteMessageBuilder::<Ipv6Addr>::new()
                .table_id(self.table)
                .build(),
        };
        let routes: Vec<RouteMessage> = handle
            .route()
            .get(query)
            .execute()
            .try_collect()
            .await
            .map_err(|source| NetlinkError::Request {
                op: "listing routes",
                source,
            })?;
        Ok(routes
            .into_iter()
            .filter(|r| self.is_our_route(r))
            .collect())
    }

    fn is_our_route(&self, route: &RouteMessage) -> bool {
        let table = route
            .attributes
            .iter()
            .find_map(|a| {
                if let RouteAttribute::Table(t) = a {
                    Some(*t)
                } else {
                    None
                }
            })
            .unwrap_or(u32::from(route.header.table));
        let default_dst = route.attributes.iter().all(|a| match a {
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => ip.is_unspecified(),
            RouteAttribute::Destination(RouteAddress::Inet6(ip)) => ip.is_unspecified(),
            _ => true,
        });
        table == self.table
            && route.header.kind == RouteType::Local
            && route.header.destination_prefix_length == 0
            && default_dst
    }
}

fn ip_version(family: IpFamily) -> IpVersion {
    match family {
        IpFamily::V4 => IpVersion::V4,
        IpFamily::V6 => IpVersion::V6,
    }
}

/// `lo`'s index in the current netns (the ioctl socket is created on this thread).
fn loopback_index() -> Result<u32, NetlinkError> {
    nix::net::if_::if_nametoindex("lo").map_err(NetlinkError::NoLoopback)
}

/// Errno values we tolerate, spelled out to avoid a libc dependency.
mod errno {
    pub const ENOENT: i32 = 2;
    pub const ESRCH: i32 = 3;
    pub const EEXIST: i32 = 17;
}

/// Treats the netlink error `errno` as success (idempotent add and delete).
fn tolerate(errno: i32, result: Result<(), rtnetlink::Error>) -> Result<(), rtnetlink::Error> {
    match result {
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code().abs() == errno => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn refuses_to_run_on_a_runtime_thread() {
        let err = PolicyRouting::default().state(IpFamily::V4).unwrap_err();
        assert!(matches!(err, NetlinkError::InsideRuntime), "{err}");
    }
}
