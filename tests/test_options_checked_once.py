"""A backend's options are checked once per load (issue 24), by the one loader ``load_policy``, with the
same error text as before."""

import pytest

import agentgym.policies.transformers_policy as hf
from agentgym.policies.loading import load_policy


def test_one_load_checks_its_options_once(monkeypatch):
    calls = []
    real = hf.check_options

    def counting(options):
        calls.append(dict(options))
        return real(options)
    monkeypatch.setattr(hf, "check_options", counting)   # the classmethod and the module's own calls land here
    load_policy("tiny-random", "hf", device="cpu", max_batch_size=4)
    assert calls == [{"max_batch_size": 4}]


def test_an_unknown_option_is_refused_with_its_message():
    with pytest.raises(ValueError, match=r"unknown hf backend option\(s\) \['nope'\]; the hf backend takes"):
        load_policy("tiny-random", "hf", device="cpu", nope=1)
