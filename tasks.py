"""specops tasks. `inv --list` for all, `inv --help TASK` for one.

--host defaults to $SPECOPS_HOST, then invoke.yaml's `specops.host`, then the built-in `local`.
--hosts defaults to $SPECOPS_HOSTS, then ./hosts.yaml.
"""

from invoke import Collection, task
from rich.table import Table

from specops import bootstrap as _bootstrap
from specops import check as _check
from specops import inventory
from specops.cli import errors, hosts_file, session
from specops.push import push as _push
from specops.ui import console

HOST = "host name from hosts.yaml (or `local`); default $SPECOPS_HOST / invoke.yaml / local"
HOSTS = "inventory file; default $SPECOPS_HOSTS, then ./hosts.yaml"


@task(help={"hosts": HOSTS})
def hosts(c, hosts=None):
    """Table of the hosts in hosts.yaml, plus the built-in `local`."""
    with errors():
        inv = inventory.load(hosts_file(c, hosts))
    tab = Table(title=f"hosts ({inv.where})")
    for col in ("name", "target", "profile", "gpus", "venv", "workdir", "verifier"):
        tab.add_column(col)
    for name in inv.names():
        h = inv.hosts[name]
        tab.add_row(name, h.target, h.profile, "" if h.gpus is None else str(h.gpus),
                    h.venv_path, h.workdir_path, h.verifier or "")
    console.print(tab)
    for g, members in sorted(inv.groups.items()):
        console.print(f"group @{g}: {', '.join(members)}")


@task(help={"host": HOST, "hosts": HOSTS,
            "profile": "profile in bootstrap/profiles/ (default: the host's `profile`)",
            "force": "reinstall the profile even if the venv's stamp matches"})
def bootstrap(c, host=None, hosts=None, profile=None, force=False):
    """Create or refresh the host venv from a pinned profile and push remote/ (idempotent)."""
    with session(c, host, hosts) as t:
        _bootstrap.bootstrap(t, profile=profile, force=force)


@task(help={"host": HOST, "hosts": HOSTS, "json": "print the raw result as JSON",
            "min_free_gb": "free disk the workdir must have (GiB, default 5)"})
def check(c, host=None, hosts=None, json=False, min_free_gb=5.0):
    """Preflight, run by the host venv's interpreter: versions, imports, devices, disk."""
    with session(c, host, hosts) as t:
        res = _check.check(t, min_free_gb=float(min_free_gb))
        _check.render(t.host.name, res, as_json=json)
        _check.verdict(t.host.name, res)


@task(help={"host": HOST, "hosts": HOSTS})
def push(c, host=None, hosts=None):
    """Push remote/ (and the profiles) to the host's workdir; only changed files travel."""
    with session(c, host, hosts) as t:
        sent = _push(t)
        console.print(f"push {t.host.name}: " + (f"{len(sent)} file(s) sent" if sent else "already in sync"))


ns = Collection(hosts, bootstrap, check, push)
ns.configure({"specops": {"host": None, "hosts": None}})
