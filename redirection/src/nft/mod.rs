//! Istio's native nftables mode (`NATIVE_NFTABLES`), programmed over netlink from Rust:
//! no process is spawned on any path.
//!
//! - [`ruleset`]: Istio's tables as values (the in-pod `inet istio-ambient-*` tables,
//!   the host's probe SNAT table), with their `nft` text for the golden files;
//! - [`expr`]: the statements those rules use, lowered to nf_tables expressions;
//! - [`wire`]: netlink attributes and messages; [`session`]: the socket.
//!
//! Like the iptables path, everything acts on the CURRENT thread's netns.
//!
//! Apply replaces each of our tables in one atomic batch (the table is created if
//! absent, deleted and rebuilt), so drift of any kind, chains included, is repaired
//! and no packet ever sees a half-written table. The state is then read back on the
//! same socket and compared with what was sent.

pub mod expr;
pub mod istio_tables;
pub mod ruleset;
pub mod session;
pub mod wire;

use super::plan::CheckResult;
use super::probe::{ProbeEntry, ProbeSnat};
use super::rules::{InpodRules, IpFamily};
use istio_tables::{INPOD_TABLES, TABLE_NAT};
use ruleset::{chain_attrs, rule_exprs, table_msg, Table};
pub use session::NftError;
use session::{Dumped, Session};
use std::net::IpAddr;
use wire::{attrs_within, Attr, Msg, MsgType, NLM_F_ACK, NLM_F_CREATE};

/// `NFTNL_UDATA_SET_ELEM_COMMENT`: how `nft` stores an element's comment.
const UDATA_COMMENT: u8 = 0;
/// The host's chain holding the probe SNAT rules.
const HOST_CHAIN: &str = "postrouting";

/// Converges the pod netns on `rules`: reads the state, and if it differs replaces our
/// tables in one batch (removing the raw table when DNS capture is off) and reads it
/// back. Returns whether anything changed.
pub fn apply_inpod(rules: &InpodRules) -> Result<bool, NftError> {
    apply_inpod_to(rules, false)
}

/// [`apply_inpod`] without the read before the write, for a netns that should have
/// none of our tables yet (one a CNI ADD just created): our tables are added, then
/// verified; a netns that was not fresh after all is then replaced as by
/// [`apply_inpod`]. Safe on any netns; it only never answers "unchanged".
pub fn apply_inpod_fresh(rules: &InpodRules) -> Result<bool, NftError> {
    apply_inpod_to(rules, true)
}

fn apply_inpod_to(rules: &InpodRules, fresh: bool) -> Result<bool, NftError> {
    let wanted = istio_tables::inpod_tables(rules);
    let mut session = Session::open()?;
    if fresh {
        // Only what is wanted, added: deleting tables (even in the same batch) costs the
        // kernel a hook unregistration and an RCU grace period, tens of milliseconds.
        let batch: Vec<Msg> = wanted
            .iter()
            .flat_map(|t| std::iter::once(t.new_msg()).chain(t.content_msgs()))
            .collect();
        let added = session.transact(&batch);
        match added {
            Ok(()) if check_tables(&mut session, &wanted, &INPOD_TABLES)?.is_ok() => {
                return Ok(true)
            }
            Ok(()) => tracing::debug!("netns was not fresh after all; replacing our tables"),
            Err(e) => {
                tracing::debug!(error = %e, "fresh-netns batch refused; replacing our tables")
            }
        }
    } else if check_tables(&mut session, &wanted, &INPOD_TABLES)?.is_ok() {
        return Ok(false);
    }
    let mut batch = Vec::new();
    for name in INPOD_TABLES {
        batch.push(table_msg(MsgType::NewTable, name));
        batch.push(table_msg(MsgType::DelTable, name));
        if let Some(table) = wanted.iter().find(|t| t.name == name) {
            batch.push(table.new_msg());
            batch.extend(table.content_msgs());
        }
    }
    session.transact(&batch)?;
    match check_tables(&mut session, &wanted, &INPOD_TABLES)? {
        CheckResult::Ok => Ok(true),
        other => Err(NftError::NotConverged(other)),
    }
}

/// Compares the pod netns with `rules`.
pub fn check_inpod(rules: &InpodRules) -> Result<CheckResult, NftError> {
    let wanted = istio_tables::inpod_tables(rules);
    check_tables(&mut Session::open()?, &wanted, &INPOD_TABLES)
}

/// Whether any of our in-pod tables exists (the pod was programmed in nftables mode).
pub fn has_inpod_tables() -> Result<bool, NftError> {
    Ok(Session::open()?
        .dump(MsgType::GetTable)?
        .iter()
        .filter_map(|t| t.string(1))
        .any(|name| INPOD_TABLES.contains(&name.as_str())))
}

/// Deletes our in-pod tables (absent ones are fine), in one batch.
pub fn remove_inpod() -> Result<(), NftError> {
    delete_tables(&mut Session::open()?, &INPOD_TABLES)
}

fn delete_tables(session: &mut Session, names: &[&str]) -> Result<(), NftError> {
    // Adding first makes the delete valid whether or not the table exists.
    let batch: Vec<Msg> = names
        .iter()
        .flat_map(|n| {
            [
                table_msg(MsgType::NewTable, n),
                table_msg(MsgType::DelTable, n),
            ]
        })
        .collect();
    session.transact(&batch)
}

/// Compares the `inet` tables of the current netns with `wanted`; `owned` are all the
/// table names that are ours (any of them present but not wanted is a leftover).
fn check_tables(
    session: &mut Session,
    wanted: &[Table],
    owned: &[&str],
) -> Result<CheckResult, NftError> {
    let tables: Vec<String> = session
        .dump(MsgType::GetTable)?
        .iter()
        .filter_map(|t| t.string(1))
        .collect();
    let present = |name: &str| tables.iter().any(|t| t == name);
    if !owned.iter().any(|t| present(t)) {
        return Ok(CheckResult::Missing);
    }
    let chains = session.dump(MsgType::GetChain)?;
    let rules = session.dump(MsgType::GetRule)?;
    let (mut partial, mut foreign) = (Vec::new(), Vec::new());
    for table in wanted {
        if !present(table.name) {
            partial.push(format!("table {} is missing", table.name));
            continue;
        }
        compare_table(table, &chains, &rules, &mut partial, &mut foreign);
    }
    for name in owned {
        if present(name) && !wanted.iter().any(|t| t.name == *name) {
            foreign.push(format!("table {name} is not wanted"));
        }
    }
    Ok(match (partial.is_empty(), foreign.is_empty()) {
        (true, true) => CheckResult::Ok,
        (false, _) => CheckResult::Partial(partial),
        (true, false) => CheckResult::Foreign(foreign),
    })
}

fn compare_table(
    table: &Table,
    chains: &[Dumped],
    rules: &[Dumped],
    partial: &mut Vec<String>,
    foreign: &mut Vec<String>,
) {
    let t = table.name;
    let in_table = |d: &&Dumped| d.string(1).as_deref() == Some(t);
    for dumped in chains.iter().filter(in_table) {
        let name = dumped.string(3).unwrap_or_default();
        if !table.chains.iter().any(|c| c.name == name) {
            foreign.push(format!("{t}: chain {name} is not ours"));
        }
    }
    for chain in &table.chains {
        let Some(dumped) = chains
            .iter()
            .filter(in_table)
            .find(|d| d.string(3).as_deref() == Some(chain.name))
        else {
            partial.push(format!("{t}: chain {} is missing", chain.name));
            continue;
        };
        if !attrs_within(&chain_attrs(t, chain), &dumped.attrs()) {
            partial.push(format!(
                "{t}: chain {} has another hook or type",
                chain.name
            ));
        }
        let want: Vec<_> = table
            .rules
            .iter()
            .filter(|r| r.chain == chain.name)
            .collect();
        let have: Vec<&Dumped> = rules
            .iter()
            .filter(in_table)
            .filter(|d| d.string(2).as_deref() == Some(chain.name))
            .collect();
        for (i, rule) in want.iter().enumerate() {
            let expressions = have.get(i).and_then(|d| {
                d.attrs()
                    .into_iter()
                    .find(|(ty, _)| *ty == 4)
                    .map(|(_, b)| b.to_vec())
            });
            match expressions {
                Some(bytes) if rule_exprs(rule).is_within(&bytes) => {}
                Some(_) => partial.push(format!(
                    "{t} {}: rule {i} differs: {}",
                    chain.name, rule.text
                )),
                None => partial.push(format!(
                    "{t} {}: rule {i} is missing: {}",
                    chain.name, rule.text
                )),
            }
        }
        if have.len() > want.len() {
            foreign.push(format!(
                "{t} {}: {} rules we did not write",
                chain.name,
                have.len() - want.len()
            ));
        }
    }
}

/// The node's kubelet probe SNAT in nftables mode: the sets `istio-inpod-probes-v4`/`-v6`
/// and their rules in the host's `inet istio-ambient-nat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostProbe {
    /// Also program the IPv6 set and rule.
    pub ipv6: bool,
    /// Only packets of kubelet's sockets are SNATed (its probes).
    pub kubelet_uid: u32,
}

impl HostProbe {
    fn families(&self) -> Vec<IpFamily> {
        InpodRules {
            ipv6: self.ipv6,
            ..Default::default()
        }
        .families()
    }

    /// The host table as a value: the probe sets, and the `postrouting` chain with its
    /// rules.
    pub fn table(&self) -> Table {
        istio_tables::host_table(&self.families(), self.kubelet_uid)
    }

    /// Creates the table, sets (kept with their members if present) and chain, and
    /// replaces the chain's rules, in one batch. Idempotent.
    pub fn install(&self) -> Result<(), NftError> {
        let table = self.table();
        let mut batch = vec![table.new_msg()];
        let content = table.content_msgs();
        let (defs, rules): (Vec<Msg>, Vec<Msg>) =
            content.into_iter().partition(|m| m.ty != MsgType::NewRule);
        batch.extend(defs);
        batch.push(Msg::new(
            MsgType::DelRule,
            NLM_F_ACK,
            vec![Attr::string(1, TABLE_NAT), Attr::string(2, HOST_CHAIN)],
        ));
        batch.extend(rules);
        let mut session = Session::open()?;
        session.transact(&batch)?;
        match check_tables(&mut session, &[table], &[TABLE_NAT])? {
            CheckResult::Ok => Ok(()),
            other => Err(NftError::NotConverged(other)),
        }
    }

    /// Compares the host table's chains and rules with the wanted ones (sets and their
    /// members are not inspected).
    pub fn check(&self) -> Result<CheckResult, NftError> {
        check_tables(&mut Session::open()?, &[self.table()], &[TABLE_NAT])
    }

    /// Adds `ip` commented with the pod UID (re-labelled if it was there with another).
    pub fn add(&self, ip: IpAddr, uid: &str) -> Result<(), NftError> {
        let mut comment = uid.as_bytes().to_vec();
        comment.push(0);
        let mut udata = vec![UDATA_COMMENT, comment.len() as u8];
        udata.extend(comment);
        let labelled = elements_msg(
            MsgType::NewSetElem,
            ip,
            vec![key(ip), Attr::bytes(6, udata)], // NFTA_SET_ELEM_USERDATA
        );
        let mut session = Session::open()?;
        // An add leaves an existing element's comment alone; replacing it means a
        // delete, which costs the kernel an RCU grace period: only when it differs.
        let batch = match self.member(&mut session, ip)? {
            Some(member) if member.uid.as_deref() == Some(uid) => return Ok(()),
            Some(_) => vec![
                elements_msg(MsgType::DelSetElem, ip, vec![key(ip)]),
                labelled,
            ],
            None => vec![labelled],
        };
        session.transact(&batch)
    }

    /// `ip`'s element in its set, if any (a get, not a dump).
    fn member(&self, session: &mut Session, ip: IpAddr) -> Result<Option<ProbeEntry>, NftError> {
        let get = elements_msg(MsgType::GetSetElem, ip, vec![key(ip)]);
        match session.get(get) {
            Ok(dumped) => Ok(dumped
                .iter()
                .find_map(|d| elements_of(d).into_iter().next())),
            Err(NftError::Rejected { source, .. })
                if source.raw_os_error() == Some(libc::ENOENT) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Removes `ip`; an absent IP or set is fine.
    pub fn remove(&self, ip: IpAddr) -> Result<(), NftError> {
        match Session::open()?.transact(&[elements_msg(MsgType::DelSetElem, ip, vec![key(ip)])]) {
            Err(NftError::Rejected { source, .. })
                if source.raw_os_error() == Some(libc::ENOENT) =>
            {
                Ok(())
            }
            other => other,
        }
    }

    /// The members of one family's set (empty if there is none).
    pub fn members(&self, family: IpFamily) -> Result<Vec<ProbeEntry>, NftError> {
        let selector = vec![
            Attr::string(1, TABLE_NAT),
            Attr::string(2, ProbeSnat::set_name(family)),
        ];
        let dumped = match Session::open()?.dump_with(MsgType::GetSetElem, selector) {
            Err(NftError::Rejected { source, .. })
                if source.raw_os_error() == Some(libc::ENOENT) =>
            {
                return Ok(Vec::new())
            }
            other => other?,
        };
        Ok(dumped.iter().flat_map(elements_of).collect())
    }

    /// Deletes the host table with its sets and rules.
    pub fn uninstall(&self) -> Result<(), NftError> {
        delete_tables(&mut Session::open()?, &[TABLE_NAT])
    }
}

/// `NFTA_SET_ELEM_KEY` of an address.
fn key(ip: IpAddr) -> Attr {
    let bytes = match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    Attr::nested(1, vec![Attr::bytes(1, bytes)])
}

fn elements_msg(ty: MsgType, ip: IpAddr, element: Vec<Attr>) -> Msg {
    let flags = match ty {
        MsgType::NewSetElem => NLM_F_CREATE | NLM_F_ACK,
        _ => NLM_F_ACK,
    };
    Msg::new(
        ty,
        flags,
        vec![
            Attr::string(1, TABLE_NAT),
            Attr::string(2, ProbeSnat::set_name(IpFamily::of(&ip))),
            Attr::nested(3, vec![Attr::nested(1, element)]),
        ],
    )
}

/// The elements of one dumped `NFT_MSG_NEWSETELEM` message.
fn elements_of(d: &Dumped) -> Vec<ProbeEntry> {
    d.attrs()
        .into_iter()
        .filter(|(ty, _)| *ty == 3) // NFTA_SET_ELEM_LIST_ELEMENTS
        .flat_map(|(_, list)| wire::parse_attrs(list).unwrap_or_default())
        .filter_map(|(_, elem)| parse_member(elem))
        .collect()
}

/// One dumped set element: its key and the comment in its user data.
fn parse_member(elem: &[u8]) -> Option<ProbeEntry> {
    let attrs = wire::parse_attrs(elem)?;
    let key = attrs.iter().find(|(t, _)| *t == 1)?.1;
    let value = wire::parse_attrs(key)?
        .into_iter()
        .find(|(t, _)| *t == 1)?
        .1;
    let ip = match value.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(value).ok()?),
        16 => IpAddr::from(<[u8; 16]>::try_from(value).ok()?),
        _ => return None,
    };
    let uid = attrs
        .iter()
        .find(|(t, _)| *t == 6)
        .and_then(|(_, udata)| parse_comment(udata));
    Some(ProbeEntry { ip, uid })
}

/// The comment TLV of `nft` user data.
fn parse_comment(mut udata: &[u8]) -> Option<String> {
    while udata.len() >= 2 {
        let (ty, len) = (udata[0], udata[1] as usize);
        let value = udata.get(2..2 + len)?;
        if ty == UDATA_COMMENT {
            let end = value.iter().position(|&c| c == 0).unwrap_or(value.len());
            return Some(String::from_utf8_lossy(&value[..end]).into_owned());
        }
        udata = &udata[2 + len..];
    }
    None
}

/// The uid kubelet runs as, found as Istio finds it: the owner of the process in the
/// host's `/proc` named `kubelet` (or `kubelite`, `k3s`). `None` when there is none.
pub fn kubelet_uid(host_proc: &std::path::Path) -> Option<u32> {
    let entries = std::fs::read_dir(host_proc).ok()?;
    for entry in entries.flatten() {
        let pid = entry.file_name();
        if !pid.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let dir = entry.path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        if !matches!(comm.trim(), "kubelet" | "kubelite" | "k3s") {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).ok()?;
        return status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|uid| uid.parse().ok());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_parse_from_nft_user_data() {
        let udata = [UDATA_COMMENT, 4, b'u', b'i', b'd', 0];
        assert_eq!(parse_comment(&udata).as_deref(), Some("uid"));
        assert_eq!(parse_comment(&[UDATA_COMMENT, 40, b'x']), None, "truncated");
        assert_eq!(parse_comment(&[7, 1, 0]), None);
    }
}
