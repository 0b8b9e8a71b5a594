//! The state on disk, kept as etcd keeps it: a snapshot (one JSON document with the
//! latest resourceVersion and every object, tagged with its group and plural) and a
//! journal of the changes since, one JSON line each. A write appends only what it
//! changed, so its cost does not grow with the cluster (rewriting every object on
//! each write once made a pod PATCH take 6 ms with 100 pods); the snapshot is
//! rewritten, and the journal emptied, every [`COMPACT_AFTER`] changes.

use std::fs::File;
use std::io::{BufRead, BufReader, Error, ErrorKind, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::resources::Resource;

/// Writes the snapshot to a temporary file, then renames it: never half a file.
pub fn save<'a>(
    path: &Path,
    resource_version: u64,
    objects: impl Iterator<Item = (&'a str, &'a str, &'a Value)>,
) -> std::io::Result<()> {
    let objects: Vec<Value> = objects
        .map(|(group, plural, object)| json!({"group": group, "plural": plural, "object": object}))
        .collect();
    let doc = json!({"resourceVersion": resource_version.to_string(), "objects": objects});
    mesh_runtime::fs::write_atomic(
        path,
        &serde_json::to_vec(&doc).map_err(Error::other)?,
        0o600,
    )
}

/// Changes the journal holds before the next write compacts it into the snapshot.
pub const COMPACT_AFTER: usize = 2000;

/// One change as the journal holds it: the object as committed (for a deletion, as it
/// was deleted).
pub struct Change<'a> {
    pub rv: u64,
    pub resource: &'static Resource,
    pub object: &'a Value,
    pub deleted: bool,
}

/// A change read back from the journal.
pub struct Replayed {
    pub rv: u64,
    /// The storage group and plural (resolved by the store, whose CRDs say what
    /// custom groups exist).
    pub group: String,
    pub plural: String,
    pub object: Value,
    pub deleted: bool,
}

/// The snapshot file and its journal (`<snapshot>.journal`), open for appending.
pub struct Disk {
    snapshot: PathBuf,
    journal: File,
    entries: usize,
}

impl Disk {
    /// Writes a fresh snapshot and starts an empty journal.
    pub fn create<'a>(
        snapshot: &Path,
        resource_version: u64,
        objects: impl Iterator<Item = (&'a str, &'a str, &'a Value)>,
    ) -> std::io::Result<Disk> {
        save(snapshot, resource_version, objects)?;
        let journal = File::create(journal_path(snapshot))?;
        Ok(Disk {
            snapshot: snapshot.to_path_buf(),
            journal,
            entries: 0,
        })
    }

    /// Appends `changes` in one write.
    pub fn append<'a>(&mut self, changes: impl Iterator<Item = Change<'a>>) -> std::io::Result<()> {
        let mut lines = Vec::new();
        for change in changes {
            let (group, plural) = change.resource.storage_key();
            let line = json!({
                "rv": change.rv.to_string(),
                "group": group,
                "plural": plural,
                "object": change.object,
                "deleted": change.deleted,
            });
            serde_json::to_writer(&mut lines, &line).map_err(Error::other)?;
            lines.push(b'\n');
            self.entries += 1;
        }
        self.journal.write_all(&lines)
    }

    pub fn needs_compaction(&self) -> bool {
        self.entries >= COMPACT_AFTER
    }

    /// Folds the journal into a new snapshot of `objects`. The snapshot is renamed into
    /// place before the journal is emptied: a crash between the two leaves changes
    /// the snapshot already holds, which replay skips by resourceVersion.
    pub fn compact<'a>(
        &mut self,
        resource_version: u64,
        objects: impl Iterator<Item = (&'a str, &'a str, &'a Value)>,
    ) -> std::io::Result<()> {
        *self = Disk::create(&self.snapshot, resource_version, objects)?;
        Ok(())
    }
}

fn journal_path(snapshot: &Path) -> PathBuf {
    let mut name = snapshot.as_os_str().to_owned();
    name.push(".journal");
    PathBuf::from(name)
}

/// The journal beside `snapshot`, oldest change first (none when there is no journal).
/// A last line cut short (the server died mid-write) ends the replay with a warning.
pub fn replay(snapshot: &Path) -> std::io::Result<Vec<Replayed>> {
    let path = journal_path(snapshot);
    let file = match File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut changes = Vec::new();
    for line in BufReader::new(file).lines() {
        let line = line?;
        let parsed = serde_json::from_str::<Value>(&line).ok().and_then(|entry| {
            let rv = entry.get("rv")?.as_str()?.parse().ok()?;
            let group = entry.get("group")?.as_str()?.to_string();
            let plural = entry.get("plural")?.as_str()?.to_string();
            let deleted = entry.get("deleted")?.as_bool()?;
            let object = entry.get("object").filter(|o| o.is_object())?.clone();
            Some(Replayed {
                rv,
                group,
                plural,
                object,
                deleted,
            })
        });
        match parsed {
            Some(change) => changes.push(change),
            None => {
                tracing::warn!(path = %path.display(), "journal: stopping at an unreadable line");
                break;
            }
        }
    }
    Ok(changes)
}

/// An object of a snapshot: its storage group, plural, and the object.
pub type Stored = (String, String, Value);

/// Reads a snapshot: the resourceVersion and every object with its storage group and
/// plural (which the store resolves: a custom resource needs its CRD).
pub fn load(path: &Path) -> std::io::Result<(u64, Vec<Stored>)> {
    let invalid = |msg: String| Error::new(ErrorKind::InvalidData, msg);
    let doc: Value = serde_json::from_slice(&std::fs::read(path)?)
        .map_err(|e| invalid(format!("{}: {e}", path.display())))?;
    let rv = doc
        .get("resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| invalid(format!("{}: no resourceVersion", path.display())))?;
    let mut objects = Vec::new();
    for entry in doc
        .get("objects")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let group = entry.get("group").and_then(Value::as_str).unwrap_or("");
        let plural = entry.get("plural").and_then(Value::as_str).unwrap_or("");
        match entry.get("object") {
            Some(obj) if obj.is_object() => {
                objects.push((group.to_string(), plural.to_string(), obj.clone()))
            }
            _ => tracing::warn!(
                group,
                plural,
                "state file: skipping an entry without an object"
            ),
        }
    }
    Ok((rv, objects))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        let pod = json!({"metadata": {"name": "p", "namespace": "d"}});
        save(
            &path,
            42,
            [("", "pods", &pod), ("x.io", "widgets", &pod)].into_iter(),
        )
        .unwrap();
        let (rv, objects) = load(&path).unwrap();
        assert_eq!(rv, 42);
        assert_eq!(objects.len(), 2);
        assert_eq!(objects[0].1, "pods");
        std::fs::write(&path, "{").unwrap();
        assert!(load(&path).is_err());
        std::fs::write(&path, "{\"objects\": []}").unwrap();
        assert!(load(&path).is_err());
    }

    #[test]
    fn the_journal_replays_changes_after_the_snapshot_and_stops_at_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        let pods = crate::resources::builtin_by_storage("", "pods").unwrap();
        let pod = json!({"metadata": {"name": "p", "namespace": "d"}});
        let mut disk = Disk::create(&path, 10, std::iter::empty()).unwrap();
        let change = |rv, deleted| Change {
            rv,
            resource: pods,
            object: &pod,
            deleted,
        };
        disk.append([change(11, false), change(12, true)].into_iter())
            .unwrap();
        let replayed = replay(&path).unwrap();
        assert_eq!(
            replayed
                .iter()
                .map(|c| (c.rv, c.deleted))
                .collect::<Vec<_>>(),
            [(11, false), (12, true)]
        );
        assert_eq!(replayed[0].object, pod);

        // A write cut short: the lines before it still count.
        let mut journal = std::fs::OpenOptions::new()
            .append(true)
            .open(journal_path(&path))
            .unwrap();
        journal.write_all(b"{\"rv\": \"13\", \"gro").unwrap();
        assert_eq!(replay(&path).unwrap().len(), 2);

        // Compaction: the snapshot takes the objects, the journal starts empty.
        disk.compact(12, [("", "pods", &pod)].into_iter()).unwrap();
        assert!(replay(&path).unwrap().is_empty());
        let (rv, objects) = load(&path).unwrap();
        assert_eq!((rv, objects.len()), (12, 1));
    }
}
