"""plan_root_args without I/O: a fake host tree."""

from __future__ import annotations

import pytest

from trio_swe.sandbox.local._rootfs import HostRootCache, mount_args, plan_root_args

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


# -- HostRootCache: the plan reused while the host tree is unchanged --------------------------


class _Host:
    """A fake host tree's lstat (mode, ino, dev, mtime) per path, and a clock."""

    def __init__(self) -> None:
        self.now = 100.0
        self.state: dict[str, tuple[int, int, int, int]] = {
            p: (0o40755, i, 1, 10 * 10**9) for i, p in enumerate(["/", "/home", "/etc"])
        }
        self.listings = 0

    def plan(self, targets: object) -> list[str]:
        self.listings += 1
        return ["--ro-bind", "/etc", "/etc", f"listing-{self.listings}"]

    def cache(self) -> HostRootCache:
        return HostRootCache(
            state=self.state.get, now=lambda: self.now, plan=self.plan, settle_sec=1.0
        )


def test_the_host_root_is_planned_once_while_unchanged() -> None:
    host = _Host()
    cache = host.cache()
    targets = ["/home/agent", "/etc/passwd"]
    first = cache.host_args(targets)
    assert cache.host_args(reversed(targets)) == first
    assert host.listings == 1
    first.append("mutated")  # callers get their own list
    assert cache.host_args(targets) == ["--ro-bind", "/etc", "/etc", "listing-1"]
    # Another set of targets is planned on its own.
    cache.host_args(["/testbed"])
    assert host.listings == 2


def test_plans_are_kept_for_the_most_recent_target_sets_only() -> None:
    host = _Host()
    cache = HostRootCache(
        state=host.state.get, now=lambda: host.now, plan=host.plan, settle_sec=1.0, maxsize=4
    )
    # Rows may each name their own workdir: a run of days must not keep a plan for every one.
    for i in range(100):
        cache.host_args([f"/work{i}"])
    assert host.listings == 100
    assert len(cache._plans) == len(cache._paths) == 4
    cache.host_args(["/work99"])  # recent: reused
    assert host.listings == 100
    cache.host_args(["/work0"])  # evicted long ago: planned again
    assert host.listings == 101


@pytest.mark.parametrize("change", ["listing", "kind", "target_appears", "ancestor_replaced"])
def test_a_change_of_the_host_tree_plans_again(change: str) -> None:
    host = _Host()
    cache = host.cache()
    targets = ["/home/agent"]
    cache.host_args(targets)
    if change == "listing":  # an entry added in /home
        host.state["/home"] = (0o40755, 1, 1, 50 * 10**9)
    elif change == "kind":
        host.state["/home"] = (0o120777, 1, 1, 10 * 10**9)  # now a symlink
    elif change == "target_appears":
        host.state["/home/agent"] = (0o40755, 7, 1, 10 * 10**9)
    elif change == "ancestor_replaced":
        host.state["/home"] = (0o40755, 99, 1, 10 * 10**9)  # another inode
    assert cache.host_args(targets)[-1] == "listing-2"
    assert cache.host_args(targets)[-1] == "listing-2"  # and that plan is kept


def test_a_plan_of_a_recently_changed_tree_is_not_kept() -> None:
    host = _Host()
    host.state["/home"] = (0o40755, 1, 1, int(99.5 * 10**9))  # half a second ago
    cache = host.cache()
    assert cache.host_args(["/home/agent"])[-1] == "listing-1"
    assert cache.host_args(["/home/agent"])[-1] == "listing-2"  # not trusted yet
    host.now = 101.0  # settled
    assert cache.host_args(["/home/agent"])[-1] == "listing-3"
    assert cache.host_args(["/home/agent"])[-1] == "listing-3"


def test_the_real_tree_plans_as_plan_root_args() -> None:
    mounts = {"/testbed": ("bind", "/s/ws"), "/etc/passwd": ("ro-bind", "/s/passwd")}
    cache = HostRootCache()
    assert cache.host_args(mounts) + mount_args(mounts) == plan_root_args(mounts)
