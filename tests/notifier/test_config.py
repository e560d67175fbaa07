"""The notifier's configuration file and API key resolution."""

from __future__ import annotations

import json
import os

import pytest

from notifier.api_key import SecretError, resolve_api_key, secret_version_name
from notifier.config import ConfigError, load_config
from tests.notifier.support import API_KEY, config
from tests.support import REPO_ROOT

EXAMPLE = os.path.join(REPO_ROOT, "notifier", "example-config.json")


def test_example_config_loads():
    loaded = load_config(EXAMPLE)
    assert loaded.recipients == ("ml-oncall@example.com",) and loaded.daily_budget == 100
    assert loaded.recipients_for("tf-bert-squad-v100") == ("tf-owners@example.com",)
    assert loaded.sender_for("pt-cifar-tpu-v3-8") == loaded.sender
    assert loaded.report_url("pt-cifar-tpu-v3-8", "r1").startswith("https://")  # every e-mail links the report


@pytest.mark.parametrize("overrides, key", [
    ({"recipients": []}, "recipients"),
    ({"recipients": ["not an address"]}, "recipients[0]"),
    ({"sender": "nobody"}, "sender"),
    ({"daily_budget": 0}, "daily_budget"),
    ({"daily_budget": 1, "recipients": ["a@x.example", "b@x.example"]}, "daily_budget"),
    ({"group_wait_seconds": "60"}, "group_wait_seconds"),
    ({"per_test": {"t": {"recipents": ["a@x.example"]}}}, "per_test.t.recipents"),
    ({"per_test": {"t": {}}}, "per_test.t"),
    ({"links": {"logs": "javascript:alert(1)"}}, "links.logs"),
    ({"links": {"logs": "https://x.example/{user}"}}, "links.logs"),
    ({"report_url_pattern": "javascript:alert('{test}')"}, "report_url_pattern"),
    ({"report_url_pattern": "https://r.example/{metric}"}, "report_url_pattern"),
    ({"subject_prefix": "a\nBcc: x@y.example"}, "subject_prefix"),
    ({"retry": {"initial_seconds": 10, "max_seconds": 1}}, "retry.initial_seconds"),
    ({"remember_sent_ids": {"max_ids": 0}}, "remember_sent_ids.max_ids"),
    ({"budget": 5}, "budget"),
])
def test_invalid_configs_name_the_key(overrides, key):
    with pytest.raises(ConfigError) as error:
        config(**overrides)
    assert error.value.key == key


def test_config_file_errors_name_the_file(tmp_path):
    path = tmp_path / "email.json"
    path.write_text(json.dumps({"sender": "a@x.example", "recipients": ["b@x.example"], "//": "comment",
                                "daily_budget": -1}))
    with pytest.raises(ConfigError, match=r"email\.json: daily_budget: must be an integer >= 1, got -1"):
        load_config(str(path))


def test_api_key_from_the_environment_is_never_shown():
    key = resolve_api_key(None, None, {"SENDGRID_API_KEY": f"  {API_KEY}\n"})
    assert key.reveal() == API_KEY
    assert API_KEY not in repr(key) and API_KEY not in str(key) and API_KEY not in f"{[key]}"
    assert resolve_api_key(None, None, {"OTHER": API_KEY}, env_var="OTHER").reveal() == API_KEY


def test_missing_api_key_says_where_it_looked():
    with pytest.raises(SecretError, match=r"\$SENDGRID_API_KEY or pass --sendgrid_key_secret"):
        resolve_api_key(None, None, {})


def test_secret_manager_names():
    assert secret_version_name("sendgrid", "proj") == "projects/proj/secrets/sendgrid/versions/latest"
    assert secret_version_name("projects/p/secrets/s", None) == "projects/p/secrets/s/versions/latest"
    assert secret_version_name("projects/p/secrets/s/versions/3", None) == "projects/p/secrets/s/versions/3"
    with pytest.raises(SecretError, match="no project"):
        secret_version_name("sendgrid", None)
