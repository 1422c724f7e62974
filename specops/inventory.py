"""hosts.yaml: the inventory of hosts (and groups), validated with pydantic.

Lookup order for the file: ``--hosts FILE``, then ``$SPECOPS_HOSTS``, then ``./hosts.yaml``.
The host ``local`` is built in (this machine, no SSH); hosts.yaml may override its fields.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specops import contract
from specops.contract import check_name
from specops.errors import SpecopsError

LOCAL = "local"
LOCAL_ROOT = "~/.cache/specops"
#: more GPUs than any one host has: a larger `gpus` is a typo
MAX_GPUS = 1024

#: vLLM options specops sets itself on every server it starts: the contract's one list (the host
#: refuses a run's `--vllm-arg` by the same one)
VLLM_RESERVED = contract.VLLM_RESERVED


#: vLLM arguments specops sets from a host's own fields: in `vllm_args` they would fight them
HOST_FIELD_ARGS = {"--tensor-parallel-size": "`tensor_parallel: N`", "-tp": "`tensor_parallel: N`",
                   "--trust-remote-code": "`trust_remote_code: true`", "--no-trust-remote-code":
                   "`trust_remote_code: false`"}

#: Slurm's time limit forms: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
SLURM_TIME_FORMS = "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"


def slurm_seconds(text: str) -> Optional[int]:
    """A Slurm time limit in seconds (None for UNLIMITED/INFINITE); ValueError saying the forms."""
    t = str(text).strip()
    if t.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days, dash, rest = t.partition("-")
    if not dash:
        days, rest = "0", t
    parts = rest.split(":")
    ok = days.isdigit() and all(x.isdigit() for x in parts) and 1 <= len(parts) <= 3
    if not ok:
        raise ValueError(f"{text!r} is not a Slurm time limit (give {SLURM_TIME_FORMS}, e.g. 04:00:00)")
    n = [int(x) for x in parts]
    if len(n) > 1 and any(x > 59 for x in n[1:]):  # (the minutes and seconds after a colon)
        raise ValueError(f"{text!r}: minutes and seconds after a colon are 0 to 59 (give {SLURM_TIME_FORMS}, "
                         f"e.g. 04:00:00)")
    if dash:  # D-HH[:MM[:SS]]
        h, m, s = (n + [0, 0])[:3]
    elif len(n) == 1:  # minutes
        h, m, s = 0, n[0], 0
    elif len(n) == 2:  # MM:SS
        h, m, s = 0, n[0], n[1]
    else:
        h, m, s = n
    return int(days) * 86400 + h * 3600 + m * 60 + s


class Slurm(BaseModel):
    """What a job of a `scheduler: slurm` host asks Slurm for (sbatch's options), and the lines
    each node runs first. The host's address/user/key are its login node."""

    model_config = ConfigDict(extra="forbid", strict=True)

    #: default: the cluster's default partition
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    #: sbatch --time (default: the partition's default)
    time: Optional[str] = None
    nodes: int = Field(default=1, ge=1, le=MAX_GPUS)
    gpus_per_node: int = Field(default=0, ge=0, le=MAX_GPUS)
    constraint: Optional[str] = None
    #: shell lines each node runs before specops' command (e.g. `module load cuda/12.4`)
    setup: list[str] = Field(default_factory=list)

    @field_validator("partition", "account", "qos", "constraint")
    @classmethod
    def _word(cls, v):
        if v is not None and (not v.strip() or any(ch.isspace() for ch in v)):
            raise ValueError(f"{v!r}: give one word, no spaces")
        return v

    @field_validator("time")
    @classmethod
    def _time(cls, v):
        if v is not None and not slurm_seconds(v):  # (None: UNLIMITED; 0: "0", which Slurm reads as no limit too)
            raise ValueError(f"{v!r}: give a limit ({SLURM_TIME_FORMS}); leave it out for the partition's default")
        return v

    @field_validator("setup")
    @classmethod
    def _setup(cls, v):
        for line in v:
            if not line.strip() or "\n" in line:
                raise ValueError("every setup entry is one non-empty shell line")
        return v

    @property
    def time_s(self) -> Optional[int]:
        return None if self.time is None else slurm_seconds(self.time)


class Host(BaseModel):
    """One host entry. Unknown keys and wrong types are errors."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(default="", exclude=True)
    transport: Literal["ssh", "local"] = "ssh"
    address: Optional[str] = None
    user: str = "root"
    port: int = Field(default=22, ge=1, le=65535)
    key: Optional[str] = None
    known_hosts: str = "~/.ssh/known_hosts"
    accept_new_host_key: bool = False
    proxy_jump: Optional[str] = None
    connect_timeout: int = Field(default=10, ge=1, le=600)
    venv: Optional[str] = None
    workdir: Optional[str] = None
    base_python: str = "python3"
    profile: Literal["cuda", "cpu"] = "cuda"
    gpus: Optional[int] = Field(default=None, ge=0, le=MAX_GPUS)
    #: Path on the host of the verifier model (a HF-format directory).
    verifier: Optional[str] = None
    #: `venv` is an existing environment (e.g. an image's preinstalled torch venv): bootstrap never
    #: creates or upgrades it, only tops it up with what the profile lacks (`inv bootstrap --wheelhouse`).
    venv_existing: bool = False
    #: Environment for the jobs specops starts there (e.g. NCCL_SOCKET_IFNAME); sent in a 0600 file.
    env: dict[str, str] = Field(default_factory=dict)
    #: The host's data dirs are on a filesystem shared with the other hosts of its groups.
    shared_data: bool = False
    #: The host reaches the other hosts of its groups over SSH at their hosts.yaml addresses:
    #: shards move host to host, authenticated by the laptop's ssh-agent, forwarded.
    reach_peers: bool = False
    #: GPUs one vLLM server spans (`--tensor-parallel-size`); default: `gpus`, else 1.
    tensor_parallel: Optional[int] = Field(default=None, ge=1, le=MAX_GPUS)
    #: Run the verifier's own modelling code (config.json `auto_map`) in vLLM, prepare-data,
    #: transformers: `auto` = only when its config.json has `auto_map`.
    trust_remote_code: Union[Literal["auto"], bool] = "auto"
    #: Extra arguments for every vLLM server specops starts there, after its own (e.g.
    #: ["--enable-expert-parallel"]); a run's `--vllm-arg`s come after these.
    vllm_args: list[str] = Field(default_factory=list)
    #: `slurm`: the host is a cluster's login node; jobs run on compute nodes through Slurm
    #: (sbatch, squeue, scontrol, scancel, sinfo), with the settings under `slurm:`.
    scheduler: Optional[Literal["slurm"]] = None
    slurm: Optional[Slurm] = None
    #: What an hour of this host costs (any currency), for `inv plan`'s cost column: the whole host's
    #: (`price_per: host`, the default) or one GPU's (`price_per: gpu`: times `gpus`).
    price_per_hour: Optional[float] = Field(default=None, ge=0, le=1e6)
    price_per: Literal["host", "gpu"] = "host"
    #: How many times a training that ends abnormally is restarted from its last complete checkpoint
    #: (`inv train --restarts`); default 3 on a cuda host, 0 on a cpu host.
    restarts: Optional[int] = Field(default=None, ge=0, le=100)
    #: Where a training's end, failure, restart or stall is told: an http(s) webhook URL (Slack,
    #: Teams: a JSON {"text": ...} is POSTed) or a command run on the host (`inv train --notify`).
    notify: Optional[str] = None

    @field_validator("price_per_hour", mode="before")
    @classmethod
    def _price(cls, v):
        if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)):
            return None if v is None else float(v)
        raise ValueError(f"must be a number, the price of an hour (e.g. 3.5) (got {v!r})")

    @field_validator("notify")
    @classmethod
    def _notify(cls, v):
        from specops_host.jobs.notify import problem

        why = problem(v) if v is not None else None
        if why:
            raise ValueError(why)
        return v

    @field_validator("venv", "workdir", "base_python", "known_hosts", "key")
    @classmethod
    def _no_empty(cls, v):
        if v is not None and not str(v).strip():
            raise ValueError("must not be empty")
        return v

    @field_validator("proxy_jump")
    @classmethod
    def _jump(cls, v):
        if v is not None:
            parse_jump(v, "root")
        return v

    @field_validator("trust_remote_code", mode="before")
    @classmethod
    def _trust(cls, v):
        if v == "auto" or isinstance(v, bool):
            return v
        raise ValueError(f"must be auto, true or false (got {v!r})")

    @field_validator("vllm_args")
    @classmethod
    def _vllm_args(cls, v):
        for a in v:
            if not a.strip():
                raise ValueError("holds an empty argument")
            key = a.split("=", 1)[0].replace("_", "-")  # (vLLM reads --a_b as --a-b)
            if key in VLLM_RESERVED:
                raise ValueError(f"{a} sets {key}, which specops sets itself (so are "
                                 f"{', '.join(x for x in VLLM_RESERVED if x != key)})")
            if key in HOST_FIELD_ARGS:
                raise ValueError(f"{a} sets {key}, which specops sets from this host's "
                                 f"{HOST_FIELD_ARGS[key]}: set that field instead")
        return v

    @model_validator(mode="after")
    def _tensor_parallel_default(self):
        if self.scheduler == "slurm":
            self.slurm = self.slurm or Slurm()
            if self.gpus is None:  # (a node's GPUs: what --nproc defaults to)
                self.gpus = self.slurm.gpus_per_node
        if self.tensor_parallel is None:
            self.tensor_parallel = self.gpus or 1
        return self

    @property
    def restarts_default(self) -> int:
        """A training's restarts: hosts.yaml `restarts`, else 3 on a cuda host, 0 on a cpu host."""
        return self.restarts if self.restarts is not None else (3 if self.profile == "cuda" else 0)

    @property
    def is_slurm(self) -> bool:
        return self.scheduler == "slurm"

    # Defaults that depend on other fields.
    @property
    def venv_path(self) -> str:
        if self.venv:
            return self.venv
        if self.transport == "local":
            return f"{LOCAL_ROOT}/ml-env"
        return "/root/ml-env" if self.user == "root" else "~/ml-env"

    @property
    def workdir_path(self) -> str:
        if self.workdir:
            return self.workdir
        if self.transport == "local":
            return f"{LOCAL_ROOT}/work"
        return "/root/specops" if self.user == "root" else "~/specops"

    @property
    def python(self) -> str:
        """The host venv's interpreter: the only Python specops runs there."""
        return f"{self.venv_path.rstrip('/')}/bin/python3"

    @property
    def target(self) -> str:
        if self.transport == "local":
            return "this machine"
        return f"{self.user}@{self.address}:{self.port}"

    @property
    def trust_flag(self) -> str:
        """trust_remote_code as the host scripts take it: auto, true or false (auto is decided on
        the host, where the model's config.json is: on when it has `auto_map`)."""
        trust = self.trust_remote_code
        return trust if isinstance(trust, str) else str(trust).lower()

    def vllm_flags(self, extra: Optional[list[str]] = None) -> list[str]:
        """The arguments of remote/specops_host/data/datagen.py and remote/specops_host/serve/evaluate.py that carry
        this host's vLLM settings, then a run's own `--vllm-arg`s (last: they win)."""
        out = ["--tensor-parallel", str(self.tensor_parallel), "--trust-remote-code", self.trust_flag]
        for a in [*self.vllm_args, *(extra or [])]:
            out.append(f"--vllm-arg={a}")  # (one token: a value starting with '-' stays a value)
        return out


def parse_jump(spec: str, default_user: str) -> tuple[str, str, int]:
    """`[user@]host[:port]` (`[v6]:port`) -> (user, host, port); ValueError saying what is wrong."""
    form = "give [user@]host[:port], e.g. root@bastion:22 (one jump host)"
    if not spec.strip() or any(ch.isspace() for ch in spec) or "," in spec or "/" in spec:
        raise ValueError(f"{spec!r}: {form}")
    user, _, rest = spec.rpartition("@")
    host, port = rest, "22"
    if rest.startswith("["):  # [v6]:port
        host, close, p = rest[1:].partition("]")
        if not close or (p and not p.startswith(":")):
            raise ValueError(f"{spec!r}: {form}")
        port = p[1:] if p else "22"
    elif rest.count(":") == 1:
        host, port = rest.split(":")
    elif rest.count(":") > 1:
        raise ValueError(f"{spec!r}: an IPv6 address goes in brackets, e.g. root@[::1]:22")
    if not host or "@" in user:
        raise ValueError(f"{spec!r}: {form}")
    if not (port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(f"{spec!r}: port {port!r} is not a port (1-65535): {form}")
    return user or default_user, host, int(port)


def builtin_local() -> Host:
    return Host(name=LOCAL, transport="local", profile="cpu")


@dataclass
class Inventory:
    path: Optional[Path]
    hosts: dict[str, Host] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return str(self.path) if self.path else "(no hosts.yaml)"

    def names(self) -> list[str]:
        return sorted(self.hosts)

    def get(self, name: str) -> Host:
        if name in self.hosts:
            return self.hosts[name]
        known = ", ".join(self.names())
        if self.path is None:
            raise SpecopsError(
                f"unknown host {name!r}: no hosts.yaml found (looked for ./hosts.yaml and "
                f"$SPECOPS_HOSTS; give one with --hosts FILE); known hosts: {known}"
            )
        raise SpecopsError(f"unknown host {name!r} in {self.where}; known hosts: {known}")

    def resolve(self, spec: str) -> list[Host]:
        """``gpu1``, ``gpu1,gpu2`` or ``@group`` -> hosts (in order, no repeats)."""
        out: list[Host] = []
        for part in [p.strip() for p in spec.split(",") if p.strip()]:
            if part.startswith("@"):
                g = part[1:]
                if g not in self.groups:
                    known = ", ".join(sorted(self.groups)) or "none"
                    raise SpecopsError(f"unknown group {g!r} in {self.where}; known groups: {known}")
                members = [self.get(n) for n in self.groups[g]]
            else:
                members = [self.get(part)]
            out += [h for h in members if h.name not in {o.name for o in out}]
        if not out:
            raise SpecopsError("no host given: pass --host NAME (or set SPECOPS_HOST)")
        return out


def _hosts_path(p: Path, given: str, fix: str) -> Path:
    if p.is_dir():
        raise SpecopsError(f"hosts file {p} ({given}) is a directory: give the inventory file itself, "
                           f"e.g. {p / 'hosts.yaml'}")
    if not p.is_file():
        raise SpecopsError(f"hosts file {p} not found ({given}): {fix}" if not p.exists() else
                           f"hosts file {p} ({given}) is not a regular file: give the inventory file itself")
    return p


def find_file(explicit: Optional[str] = None) -> Optional[Path]:
    if explicit:
        return _hosts_path(Path(explicit).expanduser(), "given with --hosts", "check the path")
    env = os.environ.get("SPECOPS_HOSTS")
    if env:
        return _hosts_path(Path(env).expanduser(), "from $SPECOPS_HOSTS", "fix or unset it")
    p = Path("hosts.yaml")
    return p if p.is_file() else None


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last one)."""


class _DuplicateKey(yaml.MarkedYAMLError):
    pass


def _mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False):
    seen: dict = {}
    for k, _ in node.value:
        if k.tag == "tag:yaml.org,2002:merge":  # (`<<: *anchor`: its keys may be overridden)
            continue
        key = loader.construct_object(k, deep=True)
        try:
            first = seen.get(key)
        except TypeError:  # (an unhashable key: construct_mapping says so)
            break
        if first is not None:
            raise _DuplicateKey(problem=f"key {key!r} appears twice (first at line {first.line + 1}); "
                                        f"YAML would keep only the last one: remove one",
                                problem_mark=k.start_mark)
        seen[key] = k.start_mark
    return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def _field_error(path: Path, host: str, err: Any) -> str:
    loc = ".".join(str(x) for x in err["loc"])
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if err["type"] == "extra_forbidden":
        model = Slurm if len(err["loc"]) > 1 and err["loc"][0] == "slurm" else Host
        allowed = ", ".join(k for k in model.model_fields if k != "name")
        msg = f"unknown field (allowed: {allowed})"
    elif "input" in err and err["type"] not in ("missing", "value_error"):
        msg = f"{msg} (got {err['input']!r})"
    return f"{path}: host {host!r}, field {loc!r}: {msg}"


def load(explicit: Optional[str] = None) -> Inventory:
    path = find_file(explicit)
    inv = Inventory(path=path, hosts={LOCAL: builtin_local()})
    if path is None:
        return inv
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    except UnicodeDecodeError as e:
        line = path.read_bytes()[:e.start].count(b"\n") + 1
        raise SpecopsError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at line {line}): save it as "
                           f"UTF-8") from None
    except _DuplicateKey as e:
        mark = e.problem_mark  # (a duplicate key always has its mark: where the second one stands)
        raise SpecopsError(f"{path}: line {mark.line + 1}, column {mark.column + 1}: {e.problem}") from None  # type: ignore[union-attr]
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        raise SpecopsError(f"{path}: YAML syntax error at {where}: {e.problem}: fix the file") from None
    except (OSError, yaml.YAMLError) as e:
        raise SpecopsError(f"{path}: cannot read: {e}") from None
    if raw is None:
        raise SpecopsError(f"{path}: the file is empty: give `hosts:` (name -> fields), as in the repo's "
                           f"hosts.yaml, or point --hosts / $SPECOPS_HOSTS elsewhere")
    if not isinstance(raw, dict):
        raise SpecopsError(f"{path}: top level must be a mapping with 'hosts:' (and 'groups:')")
    extra = set(raw) - {"hosts", "groups"}
    if extra:
        raise SpecopsError(f"{path}: unknown top-level key(s) {sorted(extra)}: only 'hosts' and 'groups' are allowed")
    if not raw.get("hosts"):
        raise SpecopsError(f"{path}: no hosts in it: give `hosts:` (name -> fields), as in the repo's hosts.yaml")
    hosts = raw["hosts"]
    if not isinstance(hosts, dict):
        raise SpecopsError(f"{path}: 'hosts' must be a mapping of name -> fields")
    for name, fields in hosts.items():
        name = str(name)
        try:
            check_name("host name", name)  # (a host name becomes a path: runs/, caches, locks)
        except SpecopsError as e:
            raise SpecopsError(f"{path}: {e}") from None
        if not isinstance(fields, dict):
            raise SpecopsError(f"{path}: host {name!r} must be a mapping of fields (got {fields!r})")
        base = {"transport": "local", "profile": "cpu"} if name == LOCAL else {}
        try:
            h = Host.model_validate({**base, **fields, "name": name})
        except ValidationError as e:
            errs = e.errors()
            more = f" (+{len(errs) - 1} more)" if len(errs) > 1 else ""
            raise SpecopsError(_field_error(path, name, errs[0]) + more) from None
        if h.transport == "ssh" and not h.address:
            raise SpecopsError(f"{path}: host {name!r}, field 'address': required for ssh hosts")
        if "tensor_parallel" in fields and h.gpus is not None and (h.tensor_parallel or 0) > max(h.gpus, 1):
            raise SpecopsError(f"{path}: host {name!r}, field 'tensor_parallel': {h.tensor_parallel} is more than "
                               f"the host's gpus ({h.gpus}): one vLLM server spans at most the host's GPUs")
        if "slurm" in fields and not h.is_slurm:
            raise SpecopsError(f"{path}: host {name!r}, field 'slurm': only for a cluster's login node: add "
                               f"`scheduler: slurm` (or drop `slurm:`)")
        if h.is_slurm and not (h.workdir and h.venv):
            raise SpecopsError(f"{path}: host {name!r}, field '{'venv' if h.workdir else 'workdir'}': a slurm host "
                               f"needs `workdir:` and `venv:` on the filesystem its compute nodes share (e.g. "
                               f"/shared/$USER/specops and /shared/$USER/ml-env)")
        if h.slurm is not None and "gpus" in fields and h.gpus != h.slurm.gpus_per_node:
            raise SpecopsError(f"{path}: host {name!r}, field 'gpus': {h.gpus} differs from slurm.gpus_per_node "
                               f"({h.slurm.gpus_per_node}): a slurm host's GPUs are per node; give only "
                               f"slurm.gpus_per_node")
        if h.price_per == "gpu" and "price_per" in fields and not h.gpus:
            raise SpecopsError(f"{path}: host {name!r}, field 'price_per': gpu prices each GPU, but the host's "
                               f"`gpus` is not set: set gpus: N, or price_per: host")
        if h.venv_existing and not h.venv:
            raise SpecopsError(f"{path}: host {name!r}, field 'venv_existing': needs `venv:` set to that "
                               f"environment (e.g. /opt/torch/.venv)")
        inv.hosts[name] = h
    groups = raw.get("groups") or {}
    if not isinstance(groups, dict):
        raise SpecopsError(f"{path}: 'groups' must be a mapping of name -> list of hosts")
    for g, members in groups.items():
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise SpecopsError(f"{path}: group {g!r} must be a list of host names")
        for i, m in enumerate(members):  # (twice: every task twice at once on it, fetch both into one folder)
            why = (f"names unknown host {m!r}; known hosts: {', '.join(inv.names())}" if m not in inv.hosts else
                   f"names host {m!r} twice: list each host once" if m in members[:i] else None)
            if why:
                raise SpecopsError(f"{path}: group {g!r} {why}")
        if not members:  # (a task on it would act on no host)
            raise SpecopsError(f"{path}: group {g!r} lists no host: list its hosts (e.g. {g}: [a, b]) or remove it")
        inv.groups[str(g)] = list(members)
    return inv
