"""Check that cpemu's wheel and sdist ship exactly the fatbins of the pinned manifest.

    python tools/check_dist.py --verify-manifest                       # build both from this tree, check
    python tools/check_dist.py --verify-manifest --wheel W.whl --sdist S.tar.gz
    python tools/check_dist.py --verify-manifest --no-isolation        # build offline with this environment

Without --wheel/--sdist it copies the project's files (git's tracked and untracked,
not ignored) to a temporary folder and runs ``python -m build --sdist --wheel`` there,
which builds the sdist and then the wheel from the sdist. ``--no-isolation`` builds with
the installed setuptools and wheel (``pip install -e '.[test]'`` has them) instead of
downloading them into a fresh build environment.

For each archive (a wheel, an sdist, or an unpacked folder of either) it checks:

* the manifest is there (``cpemu/bin/manifest.json`` in a wheel, ``bin/manifest.json`` in
  an sdist), its sha256 equals ``MANIFEST_SHA256`` of the archive's own
  ``cpemu/cuda/_pinned.py``, and it validates against the archive's
  ``manifest.schema.json``;
* every fatbin of the manifest is there with the manifest's sha256 and size, and no other
  ``.fatbin`` file is anywhere in the archive;
* the archive's manifest and pinned hash are those of this source tree (unless
  ``--no-tree``).

Any failure prints every problem found and exits with status 1.
"""

from __future__ import annotations

import ast
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import click
import jsonschema

ROOT = Path(__file__).resolve().parents[1]

#: Where the files are in each kind of archive (paths relative to the archive's top).
LAYOUTS = {
    "wheel": {"bin": "cpemu/bin", "pinned": "cpemu/cuda/_pinned.py", "schema": "cpemu/schemas/manifest.schema.json"},
    "sdist": {"bin": "bin", "pinned": "cpemu/cuda/_pinned.py", "schema": "schemas/manifest.schema.json"},
}


class DistError(click.ClickException):
    pass


def read_archive(path: Path) -> tuple[str, dict[str, bytes]]:
    """``(kind, {relative path: bytes})`` of a wheel (.whl/.zip), an sdist (.tar.gz) or a folder.

    An sdist's single top folder (``cpemu-0.1.0/``) is stripped. The kind ("wheel" or
    "sdist") is told by the layout: a wheel has ``cpemu/bin``, an sdist ``bin``.
    """
    files: dict[str, bytes] = {}
    if path.is_dir():
        for p in sorted(path.rglob("*")):
            if p.is_file():
                files[p.relative_to(path).as_posix()] = p.read_bytes()
    elif zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                if not info.is_dir():
                    files[info.filename] = z.read(info)
    elif tarfile.is_tarfile(path):
        with tarfile.open(path) as t:
            for m in t.getmembers():
                if m.isfile():
                    files[m.name] = t.extractfile(m).read()
    else:
        raise DistError(f"{path}: neither a folder, a zip (wheel) nor a tar (sdist) archive")
    tops = {p.split("/", 1)[0] for p in files}
    if len(tops) == 1 and all("/" in p for p in files) and f"{next(iter(tops))}/PKG-INFO" in files:
        top = next(iter(tops))
        files = {p[len(top) + 1:]: v for p, v in files.items()}
    if f"{LAYOUTS['wheel']['bin']}/manifest.json" in files or any(p.endswith(".dist-info/RECORD") for p in files):
        return "wheel", files
    return "sdist", files


def pinned_sha(source: bytes, where: str) -> str:
    """``MANIFEST_SHA256`` of a ``_pinned.py`` (parsed, never executed)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise DistError(f"{where}: not valid Python ({e})") from None
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "MANIFEST_SHA256" and isinstance(node.value, ast.Constant)):
            return str(node.value.value)
    raise DistError(f"{where}: no MANIFEST_SHA256 = \"<hex>\" assignment")


def verify_files(kind: str, files: dict[str, bytes], name: str, tree_manifest: bytes | None = None,
                 tree_pinned: str | None = None) -> tuple[list[str], list[str]]:
    """Check one archive's files; returns (problems, report lines). No problems: it is good."""
    lay = LAYOUTS[kind]
    problems, report = [], []
    mpath = f"{lay['bin']}/manifest.json"
    mbytes, pbytes, sbytes = files.get(mpath), files.get(lay["pinned"]), files.get(lay["schema"])
    for rel, data in ((mpath, mbytes), (lay["pinned"], pbytes), (lay["schema"], sbytes)):
        if data is None:
            problems.append(f"{name}: {rel} is missing")
    if mbytes is None or pbytes is None:
        return problems, report
    msha = hashlib.sha256(mbytes).hexdigest()
    try:
        pinned = pinned_sha(pbytes, f"{name}: {lay['pinned']}")
    except DistError as e:
        problems.append(str(e.message))
        pinned = None
    if pinned is not None and msha != pinned:
        problems.append(f"{name}: {mpath} has sha256 {msha}, but {lay['pinned']} pins MANIFEST_SHA256 = {pinned} "
                        f"(the manifest was changed after the build, or the two are from different builds)")
    if tree_pinned is not None and pinned is not None and pinned != tree_pinned:
        problems.append(f"{name}: {lay['pinned']} pins {pinned}, this source tree pins {tree_pinned} "
                        f"(the archive was not built from this tree)")
    if tree_manifest is not None and mbytes != tree_manifest:
        problems.append(f"{name}: {mpath} differs from this tree's bin/manifest.json")
    try:
        manifest = json.loads(mbytes)
    except ValueError as e:
        problems.append(f"{name}: {mpath} is not valid JSON ({e})")
        return problems, report
    if sbytes is not None:
        try:
            jsonschema.validate(manifest, json.loads(sbytes))
        except jsonschema.ValidationError as e:
            where = "/".join(str(p) for p in e.absolute_path) or "(top)"
            problems.append(f"{name}: {mpath} does not validate against {lay['schema']} at {where}: {e.message}")
            return problems, report
        except ValueError as e:
            problems.append(f"{name}: {lay['schema']} is not valid JSON ({e})")
    modules = manifest.get("modules") if isinstance(manifest, dict) else None
    if not isinstance(modules, dict):
        problems.append(f"{name}: {mpath} has no modules object")
        return problems, report
    expected = {}
    for mod, entry in sorted(modules.items()):
        rel = f"{lay['bin']}/{entry['fatbin']}"
        expected[rel] = mod
        data = files.get(rel)
        if data is None:
            problems.append(f"{name}: {rel} (module {mod}) is missing")
            continue
        got = hashlib.sha256(data).hexdigest()
        if got != entry["sha256"] or len(data) != entry["size"]:
            problems.append(f"{name}: {rel} has sha256 {got} ({len(data)} bytes), the manifest pins "
                            f"{entry['sha256']} ({entry['size']} bytes): tampered or stale fatbin")
        else:
            report.append(f"{rel}  {len(data)} bytes  sha256 {got}  {entry['architectures']}")
    for rel in sorted(files):
        if rel.endswith(".fatbin") and rel not in expected:
            problems.append(f"{name}: {rel} is an extra .fatbin that the manifest does not list")
    if not problems:
        report.insert(0, f"{name}: OK ({kind}): {len(expected)} fatbin(s) match {mpath} (sha256 {msha}, "
                         f"pinned in {lay['pinned']})")
    return problems, report


def verify_archive(path: Path, tree: bool = True, root: Path = ROOT) -> tuple[list[str], list[str]]:
    kind, files = read_archive(path)
    tree_manifest = tree_pinned = None
    if tree:
        tm, tp = root / "bin" / "manifest.json", root / "cpemu" / "cuda" / "_pinned.py"
        if not tm.is_file() or not tp.is_file():
            raise DistError(f"this tree has no {tm} or {tp}: run tools/build_fatbin.py first (or pass --no-tree)")
        tree_manifest, tree_pinned = tm.read_bytes(), pinned_sha(tp.read_bytes(), str(tp))
    return verify_files(kind, files, path.name, tree_manifest, tree_pinned)


def project_files(root: Path) -> list[str]:
    """The files a build of ``root`` should see: git's tracked and untracked-not-ignored files."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             check=True, capture_output=True).stdout
        return sorted({p for p in out.decode().split("\0") if p and (root / p).is_file()})
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", "build", "dist", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", ".whl", ".out"}
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                      if p.is_file() and not (set(p.relative_to(root).parts) & skip)
                      and not any(part.endswith(".egg-info") for part in p.relative_to(root).parts))


def build_dists(root: Path, outdir: Path, isolation: bool) -> tuple[Path, Path]:
    """Build an sdist and a wheel (from that sdist) of a copy of ``root``; returns (wheel, sdist)."""
    try:
        import build  # noqa: F401
    except ImportError:
        raise DistError("the 'build' package is not installed (pip install build, or pip install -e '.[test]')") \
            from None
    src = outdir / "src"
    for rel in project_files(root):
        dst = src / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, dst)
    cmd = [sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(outdir / "dist")]
    if not isolation:
        cmd.append("--no-isolation")
    r = subprocess.run(cmd + [str(src)], capture_output=True, text=True)
    if r.returncode != 0:
        raise DistError(f"{' '.join(cmd)} failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    wheels = sorted((outdir / "dist").glob("*.whl"))
    sdists = sorted((outdir / "dist").glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise DistError(f"expected one wheel and one sdist in {outdir / 'dist'}, got {wheels + sdists}")
    return wheels[0], sdists[0]


@click.command()
@click.option("--verify-manifest", is_flag=True, required=True,
              help="check the fatbins and the manifest inside the wheel and the sdist")
@click.option("--wheel", type=click.Path(exists=True, path_type=Path), help="a built wheel (or an unpacked one)")
@click.option("--sdist", type=click.Path(exists=True, path_type=Path), help="a built sdist (or an unpacked one)")
@click.option("--isolation/--no-isolation", default=True, show_default=True,
              help="build in an isolated environment (downloads setuptools) or with the installed one")
@click.option("--tree/--no-tree", default=True, show_default=True,
              help="also require the archives' manifest and pin to be this tree's")
@click.option("--keep", type=click.Path(file_okay=False, path_type=Path),
              help="copy the built wheel and sdist to this folder")
def main(verify_manifest: bool, wheel: Path | None, sdist: Path | None, isolation: bool, tree: bool,
         keep: Path | None):
    """Verify that the wheel and the sdist contain exactly the pinned manifest's fatbins."""
    with tempfile.TemporaryDirectory(prefix="cpemu-check-dist-") as tmp:
        if wheel is None and sdist is None:
            click.echo(f"building the sdist and the wheel ({'isolated' if isolation else 'no isolation'}) ...")
            wheel, sdist = build_dists(ROOT, Path(tmp), isolation)
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                for p in (wheel, sdist):
                    shutil.copy2(p, keep / p.name)
        problems = []
        for path in (p for p in (wheel, sdist) if p is not None):
            bad, report = verify_archive(path, tree=tree)
            problems += bad
            for line in report:
                click.echo(line)
    if problems:
        raise DistError("check_dist FAILED:\n  - " + "\n  - ".join(problems))
    click.echo("check_dist: OK")


if __name__ == "__main__":
    main()
