"""imagePullSecrets to the provider's registry login (anex_agent.virtualnode.pullsecrets, podspec)."""

from __future__ import annotations

import base64
import json

import pytest

from anex_agent.virtualnode import podspec, pullsecrets
from anex_agent.virtualnode.podspec import translate
from tests.virtualnode.pods import seed


def config(auths: dict) -> dict[str, str]:
    return {".dockerconfigjson": json.dumps({"auths": auths})}


@pytest.mark.parametrize("image, registry", [
    ("pytorch/pytorch:latest", "docker.io"), ("ubuntu", "docker.io"), ("ghcr.io/acme/train:1", "ghcr.io"),
    ("registry.example.com:5000/x/y@sha256:ab", "registry.example.com:5000"), ("localhost/x", "localhost"),
    ("index.docker.io/library/ubuntu", "docker.io"),
])
def test_the_images_registry(image, registry):
    assert pullsecrets.registry_of(image) == registry


def test_the_first_secret_with_a_login_for_the_images_registry_wins():
    warnings: list[str] = []
    secrets = {
        "absent": None,
        "other": config({"quay.io": {"username": "q", "password": "qp"}}),
        "hub": config({"https://index.docker.io/v1/": {"auth": base64.b64encode(b"me:hub-pw").decode()}}),
        "later": config({"docker.io": {"username": "late", "password": "x"}}),
    }
    login = pullsecrets.login_for("pytorch/pytorch:latest", secrets, warnings)
    assert (login.server, login.username, login.password) == ("docker.io", "me", "hub-pw")
    assert len(warnings) == 1 and "'absent'" in warnings[0]
    legacy = {"old": {".dockercfg": json.dumps({"ghcr.io": {"username": "u", "password": "p"}})}}
    assert pullsecrets.login_for("ghcr.io/a/b", legacy, []).username == "u"


def test_no_matching_login_is_said_and_the_image_is_pulled_without_one():
    warnings: list[str] = []
    assert pullsecrets.login_for("ghcr.io/a/b", {"hub": config({"docker.io": {"username": "u", "password": "p"}}),
                                                 "junk": {".dockerconfigjson": "{"}}, warnings) is None
    assert any("'junk'" in w for w in warnings) and any("ghcr.io" in w for w in warnings)
    assert pullsecrets.login_for("ghcr.io/a/b", {}, warnings) is None


def test_the_login_travels_in_the_provision_and_the_secret_is_read_but_not_delivered():
    pod = seed(image="ghcr.io/acme/train:1")
    pod["spec"]["imagePullSecrets"] = [{"name": "ghcr"}]
    secret = {"data": {".dockerconfigjson": base64.b64encode(json.dumps(
        {"auths": {"ghcr.io": {"username": "acme", "password": "tok"}}}).encode()).decode()}}
    assert ("secret", "ghcr") in podspec.fetched(pod) and not podspec.delivers(pod)
    out = translate(pod, {("secret", "ghcr"): podspec.object_data("secret", secret)}, prefix="vk-")
    assert out.spec.registry_auth.model_dump() == {"server": "ghcr.io", "username": "acme", "password": "tok"}
    assert "tok" not in repr(out.spec.registry_auth) and "ANEX_POD_FILES" not in out.spec.env
    assert translate(seed(), {}, prefix="vk-").spec.registry_auth is None


@pytest.mark.parametrize("username, password, field, said", [
    ("me", "pass word", "registry_auth.password", "spaces"),
    ("me", "pw\n-u x", "registry_auth.password", "control"),
    ("-x", "pw", "registry_auth.username", "'-'"),
    ("m e", "pw", "registry_auth.username", "spaces"),
])
def test_a_login_the_provider_cannot_pass_on_fails_the_pod_naming_the_pull_secret(username, password, field, said):
    pod = seed(image="ghcr.io/acme/train:1", imagePullSecrets=[])
    pod["spec"]["imagePullSecrets"] = [{"name": "absent"}, {"name": "ghcr"}]
    objects = {("secret", "absent"): None,
               ("secret", "ghcr"): config({"ghcr.io": {"username": username, "password": password}})}
    with pytest.raises(podspec.Refusal) as refused:
        translate(pod, objects, prefix="vk-")
    assert refused.value.field == "spec.imagePullSecrets[1]"
    assert "'ghcr'" in refused.value.message and field in refused.value.message and said in refused.value.message
    assert password not in str(refused.value)  # the value itself is never said
