"""A missing oracle skips its test under the README's command and fails it in CI."""

import pytest
from _oracles import REQUIRE_ORACLES, import_oracle


def test_a_missing_oracle_skips_with_the_reason(monkeypatch):
    monkeypatch.delenv(REQUIRE_ORACLES, raising=False)
    with pytest.raises(pytest.skip.Exception, match="no_such_oracle.*oracles"):
        import_oracle("no_such_oracle")


@pytest.mark.parametrize("value", ["1", "true"])
def test_a_missing_oracle_fails_when_required(monkeypatch, value):
    monkeypatch.setenv(REQUIRE_ORACLES, value)
    with pytest.raises(pytest.fail.Exception, match="some-oracle.*is set"):
        import_oracle("no_such_oracle", "some-oracle")


def test_an_installed_module_is_returned(monkeypatch):
    monkeypatch.setenv(REQUIRE_ORACLES, "1")
    assert import_oracle("json").dumps([1]) == "[1]"
