//! The container runtime's part of starting a container: its own mount namespace
//! with a root of its own, the pod's volumes bind-mounted at their `mountPath`s, a
//! read-only root when asked, and the security context's user, group and
//! capabilities. The root is either the image's own filesystem (`make image`'s
//! layers, unpacked: an overlay on them, as containerd's snapshotter gives it) or,
//! for fast local iteration, the host's distribution read-only with the workspace's
//! binaries in `/usr/local/bin`.
//!
//! It is done the way `runc` orders it, with the host's tools: the container's
//! command runs under `unshare --mount --propagation slave` (so namespaces that
//! appear on the host later still show through `HostToContainer` mounts), a small
//! `sh` program builds the root, then `chroot` and `setpriv` exec the command. An
//! image's root has neither (no shell, no util-linux): there `capsh` (libcap2-bin)
//! does what runc's init does, in its order: chroot, then groups, gid, uid (keeping
//! capabilities), the bounding, inheritable and ambient sets, `no_new_privs`, exec.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::mpsc;

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// One bind mount into the container.
#[derive(Debug, Clone)]
pub struct Mount {
    pub source: PathBuf,
    /// Absolute path inside the container.
    pub target: String,
    pub read_only: bool,
}

/// Everything the container's filesystem is made of.
#[derive(Debug, Default)]
pub struct Rootfs {
    /// An empty directory on the host; the root (a tmpfs) is mounted on it.
    pub root: PathBuf,
    /// The image's unpacked root filesystem: the root is an overlay on it (its
    /// upper layer lives and dies with the container). `None`: the host's
    /// distribution and [`Rootfs::binaries`].
    pub image: Option<PathBuf>,
    /// Host files placed at `/usr/local/bin/<name>` (the image's binaries).
    pub binaries: Vec<PathBuf>,
    pub mounts: Vec<Mount>,
    pub read_only_root: bool,
    /// `workingDir`, if given.
    pub working_dir: Option<String>,
}

/// The security context as the process gets it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Identity {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// Supplementary groups: `fsGroup` and `supplementalGroups`.
    pub groups: Vec<u32>,
    /// The capability set (lower-case names without `cap_`); `None` keeps the
    /// runtime's default set, as `privileged: true` keeps all.
    pub capabilities: Option<Vec<String>>,
    pub no_new_privs: bool,
}

/// containerd's default capability set, which `drop`/`add` start from.
const DEFAULT_CAPS: &[&str] = &[
    "chown",
    "dac_override",
    "fsetid",
    "fowner",
    "mknod",
    "net_raw",
    "setgid",
    "setuid",
    "setfcap",
    "setpcap",
    "net_bind_service",
    "sys_chroot",
    "kill",
    "audit_write",
];

impl Identity {
    /// The container's `securityContext` over the pod's.
    pub fn of(pod: &Value, container: &Value) -> Result<Self> {
        let c = &container["securityContext"];
        let p = &pod["spec"]["securityContext"];
        let id = |k: &str| -> Result<Option<u32>> {
            match c[k].as_u64().or_else(|| p[k].as_u64()) {
                Some(v) => Ok(Some(u32::try_from(v)?)),
                None => Ok(None),
            }
        };
        let capabilities = if c["privileged"] == true {
            None
        } else {
            let names = |k: &str| -> Vec<String> {
                c["capabilities"][k]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str())
                    .map(|s| s.trim_start_matches("CAP_").to_ascii_lowercase())
                    .collect()
            };
            let drop = names("drop");
            let mut set: Vec<String> = if drop.iter().any(|d| d == "all") {
                Vec::new()
            } else {
                DEFAULT_CAPS
                    .iter()
                    .map(|s| s.to_string())
                    .filter(|s| !drop.contains(s))
                    .collect()
            };
            for add in names("add") {
                if add == "all" {
                    bail!("capabilities.add ALL: use privileged: true");
                }
                if !set.contains(&add) {
                    set.push(add);
                }
            }
            Some(set)
        };
        let mut groups = Vec::new();
        for g in p["fsGroup"].as_u64().into_iter().chain(
            p["supplementalGroups"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_u64),
        ) {
            groups.push(u32::try_from(g)?);
        }
        Ok(Identity {
            uid: id("runAsUser")?,
            gid: id("runAsGroup")?,
            groups,
            capabilities,
            no_new_privs: c["allowPrivilegeEscalation"] == false,
        })
    }

    /// `capsh` arguments (after its `--chroot`) that give the process this identity,
    /// as [`Identity::setpriv_args`] does: `cap_last_cap` is the kernel's highest
    /// capability number.
    fn capsh_args(&self, cap_last_cap: usize) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(caps) = &self.capabilities {
            let named = |c: &String| format!("cap_{c}");
            if !caps.is_empty() {
                args.push(format!(
                    "--inh={}",
                    caps.iter().map(named).collect::<Vec<_>>().join(",")
                ));
            }
            let dropped: Vec<String> = CAPABILITIES
                .iter()
                .take(cap_last_cap + 1)
                .filter(|c| !caps.iter().any(|k| k == *c))
                .map(|c| format!("cap_{c}"))
                .collect();
            if !dropped.is_empty() {
                args.push(format!("--drop={}", dropped.join(",")));
            }
        }
        let non_root = self.uid.is_some_and(|u| u != 0);
        if self.gid.is_some() || self.uid.is_some() || !self.groups.is_empty() {
            let list: Vec<String> = self.groups.iter().map(u32::to_string).collect();
            args.push(format!("--groups={}", list.join(",")));
        }
        if let Some(gid) = self.gid.or(self.uid.map(|_| 0)) {
            args.push(format!("--gid={gid}"));
        }
        if let Some(uid) = self.uid {
            if non_root {
                args.push("--keep=1".into());
            }
            args.push(format!("--uid={uid}"));
        }
        // A non-root user keeps its capabilities across exec only as ambient ones.
        if let (true, Some(caps)) = (non_root, &self.capabilities) {
            if !caps.is_empty() {
                let list: Vec<String> = caps.iter().map(|c| format!("cap_{c}")).collect();
                args.push(format!("--addamb={}", list.join(",")));
            }
        }
        if self.no_new_privs {
            args.push("--no-new-privs".into());
        }
        args
    }

    /// `setpriv` arguments that give the process this identity.
    fn setpriv_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(gid) = self.gid.or(self.uid.map(|_| 0)) {
            args.push(format!("--regid={gid}"));
        }
        if self.gid.is_some() || self.uid.is_some() || !self.groups.is_empty() {
            if self.groups.is_empty() {
                args.push("--clear-groups".into());
            } else {
                let list: Vec<String> = self.groups.iter().map(u32::to_string).collect();
                args.push(format!("--groups={}", list.join(",")));
            }
        }
        if let Some(uid) = self.uid {
            args.push(format!("--reuid={uid}"));
        }
        if let Some(caps) = &self.capabilities {
            let list: String = std::iter::once("-all".to_owned())
                .chain(caps.iter().map(|c| format!("+{c}")))
                .collect::<Vec<_>>()
                .join(",");
            args.push(format!("--bounding-set={list}"));
            args.push(format!("--inh-caps={list}"));
            // A non-root user keeps its capabilities across exec only as ambient ones.
            if self.uid.is_some_and(|u| u != 0) {
                args.push(format!("--ambient-caps={list}"));
            }
        }
        if self.no_new_privs {
            args.push("--no-new-privs".into());
        }
        args
    }
}

/// Linux's capabilities by number (`capability.h`), lower-case without `cap_`.
const CAPABILITIES: &[&str] = &[
    "chown",
    "dac_override",
    "dac_read_search",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "linux_immutable",
    "net_bind_service",
    "net_broadcast",
    "net_admin",
    "net_raw",
    "ipc_lock",
    "ipc_owner",
    "sys_module",
    "sys_rawio",
    "sys_chroot",
    "sys_ptrace",
    "sys_pacct",
    "sys_admin",
    "sys_boot",
    "sys_nice",
    "sys_resource",
    "sys_time",
    "sys_tty_config",
    "mknod",
    "lease",
    "audit_write",
    "audit_control",
    "setfcap",
    "mac_override",
    "mac_admin",
    "syslog",
    "wake_alarm",
    "block_suspend",
    "audit_read",
    "perfmon",
    "bpf",
    "checkpoint_restore",
];

/// The kernel's highest capability number.
fn cap_last_cap() -> Result<usize> {
    let text = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .context("reading /proc/sys/kernel/cap_last_cap")?;
    let last: usize = text.trim().parse().context("cap_last_cap")?;
    Ok(last.min(CAPABILITIES.len() - 1))
}

/// Host paths a container's root shows read-only (the image's distribution).
const DISTRO_DIRS: &[&str] = &[
    "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc",
];

/// `argv` run inside the container: in the command `outer` (e.g. `ip netns exec
/// <ns>`), with the root `rootfs` (when given) and `identity`.
pub fn command(
    mut outer: Command,
    rootfs: Option<&Rootfs>,
    identity: &Identity,
    argv: &[String],
) -> Result<Command> {
    if rootfs.is_none() && *identity == Identity::default() {
        outer.args(argv);
        return Ok(outer);
    }
    let mut script = String::from("set -e\n");
    let mut exec: Vec<String> = Vec::new();
    if let Some(
        fs @ Rootfs {
            image: Some(image), ..
        },
    ) = rootfs
    {
        if fs.working_dir.as_deref().is_some_and(|d| d != "/") {
            // capsh enters the root at `/` and has no chdir of its own.
            bail!("workingDir is not supported in an image's root (the charts set none)");
        }
        script.push_str(&image_rootfs_script(fs, image)?);
        let (program, args) = argv.split_first().context("an empty command")?;
        exec.extend(["capsh".into(), format!("--chroot={}", fs.root.display())]);
        exec.extend(identity.capsh_args(cap_last_cap()?));
        exec.push(format!("--shell={program}"));
        exec.push("--".into());
        script.push_str("exec ");
        for word in &exec {
            script.push_str(&quote(word));
            script.push(' ');
        }
        script.push_str("\"$@\"\n");
        return Ok(in_mount_namespace(outer, &script, "container", args));
    }
    if let Some(fs) = rootfs {
        script.push_str(&rootfs_script(fs)?);
        exec.extend(["chroot".into(), fs.root.display().to_string()]);
        exec.extend(["/usr/bin/env".into(), "-C".into()]);
        exec.push(fs.working_dir.clone().unwrap_or_else(|| "/".into()));
    }
    if *identity != Identity::default() {
        exec.push("setpriv".into());
        exec.extend(identity.setpriv_args());
        exec.push("--".into());
    }
    script.push_str("exec ");
    for word in &exec {
        script.push_str(&quote(word));
        script.push(' ');
    }
    script.push_str("\"$@\"\n");
    Ok(in_mount_namespace(outer, &script, "container", argv))
}

/// `outer` running `sh -c script` in a mount namespace of its own (a slave of the
/// host's), with `argv` as the script's `"$@"`.
fn in_mount_namespace(mut outer: Command, script: &str, name: &str, argv: &[String]) -> Command {
    outer
        .args([
            "unshare",
            "--mount",
            "--propagation",
            "slave",
            "--",
            "sh",
            "-c",
        ])
        .arg(script)
        .arg(name)
        .args(argv);
    outer
}

/// Starts processes of the node as kubelet's CNI plugins run: in the node's network
/// namespace with the node's `/sys`, and in a mount namespace where each of the node's
/// directories in `binds` (host dir, node path) is seen at its node path.
///
/// Namespaces belong to a thread and a child inherits its parent thread's, so one
/// thread per node enters them once and spawns every plugin (`posix_spawn`: no fork of
/// this large, many-threaded process, no helper process in between). What the kubelet
/// times is then the plugin's own work, as on a real node. The thread ends once every
/// clone of the spawner is dropped.
#[derive(Clone, Debug)]
pub struct NodeSpawner {
    jobs: mpsc::Sender<(Command, mpsc::Sender<std::io::Result<Child>>)>,
}

impl NodeSpawner {
    pub fn start(netns: &Path, binds: &[(PathBuf, String)]) -> Result<Self> {
        let netns = std::fs::File::open(netns)
            .with_context(|| format!("opening the node's netns {}", netns.display()))?;
        let binds = binds.to_vec();
        let (jobs, queue) = mpsc::channel::<(Command, mpsc::Sender<_>)>();
        let (ready, entered) = mpsc::channel();
        std::thread::Builder::new()
            .name("node-spawner".into())
            .spawn(move || {
                let setup = enter_node(&netns, &binds);
                let ok = setup.is_ok();
                let _ = ready.send(setup);
                if ok {
                    for (mut cmd, reply) in queue {
                        let _ = reply.send(cmd.spawn());
                    }
                }
            })?;
        entered
            .recv()
            .context("the node spawner thread died")?
            .context("entering the node's namespaces")?;
        Ok(NodeSpawner { jobs })
    }

    /// `cmd` started as a process of the node.
    pub fn spawn(&self, cmd: Command) -> Result<Child> {
        let (reply, child) = mpsc::channel();
        self.jobs
            .send((cmd, reply))
            .map_err(|_| anyhow::anyhow!("the node spawner thread is gone"))?;
        Ok(child.recv().context("the node spawner thread is gone")??)
    }
}

/// Moves the calling thread into the node's network namespace and a mount namespace
/// of its own (a slave of the host's, so namespaces mounted later still show).
fn enter_node(netns: &std::fs::File, binds: &[(PathBuf, String)]) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let ok = |rc: libc::c_int| {
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    let null = std::ptr::null::<libc::c_char>();
    // SAFETY: plain system calls on this thread, with valid fds and C strings.
    unsafe {
        // CLONE_FS: this thread's root and cwd become its own, as a mount namespace needs.
        ok(libc::unshare(libc::CLONE_FS | libc::CLONE_NEWNS))?;
        ok(libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET))?;
        ok(libc::mount(
            null,
            c"/".as_ptr(),
            null,
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        ))?;
        // `/sys` shows the devices of the namespace that mounts it.
        libc::umount2(c"/sys".as_ptr(), libc::MNT_DETACH);
        ok(libc::mount(
            c"sysfs".as_ptr(),
            c"/sys".as_ptr(),
            c"sysfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        ))?;
    }
    for (host, at) in binds {
        // The mount point is made on the host if missing (an empty directory: node
        // paths such as /var/run/istio-cni live on the host's /run tmpfs).
        std::fs::create_dir_all(at)?;
        let c = |p: &Path| {
            use std::os::unix::ffi::OsStrExt;
            std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other)
        };
        let (host, at) = (c(host)?, c(Path::new(at))?);
        // SAFETY: valid C strings; a bind mount takes no type or data.
        ok(unsafe {
            libc::mount(
                host.as_ptr(),
                at.as_ptr(),
                null,
                libc::MS_BIND,
                std::ptr::null(),
            )
        })?;
    }
    Ok(())
}

fn rootfs_script(fs: &Rootfs) -> Result<String> {
    let root = fs.root.display().to_string();
    let r = |p: &str| quote(&format!("{root}{p}"));
    let mut s = format!(
        "mount -t tmpfs -o mode=755 container-root {}\n",
        quote(&root)
    );
    let mut read_only_later = Vec::new();
    for dir in DISTRO_DIRS {
        let host = Path::new("/").join(dir);
        match std::fs::symlink_metadata(&host) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&host)?;
                s += &format!(
                    "ln -s {} {}\n",
                    quote(&target.display().to_string()),
                    r(&format!("/{dir}"))
                );
            }
            Ok(m) if m.is_dir() && mounts_inside(fs, dir) => {
                // A volume's mount point must be made in it: the host's dir as the
                // lower layer of an overlay whose upper layer lives and dies with this
                // mount namespace, read-only once the volumes are in.
                let at = r(&format!("/{dir}"));
                let layer = quote(&format!("{root}.layers/{dir}"));
                s += &format!(
                    "mkdir -p {layer}\nmount -t tmpfs layer {layer}\nmkdir {layer}/upper {layer}/work {at}\n\
                     mount -t overlay overlay -o lowerdir=/{dir},upperdir={layer}/upper,workdir={layer}/work {at}\n"
                );
                read_only_later.push((*dir, at));
            }
            Ok(m) if m.is_dir() => {
                let at = r(&format!("/{dir}"));
                s += &format!(
                    "mkdir {at}\nmount --rbind /{dir} {at}\nmount -o remount,bind,ro {at}\n"
                );
            }
            _ => {}
        }
    }
    for (dir, how) in [
        ("dev", "--rbind /dev"),
        ("proc", "--rbind /proc"),
        ("sys", "--rbind /sys"),
    ] {
        let at = r(&format!("/{dir}"));
        s += &format!("mkdir {at}\nmount {how} {at}\n");
    }
    s += &format!("mkdir -m 1777 {}\nmkdir -p {}\n", r("/tmp"), r("/var/run"));
    // The image's binaries: a tmpfs of their own over the distribution's dir.
    let bin = r("/usr/local/bin");
    s += &format!("mount -t tmpfs -o mode=755 image-bin {bin}\n");
    for b in &fs.binaries {
        let name = b
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let at = r(&format!("/usr/local/bin/{name}"));
        s += &format!(
            "touch {at}\nmount --bind {} {at}\nmount -o remount,bind,ro {at}\n",
            quote(&b.display().to_string())
        );
    }
    for m in &fs.mounts {
        if !m.target.starts_with('/') || m.target.contains("/../") || m.target.ends_with("/..") {
            bail!("mountPath {:?} must be absolute and plain", m.target);
        }
        if DISTRO_DIRS.iter().any(|d| m.target == format!("/{d}")) {
            bail!(
                "mountPath {:?} would hide the image's distribution",
                m.target
            );
        }
        let at = r(&m.target);
        let source = quote(&m.source.display().to_string());
        if m.source.is_dir() {
            s += &format!("mkdir -p {at}\n");
        } else {
            s += &format!("mkdir -p \"$(dirname {at})\"\ntouch {at}\n");
        }
        s += &format!("mount --rbind {source} {at}\n");
        if m.read_only {
            s += &format!("mount -o remount,bind,ro {at}\n");
        }
    }
    for (dir, at) in read_only_later {
        // The overlay sees the host's own resolv.conf, not the namespace's that
        // `ip netns exec` bound over it: the pod's DNS settings go back on top.
        if dir == "etc" {
            s += &format!("mount --bind /etc/resolv.conf {at}/resolv.conf\n");
        }
        s += &format!("mount -o remount,ro {at}\n");
    }
    if fs.read_only_root {
        s += &format!("mount -o remount,ro {}\n", quote(&root));
    }
    Ok(s)
}

/// The root of a container of the built image: an overlay whose lower layer is the
/// image's unpacked filesystem (shared by every container, never written) and whose
/// upper layer is a tmpfs of this mount namespace; `/dev`, `/proc`, `/sys`, the pod's
/// `resolv.conf` and `hosts` as a runtime provides them; the volumes; read-only last
/// when `readOnlyRootFilesystem`.
fn image_rootfs_script(fs: &Rootfs, image: &Path) -> Result<String> {
    let root = fs.root.display().to_string();
    let r = |p: &str| quote(&format!("{root}{p}"));
    let layer = quote(&format!("{root}.layers"));
    let mut s = format!(
        "mkdir -p {layer}\nmount -t tmpfs -o mode=755 layer {layer}\nmkdir {layer}/upper {layer}/work\n\
         mount -t overlay overlay -o lowerdir={},upperdir={layer}/upper,workdir={layer}/work {}\n",
        quote(&image.display().to_string()),
        quote(&root)
    );
    for (dir, how) in [
        ("dev", "--rbind /dev"),
        ("proc", "--rbind /proc"),
        ("sys", "--rbind /sys"),
    ] {
        let at = r(&format!("/{dir}"));
        s += &format!("mkdir -p {at}\nmount {how} {at}\n");
    }
    // What kubelet writes for every container: the pod's DNS settings (the netns's,
    // which `ip netns exec` bound over the host's) and hosts file.
    for file in ["/etc/resolv.conf", "/etc/hosts"] {
        let at = r(file);
        s += &format!("touch {at}\nmount --bind {file} {at}\nmount -o remount,bind,ro {at}\n");
    }
    for m in &fs.mounts {
        if !m.target.starts_with('/') || m.target.contains("/../") || m.target.ends_with("/..") {
            bail!("mountPath {:?} must be absolute and plain", m.target);
        }
        let at = r(&m.target);
        let source = quote(&m.source.display().to_string());
        if m.source.is_dir() {
            s += &format!("mkdir -p {at}\n");
        } else {
            s += &format!("mkdir -p \"$(dirname {at})\"\ntouch {at}\n");
        }
        s += &format!("mount --rbind {source} {at}\n");
        if m.read_only {
            s += &format!("mount -o remount,bind,ro {at}\n");
        }
    }
    if fs.read_only_root {
        s += &format!("mount -o remount,ro {}\n", quote(&root));
    }
    Ok(s)
}

/// Whether a volume is mounted inside the distribution's `dir` (not `/usr/local`,
/// which has a tmpfs of its own).
fn mounts_inside(fs: &Rootfs, dir: &str) -> bool {
    fs.mounts
        .iter()
        .any(|m| m.target.starts_with(&format!("/{dir}/")) && !m.target.starts_with("/usr/local/"))
}

/// `word` as one shell word.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn security_context_to_identity() {
        let pod = json!({"spec": {"securityContext": {"runAsUser": 1000, "runAsGroup": 1000}}});
        let c = json!({"securityContext": {"runAsUser": 0,
            "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN", "SYS_ADMIN"]},
            "allowPrivilegeEscalation": false}});
        let id = Identity::of(&pod, &c).unwrap();
        assert_eq!(id.uid, Some(0), "the container's wins");
        assert_eq!(id.gid, Some(1000), "the pod's fills in");
        assert_eq!(
            id.capabilities.as_deref(),
            Some(&["net_admin".to_owned(), "sys_admin".to_owned()][..])
        );
        assert!(id
            .setpriv_args()
            .contains(&"--bounding-set=-all,+net_admin,+sys_admin".to_owned()));
        assert!(id.no_new_privs);

        let dropped = Identity::of(
            &json!({}),
            &json!({"securityContext": {"capabilities": {"drop": ["NET_RAW"]}}}),
        )
        .unwrap();
        let caps = dropped.capabilities.unwrap();
        assert!(!caps.contains(&"net_raw".to_owned()) && caps.contains(&"chown".to_owned()));
        let privileged = Identity::of(
            &json!({}),
            &json!({"securityContext": {"privileged": true}}),
        )
        .unwrap();
        assert_eq!(privileged, Identity::default());
        assert!(Identity::of(
            &json!({}),
            &json!({"securityContext": {"capabilities": {"add": ["ALL"]}}})
        )
        .is_err());
    }

    #[test]
    fn capsh_gets_the_identity_setpriv_would_give() {
        let pod = json!({"spec": {"securityContext": {"fsGroup": 1337}}});
        let istiod = json!({"securityContext": {"runAsUser": 1337, "runAsGroup": 1337,
            "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}}});
        let args = Identity::of(&pod, &istiod).unwrap().capsh_args(40);
        let dropped = args[1].strip_prefix("--drop=").unwrap().split(',').count();
        assert_eq!(
            dropped, 40,
            "every capability but net_admin leaves the bounding set"
        );
        assert!(!args[1].contains("cap_net_admin") && args[1].contains("cap_chown"));
        assert_eq!(
            [&args[..1], &args[2..]].concat(),
            [
                "--inh=cap_net_admin",
                "--groups=1337",
                "--gid=1337",
                "--keep=1",
                "--uid=1337",
                "--addamb=cap_net_admin",
                "--no-new-privs"
            ]
        );
        // Root keeps its capabilities through the bounding and inheritable sets, not
        // ambient ones; a kernel with fewer capabilities gets fewer names.
        let agent = json!({"securityContext": {"runAsUser": 0, "runAsGroup": 0,
            "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN", "SYS_ADMIN"]}}});
        let args = Identity::of(&json!({}), &agent).unwrap().capsh_args(37);
        assert_eq!(args[0], "--inh=cap_net_admin,cap_sys_admin");
        assert_eq!(args[1].split(',').count(), 36);
        assert!(!args[1].contains("cap_perfmon"));
        assert_eq!(args[2..], ["--groups=", "--gid=0", "--uid=0"]);
        assert!(Identity::default().capsh_args(40).is_empty());
    }

    #[test]
    fn an_image_root_is_an_overlay_on_the_image_started_by_capsh() {
        let fs = Rootfs {
            root: "/c/root".into(),
            image: Some("/img".into()),
            mounts: vec![Mount {
                source: "/tmp".into(),
                target: "/var/run/secrets/tokens".into(),
                read_only: true,
            }],
            read_only_root: true,
            ..Rootfs::default()
        };
        let cmd = command(
            Command::new("true"),
            Some(&fs),
            &Identity::default(),
            &["/usr/local/bin/ztunnel".into(), "--help".into()],
        )
        .unwrap();
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let script = &args[7];
        assert!(
            script.contains("mount -t overlay overlay -o lowerdir='/img',upperdir="),
            "{script}"
        );
        assert!(script.contains("mount --rbind '/tmp' '/c/root/var/run/secrets/tokens'"));
        assert!(script.ends_with(
            "mount -o remount,ro '/c/root'\nexec 'capsh' '--chroot=/c/root' \
             '--shell=/usr/local/bin/ztunnel' '--' \"$@\"\n"
        ));
        assert_eq!(args[8..], ["container", "--help"]);
        // Nothing of the host's distribution in it.
        assert!(!script.contains("lowerdir=/usr") && !script.contains("setpriv"));
        let with_dir = Rootfs {
            working_dir: Some("/work".into()),
            ..fs
        };
        assert!(command(
            Command::new("true"),
            Some(&with_dir),
            &Identity::default(),
            &["x".into()]
        )
        .is_err());
    }

    #[test]
    fn quoting_survives_quotes() {
        assert_eq!(quote("a'b c"), r"'a'\''b c'");
    }

    #[test]
    fn mount_paths_inside_the_distribution_get_an_overlay() {
        let fs = |target: &str| Rootfs {
            root: "/nonexistent".into(),
            mounts: vec![Mount {
                source: "/tmp".into(),
                target: target.into(),
                read_only: false,
            }],
            ..Rootfs::default()
        };
        // Hiding a whole distribution dir is refused; a mount point inside one is made
        // in an overlay's upper layer, read-only once the volumes are in.
        assert!(rootfs_script(&fs("/etc")).is_err());
        let etc = rootfs_script(&fs("/etc/cacerts")).unwrap();
        assert!(
            etc.contains("mount -t overlay overlay -o lowerdir=/etc,"),
            "{etc}"
        );
        assert!(
            etc.contains("mount -o remount,ro '/nonexistent/etc'"),
            "{etc}"
        );
        assert!(!etc.contains("mount --rbind /etc"), "{etc}");
        assert!(rootfs_script(&fs("relative")).is_err());
        assert!(rootfs_script(&fs("/a/../etc")).is_err());
        let ok = rootfs_script(&fs("/var/run/secrets/tokens")).unwrap();
        assert!(
            ok.contains("mount --rbind '/tmp' '/nonexistent/var/run/secrets/tokens'"),
            "{ok}"
        );
    }
}
