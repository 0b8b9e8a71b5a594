//! Which service hostnames a query name may mean, by Istio's rules for a client in a
//! given namespace: short names expand from the client's namespace, and a search
//! domain the client's resolver appended is stripped (the answer then starts with a
//! CNAME from the asked name to the stripped one).
//!
//! Names here are lowercase and without the trailing dot.

/// One way to read the asked name: look `hostname` up; when `alias` is set, the answer
/// is a CNAME from the asked name to `alias`, and the addresses are `alias`'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub hostname: String,
    pub alias: Option<String>,
}

/// The hostnames to try for `name`, asked by a client in `namespace`, in order.
pub fn candidates(name: &str, namespace: &str, cluster_domain: &str) -> Vec<Candidate> {
    let mut out = Vec::new();
    let mut push = |hostname: String, alias: Option<&str>| {
        if !out.iter().any(|c: &Candidate| c.hostname == hostname) {
            out.push(Candidate {
                hostname,
                alias: alias.map(str::to_owned),
            });
        }
    };
    for expanded in expansions(name, namespace, cluster_domain) {
        push(expanded, None);
    }
    // A resolver with Kubernetes' search path asks `name.<search domain>` first; answer
    // that at once instead of sending the client through NXDOMAINs.
    let search = [
        format!("{namespace}.svc.{cluster_domain}"),
        format!("svc.{cluster_domain}"),
        cluster_domain.to_owned(),
    ];
    for domain in &search {
        let Some(stripped) = name
            .strip_suffix(domain.as_str())
            .and_then(|rest| rest.strip_suffix('.'))
            .filter(|rest| !rest.is_empty())
        else {
            continue;
        };
        for expanded in expansions(stripped, namespace, cluster_domain) {
            push(expanded, Some(stripped));
        }
    }
    out
}

/// `name` itself, then Istio's expansions of a short name: one label is a service in
/// the client's namespace; two labels are `<service>.<namespace>`; three ending in
/// `svc` lack only the cluster domain.
fn expansions(name: &str, namespace: &str, cluster_domain: &str) -> Vec<String> {
    let mut out = vec![name.to_owned()];
    let labels: Vec<&str> = name.split('.').collect();
    match labels.as_slice() {
        [_] => out.push(format!("{name}.{namespace}.svc.{cluster_domain}")),
        [_, _] => {
            out.push(format!("{name}.svc.{cluster_domain}"));
            out.push(format!("{name}.{namespace}.svc.{cluster_domain}"));
        }
        [_, _, "svc"] => out.push(format!("{name}.{cluster_domain}")),
        _ => {}
    }
    out
}

/// `*.parent` for `label.parent`: the wildcard host that would match `name`.
pub fn wildcard_of(name: &str) -> Option<String> {
    let (_, parent) = name.split_once('.')?;
    (!parent.is_empty()).then(|| format!("*.{parent}"))
}

/// Whether `hostname` is a Kubernetes Service name (`<name>.<ns>.svc.<cluster domain>`):
/// only those answer with their endpoints when they have no VIP (headless).
pub fn is_kubernetes_service(hostname: &str, cluster_domain: &str) -> bool {
    hostname
        .strip_suffix(cluster_domain)
        .and_then(|rest| rest.strip_suffix(".svc."))
        .is_some_and(|rest| rest.split('.').count() == 2 && !rest.starts_with('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CD: &str = "cluster.local";

    fn hosts(name: &str) -> Vec<(String, Option<String>)> {
        candidates(name, "demo", CD)
            .into_iter()
            .map(|c| (c.hostname, c.alias))
            .collect()
    }

    fn plain(h: &str) -> (String, Option<String>) {
        (h.to_owned(), None)
    }

    #[test]
    fn short_names_expand_from_the_clients_namespace() {
        assert_eq!(
            hosts("server"),
            vec![plain("server"), plain("server.demo.svc.cluster.local")]
        );
        assert_eq!(
            hosts("server.other"),
            vec![
                plain("server.other"),
                plain("server.other.svc.cluster.local"),
                plain("server.other.demo.svc.cluster.local"),
            ]
        );
        assert_eq!(
            hosts("server.demo.svc"),
            vec![
                plain("server.demo.svc"),
                plain("server.demo.svc.cluster.local")
            ]
        );
        // Four labels and more are taken as they are.
        assert_eq!(hosts("a.b.c.d"), vec![plain("a.b.c.d")]);
    }

    #[test]
    fn a_full_service_name_is_itself_first() {
        let found = hosts("server.demo.svc.cluster.local");
        assert_eq!(found[0], plain("server.demo.svc.cluster.local"));
        // Every other reading strips a search domain, so it carries an alias, and no
        // hostname is tried twice.
        assert!(
            found[1..].iter().all(|(_, alias)| alias.is_some()),
            "{found:?}"
        );
        let mut unique: Vec<_> = found.iter().map(|(h, _)| h).collect();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), found.len());
    }

    #[test]
    fn search_domains_are_stripped_with_an_alias() {
        let found = hosts("server.demo.svc.cluster.local.demo.svc.cluster.local");
        let want = (
            "server.demo.svc.cluster.local".to_owned(),
            Some("server.demo.svc.cluster.local".to_owned()),
        );
        assert!(found.contains(&want), "{found:?}");

        let found = hosts("server.demo.svc.cluster.local");
        assert!(!found.iter().any(|(_, alias)| alias.as_deref() == Some("")));

        // `server.demo.svc.cluster.local` asked as `server.svc.cluster.local`: strips
        // to `server`, which expands in the client's namespace.
        let found = hosts("server.svc.cluster.local");
        assert!(found.contains(&(
            "server.demo.svc.cluster.local".to_owned(),
            Some("server".to_owned())
        )));
    }

    #[test]
    fn other_namespaces_and_cluster_domains() {
        let found = candidates("db", "prod", "corp.example");
        assert_eq!(found[1].hostname, "db.prod.svc.corp.example");
        // A bare search domain is no name.
        assert!(candidates("demo.svc.cluster.local", "demo", CD)
            .iter()
            .all(|c| c.alias.as_deref() != Some("")));
    }

    #[test]
    fn wildcards_and_kubernetes_names() {
        assert_eq!(
            wildcard_of("a.example.com").as_deref(),
            Some("*.example.com")
        );
        assert_eq!(wildcard_of("com"), None);
        assert!(is_kubernetes_service("server.demo.svc.cluster.local", CD));
        assert!(!is_kubernetes_service("demo.svc.cluster.local", CD));
        assert!(!is_kubernetes_service("a.b.demo.svc.cluster.local", CD));
        assert!(!is_kubernetes_service("server.demo.svc.other.local", CD));
        assert!(!is_kubernetes_service("api.example.com", CD));
    }
}
