"""The handler call's CLIENT span names its URL without credentials or query string."""

from __future__ import annotations

from shared.telemetry.setup import _url_attributes


def test_credentials_and_query_stay_out_of_the_span() -> None:
    url = "http://ferry:s3cret@handler.example:8081/handle?token=abc"
    for _ in range(2):  # the second answer comes from the cache: the same
        assert _url_attributes(url) == {
            "url.full": "http://handler.example:8081/handle",
            "server.address": "handler.example",
            "server.port": 8081,
        }


def test_the_default_port_is_the_scheme_s() -> None:
    assert _url_attributes("https://handler.example/handle")["server.port"] == 443
    assert _url_attributes("http://[::1]/handle")["server.address"] == "::1"
