#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_facts
short_description: Everything the preflight reads on a GPU host, in one round trip
description:
  - Read-only.  Gathers what the preflight checks judge (roles/preflight/tasks/main.yml), so a deploy pays one
    round trip for them instead of one per read (issue 24, the fleet lever, 12 reads become 1).  It judges
    nothing itself; the role's asserts do, with the measured and the expected value.
  - With I(model_dir) and the rest (the first call), the GPUs nvidia-smi reports, whether the server's unit is
    active, the model's config.json and shard index, the shard files present, each listed shard against its own
    safetensors header (when none is missing), who else listens on I(port), the NVIDIA character devices the
    driver registered, whether I(service_user) exists, and the checkpoint files that user could not read.
  - With I(stat_paths), I(df_paths) or I(read_files) (the second call, once the plan names its paths), which
    paths exist, the free space of each path's own filesystem, and small files' text.
options:
  model_dir:
    description: The checkpoint directory; omit it for a call with only I(stat_paths), I(df_paths), I(read_files).
    type: path
  port:
    description: The serving port.
    type: int
  service_name:
    description: The server's systemd unit name (without C(.service)).
    type: str
  service_user:
    description: The service user the server runs as.
    type: str
  deploy_root:
    description:
      - The deploy root; with it, the other units of this root still installed are read (I(retire_units)).
    type: path
  stat_paths:
    description: Paths to report on (C(exists), and C(lstat) for what the install stage may then skip).
    type: list
    elements: path
    default: []
  df_paths:
    description: Paths whose filesystem to measure; a missing path is measured at its nearest existing parent.
    type: list
    elements: path
    default: []
  read_files:
    description: Small text files to return whole (at most 4 MiB each).
    type: list
    elements: path
    default: []
  gpu_health_since_epoch:
    description:
      - With I(model_dir), read the kernel's NVIDIA Xid events from this time (seconds since the epoch; 0 = since
        boot).  After a GPU reset the boot's old events stay in the log.
    type: int
    default: 0
attributes:
  check_mode:
    support: full
    description: The same read-only reads.
  diff_mode:
    support: none
    description: Returns no diff.
author:
  - deployer maintainers (@deployer)
"""

EXAMPLES = r"""
- name: Read the host.
  preflight_facts:
    model_dir: /srv/models/Kimi-K2.5
    port: 8000
    service_name: deployer-engine
    service_user: vllm
  register: host
"""

RETURN = r"""
gpu_health:
  description:
    - Each GPU's health for a long load (module_utils gpu_health), C(refusals) and C(warnings) lists of
      C({gpu, what, evidence, action, line}), C(notes) about what could not be read, and C(gate_python) whether
      the interpreter the gate before every start runs with (/usr/bin/python3) is there.
  returned: with model_dir
  type: dict
smi:
  description: nvidia-smi's answer to the GPU query (rc, stdout, stderr, msg when it could not run).
  returned: with model_dir
  type: dict
service_active:
  description: C(systemctl is-active) of the unit (active, inactive, failed, ...).
  returned: with model_dir
  type: str
retire_units:
  description:
    - Other units of I(deploy_root) still installed (a renamed unit; host_io.deployer_units), each with
      C(systemctl is-active).  The start stage stops and removes them; their server's GPU memory and port are ours.
  returned: with model_dir
  type: list
  elements: dict
model_config_exists:
  description: Whether I(model_dir)/config.json exists.
  returned: with model_dir
  type: bool
index_files:
  description: The shard names C(model.safetensors.index.json)'s weight_map lists (sorted, unique); null when unread.
  returned: with model_dir
  type: list
  elements: str
index_error:
  description: Why the shard index could not be read, or an empty string.
  returned: with model_dir
  type: str
shards_present:
  description: C(*.safetensors) names in I(model_dir) (any file type, hidden names left out).
  returned: with model_dir
  type: list
  elements: str
shard_check:
  description:
    - The listed shards against their own headers (bad, checked, tensor_bytes); checked 0 when a shard is missing.
    - C(tensor_groups), the good shards' tensor bytes by name template (layer and expert numbers as N), is what the
      memory plan reads (deployer/memory_plan.py).
  returned: with model_dir
  type: dict
port_holders:
  description: C(pid N (comm)) of each process listening on I(port) outside the server's unit.
  returned: with model_dir
  type: list
  elements: str
nvidia_devices:
  description: The NVIDIA character device names in /proc/devices (sorted, unique).
  returned: with model_dir
  type: list
  elements: str
nvidia_nodes:
  description: The C(/dev/nvidia*) character device nodes present (names, sorted).
  returned: with model_dir
  type: list
  elements: str
iommu:
  description:
    - What decides whether PCIe peer-to-peer between the GPUs passes an IOMMU - C(devices), the entries of
      /sys/class/iommu; C(cmdline), the kernel command line; C(uvm_disable_hmm), nvidia_uvm's parameter (null when
      the module is not loaded); C(acs), PCIe ACS on the bridges above each NVIDIA GPU (C(gpus), C(redirecting) - gpu,
      bridge, port, flags of each bridge whose ACS redirects peer-to-peer -, C(unreadable)); C(topo_p2p), what
      C(nvidia-smi topo -p2p r) printed (the driver's P2P read status of every GPU pair), null when it failed.
  returned: with model_dir
  type: dict
service_user_exists:
  description: Whether I(service_user) is in the passwd database.
  returned: with model_dir
  type: bool
service_user_entry:
  description: The service user's passwd entry (home, shell, gecos), its supplementary groups and those of them that
    hand out root or root's secrets (privileged_groups), or null when it does not exist.
  returned: with model_dir
  type: dict
unreadable:
  description: Checkpoint entries (C(.) for the directory) the service user could not read.
  returned: with model_dir
  type: list
  elements: str
exists:
  description: For each of I(stat_paths), whether it exists.
  returned: always
  type: dict
lstat:
  description: For each of I(stat_paths), the path itself (a symlink is not followed) as type (dir, link, file,
    other), uid, gid and mode (octal string); null when it does not exist.
  returned: always
  type: dict
df:
  description: For each of I(df_paths), C(device free_kib measured_path) (the df filter's input format).
  returned: always
  type: list
  elements: str
files:
  description: For each of I(read_files), its text, or null when it cannot be read.
  returned: always
  type: dict
"""

import fnmatch
import grp
import json
import os
import pwd
import re
import stat
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpu_health import judge
from ansible.module_utils.gpu_health import read as read_gpu_health
from ansible.module_utils.host_io import deployer_units, nvidia_devices
from ansible.module_utils.pci_acs import acs_report
from ansible.module_utils.safetensors_header import check_shards

SMI_QUERY = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,memory.used,compute_cap,mig.mode.current",
             "--format=csv,noheader"]
# what the server reads from the checkpoint directory (and the directory itself, '.')
CHECKPOINT_PATTERNS = ("*.json", "*.safetensors", "*.py", "*.model", "*.tiktoken")
READABLE_AS_USER = ('for f in . *.json *.safetensors *.py *.model *.tiktoken; do '
                    '[ -e "$f" ] && { [ -r "$f" ] || echo "$f"; }; done; true')


def run(argv, **kw):
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                           timeout=60, **kw)
    except (OSError, subprocess.SubprocessError) as e:
        return dict(rc=2, stdout="", stderr="", msg=str(e))
    return dict(rc=p.returncode, stdout=p.stdout.rstrip("\n"), stderr=p.stderr.rstrip("\n"), msg="")


def shard_index(model_dir):
    path = os.path.join(model_dir, "model.safetensors.index.json")
    try:
        with open(path) as f:
            values = json.load(f)["weight_map"].values()
        return sorted(set(str(v) for v in values)), ""
    except OSError as e:
        return None, "%s: %s" % (path, e.strerror)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return None, "%s: not a shard index (%s)" % (path, e)


def shards_present(model_dir):
    try:
        names = os.listdir(model_dir)
    except OSError:
        return []
    return sorted(n for n in names if not n.startswith(".") and fnmatch.fnmatch(n, "*.safetensors"))


def port_holders(port, service_names):
    """Listeners on the port whose cgroup is not one of the server's own units."""
    out = run(["ss", "-H", "-ltnp", "sport = :%d" % port])["stdout"]
    holders = []
    for pid in sorted(set(re.findall(r"pid=(\d+)", out)), key=int):
        try:
            with open("/proc/%s/cgroup" % pid) as f:
                cgroup = f.read()
                if any("/%s.service" % name in cgroup for name in service_names):
                    continue
        except OSError:
            pass
        try:
            with open("/proc/%s/comm" % pid) as f:
                comm = f.read().strip()
        except OSError:
            comm = ""
        holders.append("pid %s (%s)" % (pid, comm))
    return holders


def unreadable(model_dir, user, user_exists):
    """Checkpoint entries the service user could not read: asked as that user when it exists; else (it is made
    later, with no groups) only what "others" may read counts."""
    if not os.path.isdir(model_dir):
        return []
    if user_exists:
        r = run(["runuser", "-u", user, "--", "/bin/sh", "-c", READABLE_AS_USER], cwd=model_dir)
        return [x for x in r["stdout"].splitlines() if x]
    out = []
    st = os.stat(model_dir)
    if not (st.st_mode & stat.S_IROTH and st.st_mode & stat.S_IXOTH):
        out.append(".")
    for name in sorted(os.listdir(model_dir)):
        if any(fnmatch.fnmatch(name, p) for p in CHECKPOINT_PATTERNS):
            try:
                if not os.stat(os.path.join(model_dir, name)).st_mode & stat.S_IROTH:
                    out.append(name)
            except OSError:
                out.append(name)
    return out


def free_kib(path):
    """``device free_kib path`` of the nearest existing parent of ``path`` (what disk_shortfalls reads)."""
    p = path
    while not os.path.exists(p) and p not in ("/", ""):
        p = os.path.dirname(p)
    st = os.statvfs(p)
    return "%d %d %s" % (os.stat(p).st_dev, st.f_bavail * st.f_frsize // 1024, p)


def read_text(path, limit=4 << 20):
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return None
    return data[:limit].decode("utf-8", "replace") if len(data) <= limit else None


def lstat_of(path):
    """The path itself, never what a symlink names: type, owner and mode, or None when absent."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    kind = ("dir" if stat.S_ISDIR(st.st_mode) else "link" if stat.S_ISLNK(st.st_mode)
            else "file" if stat.S_ISREG(st.st_mode) else "other")
    return dict(type=kind, uid=st.st_uid, gid=st.st_gid, mode="%04o" % stat.S_IMODE(st.st_mode))


# Groups whose members are root in all but name (a socket or device that hands out root: docker, lxd, libvirt, disk)
# or read what root keeps (shadow, adm's logs): remote code in the server would inherit them.  An account that
# existed before the deployer keeps its groups (ansible.builtin.user does not remove them).
PRIVILEGED_GROUPS = ("root", "sudo", "wheel", "admin", "adm", "docker", "lxd", "incus-admin", "libvirt", "disk",
                     "shadow", "kmem", "systemd-journal")


def supplementary_groups(user, primary_gid):
    """The names of the groups ``user`` is a member of besides its primary one."""
    return sorted(g.gr_name for g in grp.getgrall() if user in g.gr_mem and g.gr_gid != primary_gid)


def nvidia_nodes(dev="/dev"):
    try:
        names = os.listdir(dev)
    except OSError:
        return []
    out = []
    for n in names:
        if n.startswith("nvidia"):
            try:
                if stat.S_ISCHR(os.stat(os.path.join(dev, n)).st_mode):
                    out.append(n)
            except OSError:
                pass
    return sorted(out)


def iommu():
    try:
        devices = len(os.listdir("/sys/class/iommu"))
    except OSError:
        devices = 0
    hmm = read_text("/sys/module/nvidia_uvm/parameters/uvm_disable_hmm", 64)
    topo = run(["nvidia-smi", "topo", "-p2p", "r"])
    return dict(devices=devices, cmdline=(read_text("/proc/cmdline", 65536) or "").strip(),
                uvm_disable_hmm=hmm.strip() if hmm is not None else None, acs=acs_report(),
                topo_p2p=topo["stdout"][:65536] if topo["rc"] == 0 else None)


def main():
    m = AnsibleModule(argument_spec=dict(
        model_dir=dict(type="path"),
        port=dict(type="int"),
        service_name=dict(type="str"),
        service_user=dict(type="str"),
        deploy_root=dict(type="path"),
        stat_paths=dict(type="list", elements="path", default=[]),
        df_paths=dict(type="list", elements="path", default=[]),
        read_files=dict(type="list", elements="path", default=[]),
        gpu_health_since_epoch=dict(type="int", default=0),
    ), required_together=[("model_dir", "port", "service_name", "service_user")], supports_check_mode=True)
    p = m.params
    res = dict(changed=False, exists=dict((x, os.path.exists(x)) for x in p["stat_paths"]),
               lstat=dict((x, lstat_of(x)) for x in p["stat_paths"]),
               df=[free_kib(x) for x in p["df_paths"]], files=dict((x, read_text(x)) for x in p["read_files"]))
    if p["model_dir"]:
        d = p["model_dir"]
        listed, index_error = shard_index(d)
        present = shards_present(d)
        bad, checked, tensor_bytes, tensor_groups = [], 0, 0, {}
        if listed is not None and not set(listed) - set(present):
            bad, checked, tensor_bytes = check_shards(d, listed, groups=tensor_groups)
        try:
            pw = pwd.getpwnam(p["service_user"])
            groups = supplementary_groups(pw.pw_name, pw.pw_gid)
            entry = dict(home=pw.pw_dir, shell=pw.pw_shell, gecos=pw.pw_gecos, groups=groups,
                         privileged_groups=[g for g in groups if g in PRIVILEGED_GROUPS])
        except KeyError:
            entry = None
        user_exists = entry is not None
        others = [n for n in (deployer_units(p["deploy_root"]) if p["deploy_root"] else []) if n != p["service_name"]]
        rows, events, notes = read_gpu_health(p["gpu_health_since_epoch"])
        refusals, warnings = judge(rows, events)
        res.update(
            gpu_health=dict(refusals=refusals, warnings=warnings, notes=notes,
                            gate_python=os.access("/usr/bin/python3", os.X_OK)),
            retire_units=[dict(name=n, active=run(["systemctl", "is-active", n])["stdout"].strip()) for n in others],
            smi=run(SMI_QUERY),
            service_active=run(["systemctl", "is-active", p["service_name"]])["stdout"].strip(),
            model_config_exists=os.path.exists(os.path.join(d, "config.json")),
            index_files=listed, index_error=index_error, shards_present=present,
            shard_check=dict(bad=bad, checked=checked, tensor_bytes=tensor_bytes, tensor_groups=tensor_groups),
            port_holders=port_holders(p["port"], [p["service_name"]] + others),
            nvidia_devices=nvidia_devices(), nvidia_nodes=nvidia_nodes(), iommu=iommu(),
            service_user_exists=user_exists, service_user_entry=entry,
            unreadable=unreadable(d, p["service_user"], user_exists))
    m.exit_json(**res)


if __name__ == "__main__":
    main()
