"""The plugin's own tests, with flowkit's pytest plugin (fixtures and check_algorithm)."""
import pytest
from flowkit_reinforce.reinforce import Reinforce, ReinforcePolicy

from flowkit.testing import ConformanceError, check_algorithm

SETTINGS = ["reinforce.train_batch_size=64"]


def test_reinforce_passes_the_conformance_check(ray_session, tmp_path):
    out = check_algorithm(Reinforce, SETTINGS, tmp_dir=str(tmp_path))
    assert out["learn_return"] >= 7.0


class ForgetfulPolicy(ReinforcePolicy):
    """The baseline left out of the checkpoint (not declared in ``state_attrs``)."""

    state_attrs = ()


def test_without_the_baseline_in_its_checkpoint_the_check_fails(tmp_path):
    forgetful = type("Forgetful", (Reinforce,), {"name": "forgetful", "policy_class": ForgetfulPolicy})
    with pytest.raises(ConformanceError, match=r"(?s)checkpoint: .*policy 'default': `baseline`: [-0-9.e]+ after "
                                               r"training, 0.0 after restore"):
        check_algorithm(forgetful, ["forgetful.train_batch_size=64"], checks=["checkpoint"], tmp_dir=str(tmp_path))
