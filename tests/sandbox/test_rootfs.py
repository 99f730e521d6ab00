"""plan_root_args without I/O: a fake host tree."""

from __future__ import annotations

from trio_swe.sandbox.local._rootfs import plan_root_args

TREE = {
    "/": ["bin", "etc", "home", "opt", "proc", "tmp", "usr"],
    "/etc": ["passwd", "hosts"],
    "/home": ["alice"],
    "/opt": ["tool"],
    "/usr": ["bin"],
}
LINKS = {"/bin": "usr/bin"}


def plan(mounts: dict[str, tuple[str, str]]) -> list[str]:
    return plan_root_args(
        mounts,
        listdir=lambda d: TREE.get(d, []),
        is_symlink=lambda p: p in LINKS,
        readlink=lambda p: LINKS[p],
        is_dir=lambda p: p in TREE,
        exists=lambda p: (
            p in TREE
            or p in LINKS
            or any(p == f"{d.rstrip('/')}/{n}" for d, names in TREE.items() for n in names)
        ),
    )


def triples(args: list[str]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    i = 0
    while i < len(args):
        if args[i] in ("--dir", "--dev", "--proc", "--tmpfs", "--perms"):
            out.append((args[i], args[i + 1]))
            i += 2
        else:
            out.append((args[i], args[i + 1], args[i + 2]))
            i += 3
    return out


def test_host_root_read_only_with_private_proc_dev_tmp() -> None:
    got = triples(plan({"/testbed": ("bind", "/state/ws")}))
    assert ("--symlink", "usr/bin", "/bin") in got
    assert ("--ro-bind", "/usr", "/usr") in got
    assert ("--ro-bind", "/etc", "/etc") in got
    assert ("--tmpfs", "/tmp") in got
    assert not any(t[-1] in ("/proc", "/tmp") and t[0] == "--ro-bind" for t in got)
    assert got[-1] == ("--bind", "/state/ws", "/testbed")


def test_new_mount_point_inside_a_host_directory_splits_it() -> None:
    got = triples(plan({"/home/agent": ("bind", "/s/home")}))
    assert ("--dir", "/home") in got
    assert ("--ro-bind", "/home/alice", "/home/alice") in got
    assert ("--ro-bind", "/home", "/home") not in got
    assert got[-1] == ("--bind", "/s/home", "/home/agent")


def test_mount_over_an_existing_host_path_splits_nothing() -> None:
    # Every split costs a bind per child; mounting over /etc/passwd needs none.
    got = triples(plan({"/etc/passwd": ("ro-bind", "/s/passwd")}))
    assert ("--ro-bind", "/etc", "/etc") in got
    assert not any(t[0] == "--dir" for t in got)
    assert got[-1] == ("--ro-bind", "/s/passwd", "/etc/passwd")


def test_nested_mounts_are_applied_shallow_first() -> None:
    got = triples(
        plan({"/opt/conda/bin/activate": ("ro-bind", "/s/act"), "/opt/conda": ("bind", "/s/c")})
    )
    order = [t[-1] for t in got]
    assert order.index("/opt/conda") < order.index("/opt/conda/bin/activate")
    assert ("--ro-bind", "/opt/tool", "/opt/tool") in got
