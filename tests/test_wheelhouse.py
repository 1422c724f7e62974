"""Air-gapped installs: the wheelhouse resolver (real pip against a local mirror of real wheels,
no network) and the host-side top-up of an existing venv (remote/install_profile.py --existing,
in a real venv), plus the input checks."""

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import REPO, inv
from specops import wheelhouse as wh
from specops.errors import SpecopsError

PY = f"{sys.version_info[0]}.{sys.version_info[1]}"


@pytest.fixture(autouse=True)
def no_pip_config(monkeypatch):
    """This machine's pip config (find-links, extra indexes, a global constraint) stays out."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for k in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL", "PIP_CONSTRAINT"):
        monkeypatch.delenv(k, raising=False)


def make_wheel(where: Path, name: str, version: str, requires=()) -> Path:
    """A real, installable pure-Python wheel."""
    dist = f"{name.replace('-', '_')}-{version}"
    files = {
        f"{name.replace('-', '_')}/__init__.py": f"VERSION = {version!r}\n",
        f"{dist}.dist-info/METADATA": "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = "\n".join(record) + "\n"
    out = where / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return out


@pytest.fixture
def mirror(tmp_path):
    """A local index: A needs B and C; B 2.0 needs X>=2, B 1.5 needs X>=1; D needs X>=3; E is
    pinned only because D needs it."""
    m = tmp_path / "mirror"
    m.mkdir()
    make_wheel(m, "spx-a", "1.0", ["spx-b>=1", "spx-c"])
    make_wheel(m, "spx-b", "2.0", ["spx-x>=2"])
    make_wheel(m, "spx-b", "1.5", ["spx-x>=1"])
    make_wheel(m, "spx-c", "1.0")
    make_wheel(m, "spx-d", "1.0", ["spx-x>=3", "spx-e"])
    make_wheel(m, "spx-e", "1.0")
    make_wheel(m, "spx-x", "1.8")
    return m


PROFILE = [("spx-a==1.0", None), ("spx-d==1.0", None), ("spx-e==1.0", None), ("spx-x==2.0", None)]


def test_top_up_keeps_what_is_there_steps_back_and_drops_with_reasons(mirror):
    pip = wh.Pip(PY, ["any"], source=["--no-index", "--find-links", str(mirror)])
    res = wh.resolve_top_up(PROFILE, {"spx-x": "1.8"}, pip, wh.marker_env(PY, ["manylinux_2_28_x86_64"]))
    assert {n: v["version"] for n, v in res["install"].items()} == {"spx-a": "1.0", "spx-b": "1.5", "spx-c": "1.0"}
    assert res["kept"] == [{"package": "spx-x", "requirement": "spx-x==2.0", "have": "1.8", "satisfies": False}]
    why = {d["package"]: d["reason"] for d in res["dropped"]}
    assert why["spx-d"] == "spx-d 1.0 needs spx-x>=3, the host has 1.8"
    assert why["spx-e"].startswith("only needed by spx-d, which is dropped")
    assert res["requirements"] == ["spx-a==1.0"]


def test_top_up_install_in_a_real_existing_venv(mirror, tmp_path):
    venv = tmp_path / "existing"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python3"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-index", str(mirror / "spx_x-1.8-py3-none-any.whl")],
                   check=True)
    house = tmp_path / "house"
    house.mkdir()
    names = ["spx_a-1.0", "spx_b-1.5", "spx_c-1.0"]
    for n in names:
        (house / f"{n}-py3-none-any.whl").write_bytes((mirror / f"{n}-py3-none-any.whl").read_bytes())
    man = {"mode": "top-up", "python": PY, "wheels": {f"{n}-py3-none-any.whl": "" for n in names},
           "dropped": [{"package": "spx-d", "requirement": "spx-d==1.0", "reason": "spx-d 1.0 needs spx-x>=3"},
                       {"package": "spx-e", "requirement": "spx-e==1.0", "reason": "only needed by spx-d"}]}
    (house / wh.MANIFEST).write_text(json.dumps(man))
    prof = tmp_path / "p.txt"
    prof.write_text("#@ mode: resolve\n" + "\n".join(r for r, _ in PROFILE) + "\n")
    work = tmp_path / "work"
    work.mkdir()
    argv = [str(py), str(REPO / "remote" / "install_profile.py"), "--profile", str(prof), "--sha256", "h",
            "--log", ".specops/logs/install.log", "--wheelhouse", str(house), "--existing"]

    def run():
        p = subprocess.run(argv, cwd=work, capture_output=True, text=True)
        return p.returncode, json.loads(p.stdout.split("@@SPECOPS-PAYLOAD-BEGIN@@")[1].split("@@SPECOPS-PAYLOAD-END@@")[0])

    rc, res = run()
    assert rc == 0 and res["ok"], res
    assert res["added"] == {"spx-a": "1.0", "spx-b": "1.5", "spx-c": "1.0"}
    assert res["kept"] == [{"package": "spx-x", "want": "spx-x==2.0", "have": "1.8"}]
    assert [d["package"] for d in res["absent"]] == ["spx-d", "spx-e"]
    assert not res["changed"]
    env = (work / ".specops" / "env-p.txt").read_text()
    assert "spx-x==1.8" in env and "spx-a==1.0" in env and "#@ absent: spx-d -- spx-d 1.0 needs spx-x>=3" in env
    rc, again = run()
    assert rc == 0 and again["action"] == "unchanged" and again["added"] == {}
    # a wheelhouse for another Python is refused in one line
    man["python"] = "3.99"
    (house / wh.MANIFEST).write_text(json.dumps(man))
    rc, bad = run()
    assert rc == 1 and "wheels for Python 3.99" in bad["error"]


def test_expand_platform_and_input_checks(tmp_path):
    tags = wh.expand_platform("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert wh.expand_platform("macosx_11_0_arm64") == ["macosx_11_0_arm64"]
    with pytest.raises(SpecopsError, match="--platform"):
        wh.expand_platform("many linux")
    with pytest.raises(SpecopsError, match="--python '3'"):
        wh.check_python("3")
    f = tmp_path / "freeze.txt"
    f.write_text("# pip list\nTorch==2.11.0\nfoo_bar @ file:///x\n-e git+https://x#egg=y\n")
    assert wh.read_have(str(f)) == {"torch": "2.11.0", "foo-bar": None}
    f.write_text("torch 2.11.0\n")
    with pytest.raises(SpecopsError, match="line 1"):
        wh.read_have(str(f))
    with pytest.raises(SpecopsError, match="no such folder"):
        wh.load_manifest(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecopsError, match="no wheels"):
        wh.load_manifest(str(tmp_path / "empty"))


def test_cli_refusals_one_line(tmp_path):
    for args, msg in ((["wheelhouse"], "needs --profile"), (["wheelhouse", "--profile", "gpu"], "no profile 'gpu'"),
                      (["wheelhouse", "--profile", "cuda", "--have", str(tmp_path / "x")], "no such file"),
                      (["wheelhouse", "--profile", "cuda", "--have", "a", "--host", "b"], "not both")):
        r = inv(*args)
        assert r.returncode != 0 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("hosts:\n  x:\n    transport: local\n    venv_existing: true\n")
    r = inv("bootstrap", "--host", "x", "--hosts", str(hosts), "--wheelhouse", str(tmp_path))
    assert r.returncode != 0 and "field 'venv_existing': needs `venv:`" in r.stderr
