"""Project, zone, API endpoint and access token, read the way gcloud reads them.

Each setting comes from the first of: the command-line flag, the job spec, gcloud's environment
variable (CLOUDSDK_<SECTION>_<PROPERTY>), then the active gcloud configuration
($CLOUDSDK_CONFIG/configurations/config_<name>, the name from CLOUDSDK_ACTIVE_CONFIG_NAME or the
active_config file). Standard library only: `podrun list` must not pay for more than it uses.
"""

from __future__ import annotations

import configparser
import math
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from podrun.errors import UsageError

# (section, property) as gcloud names them; the environment variable is derived from these
PROJECT = ("core", "project")
ZONE = ("compute", "zone")
TPU_ENDPOINT = ("api_endpoint_overrides", "tpu")
COMPUTE_ENDPOINT = ("api_endpoint_overrides", "compute")  # project metadata: is OS Login on
OSLOGIN_ENDPOINT = ("api_endpoint_overrides", "oslogin")
ACCOUNT = ("core", "account")
ACCESS_TOKEN_FILE = ("auth", "access_token_file")
# podrun's own: how long one request to the API may go unanswered, and how long podrun waits for a
# long-running operation (creating or deleting a TPU VM, updating its metadata) before it gives up
API_TIMEOUT = ("PODRUN_API_TIMEOUT", 30.0)
WAIT_TIMEOUT = ("PODRUN_WAIT_TIMEOUT", 1800.0)


@dataclass(frozen=True)
class Location:
    project: str
    zone: str

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}"

    @property
    def flags(self) -> str:
        """`--zone Z --project P`: a command advised for this place reaches it, whatever gcloud's defaults."""
        return f"--zone {self.zone} --project {self.project}"


def location(project: str | None, zone: str | None) -> Location:
    """The project and zone to use, given what the flags (or the spec) said."""
    project = project or gcloud_property(PROJECT)
    zone = zone or gcloud_property(ZONE)
    if not project:
        raise UsageError("no Google Cloud project: pass --project, set target.tpu.project in the spec, "
                         "export CLOUDSDK_CORE_PROJECT, or run `gcloud config set project PROJECT`")
    if not zone:
        raise UsageError("no zone: pass --zone (e.g. us-central2-b), set target.tpu.zone in the spec, "
                         "export CLOUDSDK_COMPUTE_ZONE, or run `gcloud config set compute/zone ZONE`")
    return Location(project, zone)


def gcloud_property(name: tuple[str, str]) -> str | None:
    section, key = name
    from_env = os.environ.get(f"CLOUDSDK_{section}_{key}".upper())
    if from_env:
        return from_env
    return _active_configuration().get(section, key, fallback=None) or None


def seconds(setting: tuple[str, float], zero: bool = False) -> float:
    """A number of seconds from the environment variable (above 0, or 0 too with `zero`), or its default."""
    variable, default = setting
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and (value >= 0 if zero else value > 0)):
        raise UsageError(f"{variable}={text!r}: expected a number of seconds {'0 or more' if zero else 'above 0'}, "
                         f"e.g. {default:g}")
    return value


def config_dir() -> Path:
    return Path(os.environ.get("CLOUDSDK_CONFIG") or Path.home() / ".config" / "gcloud")


@cache
def _active_configuration() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    name = os.environ.get("CLOUDSDK_ACTIVE_CONFIG_NAME")
    if not name:
        try:
            name = (config_dir() / "active_config").read_text().strip()
        except OSError:
            name = "default"
    try:
        parser.read(config_dir() / "configurations" / f"config_{name}")
    except configparser.Error as error:
        raise UsageError(f"cannot read gcloud configuration {name!r}: {error}") from None
    return parser
