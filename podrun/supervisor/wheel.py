"""This podrun as a wheel, `podrun-X-py3-none-any.whl`, for a supervisor host that has no podrun of its version.

podrun is pure Python, so its wheel is a zip of its own modules and a dist-info (the wheel format,
PEP 427): built here in milliseconds, with no build backend and no network. The wheel holds what
setuptools' wheel holds (the package's .py files); its requirements and console script are read from
pyproject.toml when podrun runs from its checkout, else from the metadata pip wrote from that same file
when it installed this version. The checkout comes first: an install of the same version beside it may
predate its pyproject.toml.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import os
import shutil
import zipfile

import podrun
from podrun import __version__, paths
from podrun.errors import PodrunError

NAME = "podrun"
TAG = "py3-none-any"
ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # one fixed time: the same files make the same wheel, byte for byte
Metadata = tuple[list[str], str | None, dict[str, str]]  # Requires-Dist, Requires-Python, console scripts


def wheel_name() -> str:
    return f"{NAME}-{__version__}-{TAG}.whl"


def build_wheel(directory: str) -> str:
    """The path of this podrun's wheel under `directory` (in PODRUN_HOME), in a folder named by its version and
    the hash of what it holds, built there unless an earlier call built it; those of other versions or contents
    that it built before are removed."""
    files = _wheel_files()
    digest = hashlib.sha256()
    for name, data in files:
        digest.update(b"%s\0%d\0" % (name.encode(), len(data)) + data)
    key = f"{NAME}-{__version__}-{digest.hexdigest()[:16]}"
    path = os.path.join(directory, key, wheel_name())
    if os.path.exists(path):
        return path
    paths.make_private_dir(os.path.dirname(path))
    partial = f"{path}.{os.getpid()}"
    try:
        with zipfile.ZipFile(partial, "w") as wheel:
            for name, data in files:
                entry = zipfile.ZipInfo(name, ZIP_TIME)
                entry.compress_type = zipfile.ZIP_DEFLATED
                entry.external_attr = 0o644 << 16
                wheel.writestr(entry, data)
        os.replace(partial, path)
    except OSError as error:  # a full disk
        raise paths.unusable_home(error) from None
    for other in os.listdir(directory):
        if other != key and other.startswith(f"{NAME}-"):
            shutil.rmtree(os.path.join(directory, other), ignore_errors=True)
    return path


def _wheel_files() -> list[tuple[str, bytes]]:
    """Every member of the wheel, in order, as (name in the zip, bytes); RECORD last, as the format wants."""
    files = _package_files()
    requires, requires_python, scripts = _metadata()
    dist_info = f"{NAME}-{__version__}.dist-info"
    metadata = ["Metadata-Version: 2.1", f"Name: {NAME}", f"Version: {__version__}"]
    metadata += [f"Requires-Python: {requires_python}"] if requires_python else []
    metadata += [f"Requires-Dist: {requirement}" for requirement in requires]
    entry_points = "[console_scripts]\n" + "".join(f"{name} = {target}\n" for name, target in scripts.items())
    files += [(f"{dist_info}/METADATA", "\n".join(metadata).encode() + b"\n"),
              (f"{dist_info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: podrun {__version__}\n"
                                     f"Root-Is-Purelib: true\nTag: {TAG}\n".encode()),
              (f"{dist_info}/entry_points.txt", entry_points.encode())]
    record = "".join(f"{name},sha256={_record_hash(data)},{len(data)}\n" for name, data in files)
    return files + [(f"{dist_info}/RECORD", (record + f"{dist_info}/RECORD,,\n").encode())]


def _package_files() -> list[tuple[str, bytes]]:
    root = os.path.dirname(os.path.abspath(podrun.__file__))
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = sorted(name for name in subfolders if name != "__pycache__")
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, "rb") as source:
                    files.append((f"{NAME}/{os.path.relpath(path, root).replace(os.sep, '/')}", source.read()))
    return files


def _metadata() -> Metadata:
    found = _checkout_metadata() or _installed_metadata()
    if found is None:
        raise PodrunError(f"cannot tell the requirements of this podrun ({__version__}, in "
                          f"{os.path.dirname(podrun.__file__)}) to install it on the supervisor host: it is neither "
                          f"a checkout with its pyproject.toml nor an installed distribution of that version; "
                          f"install it (pip install PATH_OF_THE_CHECKOUT)")
    return found


def _checkout_metadata() -> Metadata | None:
    try:  # by name: the type check reads podrun as Python 3.10's, which has no tomllib
        tomllib = importlib.import_module("tomllib")
    except ImportError:  # Python 3.10: no TOML reader in the standard library; the installed metadata serves
        return None
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(podrun.__file__))), "pyproject.toml")
    try:
        with open(path, "rb") as file:
            project = tomllib.load(file).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return None
    if project.get("name") != NAME:
        return None
    return list(project.get("dependencies", [])), project.get("requires-python"), dict(project.get("scripts", {}))


def _installed_metadata() -> Metadata | None:
    from importlib import metadata

    try:
        distribution = metadata.distribution(NAME)
    except metadata.PackageNotFoundError:
        return None
    if distribution.version != __version__:
        return None
    # the extras (test, bench) are not a supervisor's business
    requires = [requirement for requirement in distribution.requires or [] if "extra ==" not in requirement]
    scripts = {point.name: point.value for point in distribution.entry_points if point.group == "console_scripts"}
    return requires, distribution.metadata["Requires-Python"], scripts


def _record_hash(data: bytes) -> str:
    """RECORD's hash: sha256, urlsafe base64 without its padding."""
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
