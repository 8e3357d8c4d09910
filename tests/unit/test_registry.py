"""The target registry (target_kinds/registry.py): what each kind declares reaches the spec, the CLI and
the transports, and a rule is written once."""

from __future__ import annotations

import pytest

from podrun.errors import PodrunError
from podrun.spec.messages import EXPECTED
from podrun.spec.problems import FieldProblems, validate_fields
from podrun.target_kinds import registry
from podrun.transport import TRANSPORTS, transport_for

from helpers import podrun, stderr_lines_without_traceback


def test_an_endpoint_of_a_kind_no_transport_registered_is_one_line():
    with pytest.raises(PodrunError) as refused:
        transport_for({"kind": "carrier-pigeon", "host": "h"})
    assert str(refused.value) == (f"a worker's endpoint of unknown kind 'carrier-pigeon' (expected one of "
                                  f"{', '.join(TRANSPORTS)}): was the job started by another version of podrun?")


def test_every_kind_is_in_the_spec_its_schema_and_exec_s_flags(home):
    names = registry.names()
    assert names == ["tpu", "hosts", "local", "slurm"]
    assert EXPECTED["target"].startswith(f"a mapping with one of {', '.join(names)}")
    schema = podrun("schema").stdout
    help_text = podrun("exec", "--help").stdout
    for declared in registry.kinds():
        assert f'"{declared.name}": {{' in schema
        assert all(flag.name in help_text for flag in (declared.flag, *declared.extra_flags))
        fields = {field.alias or name for name, field in getattr(declared.annotation, "model_fields", {}).items()}
        # errors explain real fields: the options' own, or a sibling's beside the kind (hosts' spares)
        assert {key.split(".")[0] for key in declared.expected} - {"", "*"} <= fields | set(declared.siblings)
        assert all(f'"{sibling}": {{' in schema for sibling in declared.siblings)


@pytest.mark.parametrize("kind, options, default", [
    ("tpu", {"name": "pod", "accelerator_type": "v4-8"}, ["preemption"]),
    ("hosts", ["10.0.0.2"], ["failure"]),
    ("local", {"workers": 2}, ["failure"]),
    ("slurm", {"nodes": 2}, ["failure"]),
])
def test_restarts_default_to_what_the_kind_declares(kind, options, default):
    spec = validate_fields({"name": "job", "run": "true", "target": {kind: options}, "restarts": {"max": 1}})
    assert spec.restart_on == default == list(registry.kind(kind).default_restart_on)


def test_valid_for_goes_with_a_reservation_in_a_spec_as_with_create(home):
    """One rule (cloud.request.through_queue): a reservation is asked through a queued resource, so
    valid_for applies to it without queued: true, for the spec as for `podrun create`."""
    spec = validate_fields({"name": "job", "run": "true", "target": {"tpu": {
        "name": "pod", "accelerator_type": "v4-8", "reservation": "r", "valid_for": "1h"}}})
    assert spec.target.declared.recreates(spec.target.options)
    with pytest.raises(FieldProblems) as alone:  # without a queue of any kind it is refused, in both
        validate_fields({"name": "job", "run": "true", "target": {"tpu": {"name": "pod", "accelerator_type": "v4-8",
                                                                          "valid_for": "1h"}}})
    assert alone.value.problems == [("target.tpu", "valid_for is how long a queued request waits: set queued: true too")]
    refused = podrun("create", "v4-8", "--valid-for", "1h")
    assert stderr_lines_without_traceback(refused.stderr) == [
        "podrun: error: --valid-for: how long a queued request may wait for capacity; add --queued"]
