#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: service_dirs
short_description: Make the service user's directories without ever following a path that user can write
description:
  - Ensures I(name) inside I(base) and each of I(subdirs) inside it are real directories owned by I(owner)
    with I(mode). Root never follows a path the service user can write (docs/security.md). Every step works
    on an open directory descriptor (C(O_NOFOLLOW), C(fchown), C(fchmod)), never on a path, so a symlink
    planted by the service user (for example C(triton) -> C(/etc/systemd/system)) is never followed, not even
    in a race between a check and the change.
  - A symlink or any other non-directory where a directory belongs is removed (the link itself, never its
    target) and a real directory is made in its place; the result names each one in C(replaced).
  - I(base) must be a directory owned by root and writable by nobody else, or the module fails and changes
    nothing.
options:
  base:
    description: Root's directory that holds I(name) (for example C(/opt/deployer/cache)).
    type: path
    required: true
  name:
    description: The service user's directory inside I(base) (a plain name).
    type: str
    required: true
  subdirs:
    description: Plain names of directories to ensure inside I(name).
    type: list
    elements: str
    default: []
  owner:
    description: The service user (owner and group of every directory).
    type: str
    required: true
  mode:
    description: Mode of every directory, octal.
    type: str
    default: "0750"
attributes:
  check_mode:
    support: full
    description: Reports what would change and changes nothing.
  diff_mode:
    support: none
    description: Returns no diff.
author:
  - deployer maintainers (@deployer)
"""

EXAMPLES = r"""
- name: Ensure the server's caches exist, owned by the service user.
  service_dirs:
    base: /opt/deployer/cache
    name: server
    subdirs: [vllm, triton, huggingface]
    owner: vllm
"""

RETURN = r"""
made:
  description: Directories created (paths).
  returned: always
  type: list
  elements: str
fixed:
  description: Directories whose owner or mode was corrected (paths).
  returned: always
  type: list
  elements: str
replaced:
  description: Non-directories (symlinks, files) found where a directory belongs, removed and replaced.
  returned: always
  type: list
  elements: str
"""

import grp
import os
import pwd
import stat

from ansible.module_utils.basic import AnsibleModule

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class Refused(Exception):
    pass


def _plain(name):
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise Refused("expected a plain directory name, got %r" % (name,))
    return name


def ensure_at(dfd, name, where, uid, gid, mode, check, out):
    """Ensure ``name`` in the directory open as ``dfd`` is a directory (uid, gid, mode); returns its open fd
    (None in check mode when it does not exist yet)."""
    path = os.path.join(where, name)
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        kind = "symlink to %s" % os.readlink(name, dir_fd=dfd) if stat.S_ISLNK(st.st_mode) else "non-directory"
        out["replaced"].append("%s (was a %s)" % (path, kind))
        if check:
            out["made"].append(path)
            return None
        os.unlink(name, dir_fd=dfd)          # the link itself, never what it points to
        st = None
    if st is None:
        out["made"].append(path)
        if check:
            return None
        os.mkdir(name, mode, dir_fd=dfd)
    try:
        fd = os.open(name, _DIR, dir_fd=dfd)  # ELOOP if it became a symlink since: refused, nothing followed
    except OSError as e:
        raise Refused("%s: not opened as a directory without following links (%s); changed nothing there"
                      % (path, e.strerror)) from e
    st = os.fstat(fd)
    if (st.st_uid, st.st_gid) != (uid, gid) or stat.S_IMODE(st.st_mode) != mode:
        if path not in out["made"]:
            out["fixed"].append(path)
        if not check:
            os.fchown(fd, uid, gid)
            os.fchmod(fd, mode)
    return fd


def run(base, name, subdirs, uid, gid, mode, check):
    out = {"made": [], "fixed": [], "replaced": []}
    bfd = os.open(base, _DIR)
    fds = [bfd]
    try:
        st = os.fstat(bfd)
        if st.st_uid != 0 or st.st_mode & 0o022:
            raise Refused("%s: owned by uid %d with mode %04o; expected root's, writable by root alone"
                          % (base, st.st_uid, stat.S_IMODE(st.st_mode)))
        home = ensure_at(bfd, _plain(name), base, uid, gid, mode, check, out)
        if home is not None:
            fds.append(home)
            for sub in subdirs:
                fd = ensure_at(home, _plain(sub), os.path.join(base, name), uid, gid, mode, check, out)
                if fd is not None:
                    fds.append(fd)
        else:
            out["made"] += [os.path.join(base, name, _plain(s)) for s in subdirs]
    finally:
        for fd in fds:
            os.close(fd)
    return out


def main():
    m = AnsibleModule(argument_spec=dict(base=dict(type="path", required=True),
                                         name=dict(type="str", required=True),
                                         subdirs=dict(type="list", elements="str", default=[]),
                                         owner=dict(type="str", required=True),
                                         mode=dict(type="str", default="0750")),
                      supports_check_mode=True)
    p = m.params
    try:
        pw = pwd.getpwnam(p["owner"])
        uid, gid = pw.pw_uid, grp.getgrgid(pw.pw_gid).gr_gid
    except KeyError:
        if m.check_mode:   # the user is made by an earlier task of the same run
            m.exit_json(changed=True, made=[], fixed=[], replaced=[], msg="user %s does not exist yet" % p["owner"])
        m.fail_json(msg="owner %s: no such user" % p["owner"])
    try:
        mode = int(p["mode"], 8)
        out = run(p["base"], p["name"], p["subdirs"], uid, gid, mode, m.check_mode)
    except (Refused, ValueError) as e:
        m.fail_json(msg=str(e))
    except OSError as e:
        m.fail_json(msg="%s: %s" % (e.filename or p["base"], e.strerror))
    changed = bool(out["made"] or out["fixed"] or out["replaced"])
    if out["replaced"]:
        m.warn("replaced what the service user could have planted (never followed): " + "; ".join(out["replaced"]))
    m.exit_json(changed=changed, **out)


if __name__ == "__main__":
    main()
