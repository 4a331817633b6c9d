"""Peers register themselves as backends do: --compare, parse_kinds and make_peers read the registry, so a
new peer is one decorated factory. Runs without onnxruntime-genai (nothing here builds a real peer)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from specrt.bundle.manifest import load_manifest
from specrt.demo import BUNDLE
from specrt.errors import ConfigError
from specrt.measure import peers
from specrt.measure.bench import make_peers
from specrt.measure.peers import (
    PeerRequest,
    PeerRun,
    parse_kinds,
    peer_kinds,
    register_peer,
)


class Fake:
    def __init__(self, name: str, request: PeerRequest) -> None:
        self.name, self.description, self.details, self.request = name, "a stand-in", {}, request

    def encode(self, prompt):
        return [1]

    def generate(self, prompt_ids, max_new_tokens, sampling, seed):
        return PeerRun([[2] * max_new_tokens for _ in prompt_ids], 0.01)


@pytest.fixture
def gen():
    """make_peers reads the generator's manifest only: the shipped demo bundle's."""
    return SimpleNamespace(manifest=load_manifest(BUNDLE))


@pytest.fixture
def registry(monkeypatch):
    """The registry, restored after the test (a registered fake would leak into other tests)."""
    monkeypatch.setattr(peers, "_PEERS", dict(peers._PEERS))
    return peers._PEERS


def test_the_shipped_peers_are_registered():
    assert peer_kinds() == ("hf", "llamacpp", "ortgenai")
    assert peers._PEERS["ortgenai"].precision and not peers._PEERS["hf"].precision
    assert not peers._PEERS["llamacpp"].precision  # it runs the GGUF as it is


def test_a_registered_peer_is_parsed_and_built_with_the_bundle_and_flags(registry, gen, tmp_path):
    @register_peer("fake")
    def fake(request):
        return [Fake("fake-a", request), Fake("fake-b", request)]

    assert parse_kinds(["fake,hf", "fake"]) == ("fake", "hf")
    built = make_peers(gen, ["fake"], threads=1, peer_cache=tmp_path, on_progress=print)
    assert [p.name for p in built] == ["fake-a", "fake-b"]
    r = built[0].request
    assert r.target == Path(gen.manifest.target.source) and r.draft == Path(gen.manifest.draft.source)
    assert r.entry == gen.manifest.target and r.threads == 1 and r.cache_dir == tmp_path and r.precision is None
    r = make_peers(gen, ["fake"], hf_target="t", hf_draft="d")[0].request
    assert (r.target, r.draft, r.cache_dir) == (Path("t"), Path("d"), None)


def test_unknown_peers_and_misplaced_precision_name_the_registered_kinds(registry, gen):
    register_peer("fake")(lambda request: [])
    with pytest.raises(ConfigError, match="unknown peer 'nope' for --compare; choose from hf, llamacpp, ortgenai, fake"):
        parse_kinds(["nope"])
    with pytest.raises(ConfigError, match="unknown peer 'nope'"):
        make_peers(gen, ["nope"])
    with pytest.raises(ConfigError, match="--peer-precision applies to --compare ortgenai$"):
        make_peers(gen, ["fake"], peer_precision="int4")
    register_peer("builder", precision=True)(lambda request: [Fake("b", request)])
    (b,) = make_peers(gen, ["builder"], peer_precision="int4")
    assert b.request.precision == "int4"
