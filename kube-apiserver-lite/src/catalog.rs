//! Everything this server serves: the built-in resources, and the custom resources of
//! the CRDs it holds (only while a CRD is established, as kube-apiserver).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use serde_json::Value;

use crate::crds::{self, CustomResource};
use crate::resources::{self, Resource};

/// The served resources. Cheap to share; updated whenever a CRD is written.
#[derive(Debug, Default)]
pub struct Catalog {
    /// By (group, plural).
    custom: RwLock<BTreeMap<(String, String), Arc<CustomResource>>>,
}

impl Catalog {
    fn read(
        &self,
    ) -> std::sync::RwLockReadGuard<'_, BTreeMap<(String, String), Arc<CustomResource>>> {
        self.custom.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The resource served at `/api[s]/<group>/<version>/<plural>`.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
        if let Some(builtin) = resources::builtin(group, version, plural) {
            return Some(builtin);
        }
        let custom = self.custom(group, plural)?;
        custom.resource.serves(version).then_some(custom.resource)
    }

    /// The resource stored under `(group, plural)`, served or not.
    pub fn by_storage(&self, group: &str, plural: &str) -> Option<&'static Resource> {
        resources::builtin_by_storage(group, plural)
            .or_else(|| self.custom(group, plural).map(|c| c.resource))
    }

    /// The CRD-defined resource `(group, plural)`, if one is established.
    pub fn custom(&self, group: &str, plural: &str) -> Option<Arc<CustomResource>> {
        self.read()
            .get(&(group.to_string(), plural.to_string()))
            .cloned()
    }

    /// Every group but core, with its versions (preferred first): the built-in ones,
    /// then those of CRDs.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = resources::builtin_groups()
            .into_iter()
            .map(|(g, vs)| (g.to_string(), vs.iter().map(|v| v.to_string()).collect()))
            .collect();
        for custom in self.read().values() {
            let r = custom.resource;
            match out.iter_mut().find(|(g, _)| g == r.group) {
                Some((_, versions)) => {
                    for v in r.versions {
                        if !versions.iter().any(|x| x == v) {
                            versions.push(v.to_string());
                        }
                    }
                }
                None => out.push((
                    r.group.to_string(),
                    r.versions.iter().map(|v| v.to_string()).collect(),
                )),
            }
        }
        out.retain(|(_, versions)| !versions.is_empty());
        out
    }

    /// The resources served at `/apis/<group>/<version>` (or `/api/v1`).
    pub fn resources_in(
        &self,
        group: &str,
        version: &str,
    ) -> Vec<(&'static Resource, Option<Arc<CustomResource>>)> {
        let mut out: Vec<(&'static Resource, Option<Arc<CustomResource>>)> = resources::BUILTIN
            .iter()
            .filter(|r| r.group == group && r.serves(version))
            .map(|r| (r, None))
            .collect();
        out.extend(
            self.read()
                .values()
                .filter(|c| c.resource.group == group && c.resource.serves(version))
                .map(|c| (c.resource, Some(c.clone()))),
        );
        out
    }

    /// Follows a CRD as stored: served once established, withdrawn otherwise.
    pub fn sync(&self, crd: &Value) {
        let (group, plural) = crds::group_and_plural(crd);
        let mut custom = self.custom.write().unwrap_or_else(|p| p.into_inner());
        match crds::served(crd) {
            Some(served) => {
                custom.insert((group, plural), Arc::new(served));
            }
            None => {
                custom.remove(&(group, plural));
            }
        }
    }

    /// Stops serving the resource of a deleted CRD.
    pub fn remove(&self, crd: &Value) {
        let (group, plural) = crds::group_and_plural(crd);
        self.custom
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(group, plural));
    }
}
