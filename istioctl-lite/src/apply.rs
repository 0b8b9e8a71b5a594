//! Server-side apply and delete of arbitrary objects, resolved through API discovery
//! (so any kind the server serves works, CRDs included).

use anyhow::{bail, Context, Result};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, ApiResource, Discovery, Scope};
use kube::Client;

use crate::charts::describe;

pub const FIELD_MANAGER: &str = "istioctl-lite";

/// The API server's resource catalogue, fetched once per command.
pub struct Resolver {
    client: Client,
    discovery: Discovery,
}

/// What happened to one object.
pub enum Outcome {
    Done,
    /// The server does not serve this kind.
    Unknown,
    /// Delete of an object that was not there.
    Absent,
}

impl Resolver {
    pub async fn new(client: Client) -> Result<Self> {
        let discovery = Discovery::new(client.clone())
            .run()
            .await
            .context("API discovery failed")?;
        Ok(Resolver { client, discovery })
    }

    /// The typed handle for `obj`; the namespace is dropped for cluster-scoped kinds.
    fn api_for(&self, obj: &mut DynamicObject) -> Result<Option<Api<DynamicObject>>> {
        let types = obj
            .types
            .as_ref()
            .context("object without apiVersion/kind")?;
        let gvk = GroupVersionKind::try_from(types)
            .with_context(|| format!("bad apiVersion in {}", describe(obj)))?;
        let Some((ar, caps)) = self.discovery.resolve_gvk(&gvk) else {
            return Ok(None);
        };
        Ok(Some(self.api(obj, &ar, &caps)))
    }

    fn api(
        &self,
        obj: &mut DynamicObject,
        ar: &ApiResource,
        caps: &ApiCapabilities,
    ) -> Api<DynamicObject> {
        if caps.scope == Scope::Cluster {
            obj.metadata.namespace = None;
            Api::all_with(self.client.clone(), ar)
        } else {
            let ns = obj
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into());
            Api::namespaced_with(self.client.clone(), &ns, ar)
        }
    }

    /// Whether the server serves `obj`'s kind (checked before changing anything).
    pub fn serves(&self, obj: &DynamicObject) -> bool {
        obj.types
            .as_ref()
            .and_then(|t| GroupVersionKind::try_from(t).ok())
            .is_some_and(|gvk| self.discovery.resolve_gvk(&gvk).is_some())
    }

    /// Server-side apply with our field manager, forcing ownership (re-runs converge).
    pub async fn apply(&self, obj: &DynamicObject) -> Result<Outcome> {
        let mut obj = obj.clone();
        let Some(api) = self.api_for(&mut obj)? else {
            return Ok(Outcome::Unknown);
        };
        let name = obj.metadata.name.clone().context("object without a name")?;
        obj.metadata.managed_fields = None;
        obj.metadata.resource_version = None;
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&obj),
        )
        .await
        .with_context(|| format!("apply {} failed", describe(&obj)))?;
        Ok(Outcome::Done)
    }

    /// Deletes by kind/name/namespace; a missing object is not an error.
    pub async fn delete(&self, obj: &DynamicObject) -> Result<Outcome> {
        let mut obj = obj.clone();
        let Some(api) = self.api_for(&mut obj)? else {
            return Ok(Outcome::Unknown);
        };
        let name = obj.metadata.name.clone().context("object without a name")?;
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(Outcome::Done),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(Outcome::Absent),
            Err(e) => Err(e).with_context(|| format!("delete {} failed", describe(&obj))),
        }
    }
}

/// Fails on an unknown kind unless the user asked to skip them.
pub fn unknown_kind(obj: &DynamicObject, skip: bool) -> Result<()> {
    let api_version = obj
        .types
        .as_ref()
        .map(|t| t.api_version.as_str())
        .unwrap_or("?");
    if skip {
        eprintln!(
            "⚠ {} skipped: the API server does not serve {api_version}",
            describe(obj)
        );
        Ok(())
    } else {
        bail!(
            "the API server does not serve {api_version} (needed for {}); pass --skip-unknown-kinds to skip such objects",
            describe(obj)
        )
    }
}
