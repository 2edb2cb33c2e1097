"""``metadata.generateName`` carried out as the API server does, for ``strategyjob run``."""

from __future__ import annotations

import random

from strategyjob.jobspec import with_generated_name


def manifest(**metadata: str) -> dict:
    return {"apiVersion": "v", "kind": "K", "metadata": metadata, "spec": {}}


def test_the_prefix_gets_five_characters_of_the_api_servers_alphabet() -> None:
    named = with_generated_name(manifest(generateName="mnist-"), random.Random(0))
    name = named["metadata"]["name"]
    assert name.startswith("mnist-") and len(name) == len("mnist-") + 5
    assert set(name[len("mnist-") :]) <= set("bcdfghjklmnpqrstvwxz2456789")
    assert named["metadata"]["generateName"] == "mnist-"  # the rest of the manifest kept


def test_a_long_prefix_is_cut_so_that_the_name_fits_in_63() -> None:
    named = with_generated_name(manifest(generateName="a" * 70), random.Random(1))
    assert len(named["metadata"]["name"]) == 63
    assert named["metadata"]["name"].startswith("a" * 58)


def test_a_named_manifest_or_one_without_generate_name_is_left_as_it_is() -> None:
    for obj in (manifest(name="x", generateName="y-"), manifest(), {"metadata": None}, "text"):
        assert with_generated_name(obj) is obj
